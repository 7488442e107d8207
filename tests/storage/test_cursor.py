import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment
from pyengine_kernels import Position, ackset_new

TOPIC = "persistent://public/default/c"


async def filled(env, n, per_ledger=4):
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=per_ledger))
    positions = await asyncio.gather(*(ml.append(b"x") for _ in range(n)))
    return ml, positions


async def test_new_cursor_starts_at_earliest_or_latest(env):
    ml, p = await filled(env, 6)
    earliest = await ml.open_cursor("e", "earliest")
    latest = await ml.open_cursor("l", "latest")
    assert earliest.read_position == p[0] and earliest.backlog() == 6
    assert latest.mark_delete == p[-1] and latest.backlog() == 0
    with pytest.raises(ValueError):
        await ml.open_cursor("bad", "middle")


async def test_individual_acks_advance_mark_delete_across_ledgers(env):
    ml, p = await filled(env, 10)
    c = await ml.open_cursor("s", "earliest")
    await c.ack([p[1], p[2], p[3], p[5]])
    assert c.mark_delete == Position(p[0].ledger_id, -1)
    assert c.is_acked(p[5]) and not c.is_acked(p[4])
    await c.ack([p[0]])
    assert c.mark_delete == p[3]             # 0..3 acked: crosses the first ledger's end
    assert c.backlog() == 10 - 5
    await c.ack([p[4]])
    assert c.mark_delete == p[5]


async def test_ack_of_already_acked_position_changes_nothing(env):
    ml, p = await filled(env, 3)
    c = await ml.open_cursor("s", "earliest")
    await c.ack([p[0]])
    writes = []
    original = env._write_batch
    env._write_batch = lambda batch: writes.append(batch) or original(batch)
    await c.ack([p[0]])
    assert c.mark_delete == p[0] and writes == []


async def test_batch_index_acks_merge_until_the_entry_is_acked(env):
    ml, p = await filled(env, 3)
    c = await ml.open_cursor("s", "earliest")
    full = ackset_new(10)
    first_half = [full[0] & ~0b11111]          # indexes 0..4 acked
    second_half = [full[0] & 0b11111]          # indexes 5..9 acked
    await c.ack_batch_indexes(p[0], first_half, 10)
    assert not c.is_acked(p[0])
    assert c.batch_ack_set(p[0]) == first_half
    await c.ack_batch_indexes(p[0], second_half, 10)
    assert c.is_acked(p[0]) and c.batch_ack_set(p[0]) is None
    assert c.mark_delete == p[0]


async def test_cumulative_ack_and_seek(env):
    ml, p = await filled(env, 8)
    c = await ml.open_cursor("s", "earliest")
    await c.ack([p[6]])
    await c.ack_cumulative(p[4])
    assert c.mark_delete == p[4] and c.is_acked(p[6]) and c.backlog() == 2
    await c.ack_cumulative(p[2])                # backwards: ignored
    assert c.mark_delete == p[4]
    await c.seek(p[1])
    assert c.mark_delete == p[0] and c.read_position == p[1] and not c.is_acked(p[6])
    assert c.backlog() == 7


async def test_cursor_state_survives_restart(env, reopen):
    ml, p = await filled(env, 12)
    c = await ml.open_cursor("s", "earliest")
    await c.ack([p[0], p[1], p[7], p[9]])
    await c.ack_batch_indexes(p[3], [0b1010], 4)
    await ml.close()
    env2 = reopen(env)
    ml2 = await ManagedLedger.open(env2, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=4))
    c2 = await ml2.open_cursor("s", "earliest")
    assert c2.mark_delete == p[1]
    assert [c2.is_acked(x) for x in p] == [True, True, False, False, False, False, False, True,
                                          False, True, False, False]
    assert c2.batch_ack_set(p[3]) == [0b1010]


async def test_non_durable_cursor_reads_from_a_position_and_persists_nothing(env, reopen):
    ml, p = await filled(env, 5)
    reader = ml.new_non_durable_cursor(p[2])
    assert reader.read_position == p[2]
    await reader.ack([p[2]])
    assert list(ml.cursors) == []


# --- property: the cursor against a reference model -----------------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("ack"), st.lists(st.integers(0, 29), max_size=5)),
    st.tuples(st.just("cumulative"), st.integers(0, 29)),
    st.tuples(st.just("seek"), st.integers(0, 29)),
    st.tuples(st.just("restart"), st.just(0)),
), max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_cursor_matches_reference_model(tmp_path_factory, ops):
    """Acked positions after any sequence of acks, cumulative acks, seeks and restarts equal
    those of a model where the cursor is a set of acknowledged indexes."""

    async def run():
        path = tmp_path_factory.mktemp("cursor")
        env = StorageEnvironment(path)
        config = ManagedLedgerConfig(max_entries_per_ledger=7)
        ml = await ManagedLedger.open(env, TOPIC, config)
        p = await asyncio.gather(*(ml.append(b"x") for _ in range(30)))
        c = await ml.open_cursor("s", "earliest")
        acked: set[int] = set()
        try:
            for op, arg in ops:
                if op == "ack":
                    await c.ack([p[i] for i in arg])
                    acked |= set(arg)
                elif op == "cumulative":
                    await c.ack_cumulative(p[arg])
                    acked |= set(range(arg + 1))
                elif op == "seek":
                    await c.seek(p[arg])
                    acked = set(range(arg))
                else:
                    await ml.close()
                    env.close()
                    env = StorageEnvironment(path)
                    ml = await ManagedLedger.open(env, TOPIC, config)
                    c = await ml.open_cursor("s", "earliest")
                assert {i for i in range(30) if c.is_acked(p[i])} == acked
                run_end = next((i for i in range(30) if i not in acked), 30)
                expected_md = p[run_end - 1] if run_end else ml.previous_position(p[0])
                assert c.mark_delete == expected_md
                assert c.backlog() == 30 - len(acked)
        finally:
            env.close()

    asyncio.run(run())
