"""Trimming consumed ledgers by retention, as Pulsar's managed ledger does it: only closed
ledgers every durable cursor has consumed (every closed ledger when there is no durable cursor),
oldest first, each one closed longer ago than the retention time or while the topic is over the
retention size; in the background once a ledger closes or the slowest cursor moves past one."""

import asyncio
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment, StorageError
from pyengine.storage.reader import StoreReader
from pyengine_kernels import Position
from tests.storage.helpers import fail_next_save, settled

TOPIC = "persistent://public/default/retained"
MINUTE = 60_000


async def filled(env, *, entries: int, per_ledger: int, **retention) -> tuple[ManagedLedger, list[Position]]:
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=per_ledger, **retention))
    positions = await asyncio.gather(*(ml.append(b"x" * 100) for _ in range(entries)))
    return ml, positions


def ledger_ids(positions) -> list[int]:
    return sorted({p.ledger_id for p in positions})


async def test_consumed_ledgers_past_the_retention_time_are_deleted(env):
    ml, positions = await filled(env, entries=20, per_ledger=5, retention_ms=MINUTE)
    cursor = await ml.open_cursor("sub", "earliest")
    now = max(info.closed_ms for info in ml.ledgers.values())
    assert await ml.trim(now + 2 * MINUTE) == []                  # nothing consumed yet
    await cursor.ack_cumulative(positions[11])
    trimmed_from = []
    ml.add_trim_listener(trimmed_from.append)
    assert await ml.trim(now) == []                               # consumed, but retained
    assert await ml.trim(now + 2 * MINUTE) == ledger_ids(positions[:10])
    assert ml.first_position() == positions[10]
    assert trimmed_from == [positions[10]]
    assert [e.position for e in ml.read_entries(Position(-1, -1), 100)] == positions[10:]


async def test_retention_time_counts_from_the_close_of_a_ledger(env):
    ml, positions = await filled(env, entries=5, per_ledger=3, retention_ms=MINUTE)
    first = ml.ledgers[positions[0].ledger_id]
    first.created_ms -= 10 * MINUTE              # opened long ago, closed just now: retained
    assert await ml.trim(first.closed_ms + MINUTE) == []          # not older than the retention
    assert await ml.trim(first.closed_ms + MINUTE + 1) == [first.ledger_id]


async def test_the_retention_size_keeps_the_newest_consumed_ledgers(env):
    ml, positions = await filled(env, entries=15, per_ledger=3)
    ledger_size = ml.ledgers[positions[0].ledger_id].size
    ml.set_retention(-1, 2 * ledger_size + 1)    # two ledgers' worth (the open one counts)
    assert await ml.trim() == ledger_ids(positions[:9])
    assert ml.total_size == 2 * ledger_size


async def test_a_durable_cursor_holds_back_what_it_has_not_consumed(env):
    ml, positions = await filled(env, entries=12, per_ledger=3, retention_ms=0)
    await asyncio.sleep(0.002)                   # retention 0: closed more than 0 ms ago
    cursor = await ml.open_cursor("slow", "earliest")
    await cursor.ack([positions[4]])             # acknowledged out of order: nothing consumed in full
    assert await ml.trim(10**15) == []
    await cursor.ack_cumulative(positions[5])    # the first two ledgers now are
    await settled(ml)
    assert ml.first_position() == positions[6]


async def test_a_stored_cursor_not_opened_yet_holds_back_what_it_has_not_consumed(env, reopen):
    ml, positions = await filled(env, entries=9, per_ledger=3)
    cursor = await ml.open_cursor("sub", "earliest")
    await cursor.ack_cumulative(positions[2])
    await ml.close()
    again = await ManagedLedger.open(reopen(env), TOPIC, ManagedLedgerConfig(max_entries_per_ledger=3,
                                                                             retention_ms=0))
    assert await again.trim(10**15) == [positions[0].ledger_id]     # (its cursor is not open)
    assert again.first_position() == positions[3]


async def test_the_slowest_cursor_moving_past_a_ledger_trims_it_in_the_background(env):
    ml, positions = await filled(env, entries=9, per_ledger=3, retention_ms=0)
    fast, slow = await ml.open_cursor("fast", "earliest"), await ml.open_cursor("slow", "earliest")
    await fast.ack_cumulative(positions[-1])
    await settled(ml)
    assert ml.first_position() == positions[0]   # the slow cursor keeps everything
    await asyncio.sleep(0.002)                   # retention 0: older than 0 ms
    await slow.ack_cumulative(positions[2])
    await settled(ml)
    assert ml.first_position() == positions[3]


async def test_without_a_durable_cursor_closed_ledgers_go_when_a_ledger_rolls_over(env):
    # Retention 50 ms: the first ledger has been closed longer than that when the second closes,
    # the second not (with retention 0 it would go too on a machine slow enough to take 1 ms
    # between its close and the trim that follows).
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=3, retention_ms=50))
    reader = ml.new_non_durable_cursor(Position(-1, -1))      # a reader holds nothing back
    positions = [await ml.append(b"x") for _ in range(4)]     # the 4th closes the first ledger
    await settled(ml)
    await asyncio.sleep(0.1)
    positions += [await ml.append(b"x") for _ in range(3)]    # the 7th closes the second
    await settled(ml)
    assert ml.first_position() == positions[3]
    assert ml.read_entries(reader.read_position, 1)[0].position == positions[3]


async def test_everything_is_kept_by_default(env):
    ml, positions = await filled(env, entries=6, per_ledger=2)
    cursor = await ml.open_cursor("sub", "earliest")
    await cursor.ack_cumulative(positions[-1])
    await settled(ml)
    assert await ml.trim(10**15) == []
    assert ml.number_of_entries == 6


async def test_the_close_time_of_a_ledger_survives_a_restart(env, reopen):
    ml, positions = await filled(env, entries=4, per_ledger=2)
    closed = {info.ledger_id: info.closed_ms for info in ml.ledgers.values() if info.closed}
    assert closed and all(closed.values())
    await ml.close()
    again = await ManagedLedger.open(reopen(env), TOPIC)
    assert {i: again.ledgers[i].closed_ms for i in closed} == closed


@pytest.mark.parametrize("retention", [(-2, 0), (0, -2), (1.5, 0), (0, "1"), (True, 0), (None, 0)])
async def test_a_malformed_retention_is_refused(env, retention):
    ml = await ManagedLedger.open(env, TOPIC)
    with pytest.raises(ValueError, match="must be an int >= -1"):
        ml.set_retention(*retention)
    assert (ml.config.retention_ms, ml.config.retention_bytes) == (-1, -1)


# --- how far retention trimmed (TopicRecord.trimmed_through: a stream's failOnDataLoss) -----

async def test_the_last_position_trimmed_is_recorded_with_the_trim_and_survives_a_restart(env, reopen):
    ml, positions = await filled(env, entries=9, per_ledger=3)
    assert ml.trimmed_through is None
    cursor = await ml.open_cursor("sub", "earliest")
    await cursor.ack_cumulative(positions[2])
    ml.set_retention(0, -1)                      # (set after the acks: no trim in the background)
    assert await ml.trim(10**15) == [positions[0].ledger_id]
    assert ml.trimmed_through == positions[2]
    ml.set_retention(-1, -1)
    await cursor.ack_cumulative(positions[5])
    ml.set_retention(0, -1)
    assert await ml.trim(10**15) == [positions[3].ledger_id]
    assert ml.trimmed_through == positions[5]                    # it only moves on
    await ml.close()
    again = await ManagedLedger.open(reopen(env), TOPIC)
    assert again.trimmed_through == positions[5]                 # written with the trim
    await again.set_property("p", "v")                          # a later save of the record keeps it
    await again.close()
    assert (await ManagedLedger.open(reopen(again.env), TOPIC)).trimmed_through == positions[5]


async def test_an_empty_ledger_trimmed_records_no_trim(env, reopen):
    ml = await ManagedLedger.open(env, TOPIC)
    empty = ml._current.ledger_id
    await ml.close()                             # a restart closes the ledger it left open, empty
    again = await ManagedLedger.open(reopen(env), TOPIC, ManagedLedgerConfig(retention_ms=0))
    assert again.ledgers[empty].closed
    assert await again.trim(10**15) == [empty]
    # None: no entry was deleted. (Position(empty, -1) would come after a reader's offset
    # past the end of the ledger before, which lost nothing.)
    assert again.trimmed_through is None


async def test_a_trim_whose_write_failed_records_nothing(env, reopen):
    ml, positions = await filled(env, entries=6, per_ledger=3, retention_ms=0)
    fail_next_save(env)
    with pytest.raises(StorageError, match="injected"):
        await ml.trim(10**15)
    assert ml.trimmed_through is None
    await ml.set_property("p", "v")                             # nor does the next save of the record
    await ml.close()
    assert (await ManagedLedger.open(reopen(env), TOPIC)).trimmed_through is None


async def test_a_record_saved_while_a_trim_is_written_is_not_durable_without_it(env, reopen):
    """A save of the topic record (a property) queued while the trim's write is in flight
    carries the trim's trimmed_through: if the trim's commit fails, that save fails too, or a
    restart would find entries still stored counted as trimmed."""
    ml, positions = await filled(env, entries=6, per_ledger=3, retention_ms=0)
    in_writer, release = threading.Event(), threading.Event()
    real_submit = env.submit

    def submit(write, **kwargs):                # the trim's write: held in the writer, then fails
        env.submit = real_submit

        def failing(txn):
            in_writer.set()
            release.wait(5)
            raise RuntimeError("injected: the disk is failing")
        return real_submit(failing, **kwargs)

    env.submit = submit
    trim = asyncio.ensure_future(ml.trim(10**15))
    assert await asyncio.get_running_loop().run_in_executor(None, in_writer.wait, 5)
    saved = asyncio.ensure_future(ml.set_property("p", "v"))     # queued for the next commit
    await asyncio.sleep(0.01)
    release.set()
    with pytest.raises(StorageError, match="injected"):
        await trim
    with pytest.raises(StorageError):
        await saved
    await ml.set_property("p", "v")                             # saved again, without it
    await ml.close()
    again = await ManagedLedger.open(reopen(env), TOPIC)
    assert again.trimmed_through is None and again.properties["p"] == "v"
    assert [e.position for e in again.read_entries(positions[0], 10)] == positions


@given(steps=st.lists(st.one_of(st.integers(1, 6), st.just("trim"), st.just("restart")), max_size=14),
       per_ledger=st.integers(1, 4))
@settings(max_examples=30, deadline=None)
def test_trimmed_through_follows_a_model_of_the_deleted_ledgers(tmp_path_factory, steps, per_ledger):
    """Appends (n entries), trims (everything closed goes: no cursor, retention 0) and restarts
    (the open ledger closed, empty or not), against a model of the stored entries: after each
    step `trimmed_through` is the last entry of the last ledger deleted with entries, every entry still
    stored comes after it and every one deleted is at or before it, also as a restart reads it."""
    data_dir = tmp_path_factory.mktemp("model")

    async def run() -> None:
        config = ManagedLedgerConfig(max_entries_per_ledger=per_ledger)
        env = StorageEnvironment(data_dir, sync=False)
        ml = await ManagedLedger.open(env, TOPIC, config)
        stored: list[Position] = []
        deleted: list[Position] = []
        ledgers_deleted: list[Position] = []        # each deleted ledger's last position
        try:
            for step in steps:
                if step == "trim":
                    before = {p.ledger_id: p for p in stored}
                    ml.set_retention(0, -1)
                    gone = await ml.trim(10**15)
                    ml.set_retention(-1, -1)
                    ledgers_deleted += [before[lid] for lid in gone if lid in before]
                    deleted += [p for p in stored if p.ledger_id in gone]
                    stored = [p for p in stored if p.ledger_id not in gone]
                elif step == "restart":
                    await ml.close()
                    env.close()
                    env = StorageEnvironment(data_dir, sync=False)
                    ml = await ManagedLedger.open(env, TOPIC, config)
                else:
                    stored += [await ml.append(b"x") for _ in range(step)]
                expected = max(ledgers_deleted, default=None)
                assert ml.trimmed_through == expected
                if expected is not None:
                    assert all(p > expected for p in stored) and all(p <= expected for p in deleted)
                assert [e.position for e in ml.read_entries(Position(-1, -1), 1000)] == stored
            await ml.close()
            env.close()
            with StoreReader(data_dir) as reader, reader.view() as view:
                assert view.topic(TOPIC).trimmed_through == max(ledgers_deleted, default=None)
        finally:
            if not env.closed:
                await ml.close()
                env.close()

    asyncio.run(run())
