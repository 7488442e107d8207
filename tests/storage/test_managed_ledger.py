import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyengine.storage import (
    ManagedLedger,
    ManagedLedgerConfig,
    StorageEnvironment,
    StorageError,
    StorageFullError,
    TopicTerminatedError,
)
from pyengine.storage.entry import MARKER_TXN_ABORT, Entry, headers_and_payload, split_headers_and_payload
from pyengine_kernels import Position

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "persistent://public/default/t"


async def test_append_assigns_increasing_positions_and_reads_them_back(env):
    ml = await ManagedLedger.open(env, TOPIC)
    positions = await asyncio.gather(*(ml.append(f"m{i}".encode()) for i in range(10)))
    assert positions == sorted(positions)
    assert len(set(positions)) == 10
    assert ml.lac == positions[-1]
    entries = ml.read_entries(ml.first_position(), 100)
    assert [e.data for e in entries] == [f"m{i}".encode() for i in range(10)]
    assert [e.position for e in entries] == positions


async def test_append_batch_keeps_order_with_single_appends(env):
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=7))
    single = ml.append(b"a")
    batch = ml.append_batch([f"b{i}".encode() for i in range(10)])
    last = ml.append(b"c")
    positions = [await single, *await batch, await last]
    assert positions == sorted(positions) and len(set(positions)) == 12
    assert [e.data for e in ml.read_entries(ml.first_position(), 100)] == \
        [b"a", *[f"b{i}".encode() for i in range(10)], b"c"]


async def test_a_lower_topic_appends_without_mdb_append(env):
    """Entries of an older topic sort before a newer topic's: they are inserted, not appended."""
    old = await ManagedLedger.open(env, TOPIC + "-old")
    new = await ManagedLedger.open(env, TOPIC + "-new")
    await new.append(b"n")
    assert await old.append_batch([b"o1", b"o2"]) and await new.append(b"n2")
    assert [e.data for e in old.read_entries(old.first_position(), 10)] == [b"o1", b"o2"]
    assert [e.data for e in new.read_entries(new.first_position(), 10)] == [b"n", b"n2"]


async def test_entry_header_fields_round_trip(env):
    ml = await ManagedLedger.open(env, TOPIC)
    pos = await ml.append(b"abc", txn_most=3, txn_least=77, marker_type=MARKER_TXN_ABORT,
                          num_messages=5, publish_time=123)
    (entry,) = ml.read_entries(pos, 1)
    assert (entry.txn_most, entry.txn_least, entry.marker_type, entry.num_messages, entry.publish_time) == \
        (3, 77, MARKER_TXN_ABORT, 5, 123)
    assert entry.is_marker and entry.txn is not None and entry.txn.least_bits == 77


async def test_appends_in_one_loop_turn_share_one_commit(env):
    ml = await ManagedLedger.open(env, TOPIC)
    commits = []
    original = env._write_batch

    def counting(writes):
        commits.append(len(writes))
        return original(writes)

    env._write_batch = counting
    await asyncio.gather(*(ml.append(b"x") for _ in range(500)))
    assert len(commits) == 1, commits


async def test_lac_moves_only_after_the_commit_is_durable(env):
    ml = await ManagedLedger.open(env, TOPIC)
    before = ml.lac
    future = ml.append(b"x")
    assert ml.lac == before
    assert ml.read_entries(ml.first_position(), 10) == []
    position = await future
    assert ml.lac == position


@settings(max_examples=25, deadline=None)
@given(batches=st.lists(st.lists(st.binary(min_size=0, max_size=300), max_size=12), min_size=1, max_size=6),
       max_entries=st.integers(1, 9), max_bytes=st.integers(64, 1500))
def test_append_batch_lays_entries_out_as_single_appends_would(tmp_path_factory, batches, max_entries, max_bytes):
    """The batch path (one loop per ledger's worth of entries) rolls ledgers over by count and
    by size exactly where appending the same entries one by one would."""
    config = ManagedLedgerConfig(max_entries_per_ledger=max_entries, max_ledger_bytes=max_bytes)

    async def layout(batched: bool):
        env = StorageEnvironment(tmp_path_factory.mktemp("layout"))
        try:
            ml = await ManagedLedger.open(env, TOPIC, config)
            positions = []
            for batch in batches:
                if batched:
                    positions += await ml.append_batch(batch)
                else:
                    positions += [await ml.append(data) for data in batch]
            stored = [(e.position, e.data) for e in ml.read_entries(ml.first_position(), 1000)] if positions else []
            return positions, stored, [(i.ledger_id, i.entries, i.size) for i in ml.ledgers.values()]
        finally:
            env.close()

    assert asyncio.run(layout(True)) == asyncio.run(layout(False))


async def test_ledgers_roll_over_by_entry_count(env):
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=10))
    positions = await asyncio.gather(*(ml.append(b"x") for _ in range(35)))
    ledgers = sorted({p.ledger_id for p in positions})
    assert len(ledgers) == 4
    assert all(p.entry_id < 10 for p in positions)
    assert len(ml.read_entries(ml.first_position(), 100)) == 35
    assert ml.number_of_entries == 35


async def test_ledgers_roll_over_by_size(env):
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_ledger_bytes=4096))
    positions = await asyncio.gather(*(ml.append(b"x" * 1000) for _ in range(12)))
    assert len({p.ledger_id for p in positions}) >= 3


async def test_reopen_starts_a_new_ledger_and_keeps_every_entry(env, reopen):
    ml = await ManagedLedger.open(env, TOPIC)
    first = await asyncio.gather(*(ml.append(f"a{i}".encode()) for i in range(5)))
    await ml.close()
    env2 = reopen(env)
    ml2 = await ManagedLedger.open(env2, TOPIC)
    assert ml2.lac == first[-1]
    second = await ml2.append(b"b")
    assert second.ledger_id > first[-1].ledger_id
    assert [e.data for e in ml2.read_entries(ml2.first_position(), 10)] == \
        [f"a{i}".encode() for i in range(5)] + [b"b"]


async def test_next_and_previous_position_cross_ledgers(env):
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=3))
    p = await asyncio.gather(*(ml.append(b"x") for _ in range(7)))
    assert ml.next_position(p[2]) == p[3]           # end of ledger -> start of next
    assert ml.previous_position(p[3]) == p[2]
    assert ml.previous_position(p[0]) == Position(p[0].ledger_id, -1)
    assert ml.next_position(p[-1]) == p[-1].next()   # beyond the LAC
    assert ml.entries_between(p[1], p[5]) == 4


async def test_terminate_seals_the_ledger(env, reopen):
    ml = await ManagedLedger.open(env, TOPIC)
    last = await ml.append(b"x")
    assert await ml.terminate() == last
    assert await ml.terminate() == last               # idempotent
    with pytest.raises(TopicTerminatedError):
        await ml.append(b"y")
    await ml.close()
    ml2 = await ManagedLedger.open(reopen(env), TOPIC)
    assert ml2.terminated_at == last
    with pytest.raises(TopicTerminatedError):
        await ml2.append(b"z")


async def test_map_full_fails_the_write_and_reads_keep_working(tmp_path):
    env = StorageEnvironment(tmp_path / "small", map_size=2 << 20)
    try:
        ml = await ManagedLedger.open(env, TOPIC)
        kept = await asyncio.gather(*(ml.append(b"k" * 100) for _ in range(10)))
        with pytest.raises(StorageFullError):
            await asyncio.gather(*(ml.append(b"x" * 4096) for _ in range(2000)))
        # Everything acknowledged before is intact and readable; the ledger has no holes.
        assert [e.position for e in ml.read_entries(ml.first_position(), 100)] == kept
        assert ml.lac == kept[-1]
        # Small writes still go through once the big batch is gone.
        after = await ml.append(b"small")
        assert after > kept[-1]
        assert ml.read_entries(after, 1)[0].data == b"small"
    finally:
        env.close()


async def test_properties_are_durable(env, reopen):
    ml = await ManagedLedger.open(env, TOPIC)
    await ml.set_property("pyengine.txn", "true")
    await ml.close()
    ml2 = await ManagedLedger.open(reopen(env), TOPIC)
    assert ml2.properties == {"pyengine.txn": "true"}


async def test_append_entry_tells_the_position_before_it_is_durable(env):
    ml = await ManagedLedger.open(env, TOPIC)
    position, future = ml.append_entry(b"x")
    assert position is not None and position > ml.lac
    assert await future == position


async def test_an_entry_conditional_on_a_failed_write_fails_with_its_batch(env):
    """A commit marker waits for no decision, but is never durable without it: when the
    decision's write fails, the marker's group commit is not written (nor what shares it)."""
    ml = await ManagedLedger.open(env, TOPIC)
    before = await ml.append(b"before")
    release = threading.Event()

    def doomed(txn):
        release.wait(10)
        raise RuntimeError("injected decision failure")

    decision = env.submit(doomed)
    await asyncio.sleep(0)                      # the decision's commit is in flight
    _, plain = ml.append_entry(b"plain")
    _, marker = ml.append_entry(b"marker", after=decision)
    release.set()
    for future in (decision, plain, marker):
        with pytest.raises(StorageError):
            await future
    later = await ml.append(b"later")
    assert [e.data for e in ml.read_entries(ml.first_position(), 10)] == [b"before", b"later"]
    assert later > before


async def test_entries_on_one_condition_make_their_batch_depend_on_it_once(env):
    """A transaction's first sends all wait for one registration: their batch depends on it
    once, a new batch depends on it again, and every entry on it fails when it fails."""
    ml = await ManagedLedger.open(env, TOPIC)
    calls = []
    depend = env.depend

    def counting_depend(key, after):
        calls.append(after)
        depend(key, after)

    env.depend = counting_depend
    release = threading.Event()

    def doomed(txn):
        release.wait(10)
        raise RuntimeError("injected registration failure")

    registration = env.submit(doomed)
    other = env.submit(lambda txn: None)
    await asyncio.sleep(0)                      # the registration's commit is in flight
    first = [ml.append_entry(b"m", after=registration)[1] for _ in range(3)]
    first.append(ml.append_entry(b"m", after=other)[1])
    first.append(ml.append_entry(b"m", after=registration)[1])
    assert calls == [registration, other, registration]
    assert env._pending[ml._append_key].conditions == [registration, other, registration]
    release.set()
    for failed in (registration, other):        # one commit: both failed
        with pytest.raises(StorageError):
            await failed
    for future in first:
        with pytest.raises(StorageError, match="presupposes"):
            await future
    _, later = ml.append_entry(b"m", after=registration)      # a new batch: its own condition
    assert calls == [registration, other, registration, registration]
    with pytest.raises(StorageError):
        await later
    assert [e.data for e in ml.read_entries(ml.first_position(), 10)] == []
    await env.drain()                           # (the failed ledger's record, written now)


def test_headers_and_payload_round_trip():
    data = headers_and_payload(b"meta", b"payload")
    assert data[:2] == b"\x0e\x01"
    assert split_headers_and_payload(data) == (b"meta", b"payload")


def test_corrupt_entry_is_reported():
    from pyengine.storage import CorruptRecordError
    with pytest.raises(CorruptRecordError):
        Entry.decode(Position(1, 1), b"\x01\x00")
    with pytest.raises(CorruptRecordError):
        split_headers_and_payload(b"\x0e\x01\x00\x00\x00\x00\x00\x00\x00\x09meta")


CRASH_WRITER = textwrap.dedent("""
    import asyncio, os, sys
    from pyengine.storage import ManagedLedger, StorageEnvironment

    async def main(path, report_path):
        env = StorageEnvironment(path)
        ml = await ManagedLedger.open(env, "persistent://public/default/crash")
        cursor = await ml.open_cursor("sub", "earliest")
        # Every acknowledgement is reported, once given, by one write to a file: that never
        # blocks (a pipe read only after the kill fills up at 64 KB and would hold the writer
        # there, so that the kill never lands in the middle of a commit).
        report = os.open(report_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        i = 0
        while True:
            batch = [ml.append(f"{i + k}".encode()) for k in range(50)]
            positions = []
            for k, future in enumerate(batch):
                position = await future
                positions.append(position)
                os.write(report, f"entry {i + k} {position.ledger_id} {position.entry_id}\\n".encode())
            # A consumer acknowledges the batch, and repeats it (a client's retry) at once: the
            # repeat is answered only once the first is durable.
            cursor.ack(positions)
            await cursor.ack(positions)
            os.write(report, f"acked {i}\\n".encode())          # the entries of values i to i + 49
            i += 50

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


@pytest.mark.parametrize("delay", [0.3, 0.8])
async def test_nothing_acknowledged_is_lost_after_kill_9(tmp_path, delay):
    data, report = tmp_path / "crash", tmp_path / "acknowledged"
    proc = subprocess.Popen([sys.executable, "-c", CRASH_WRITER, str(data), str(report)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    # Writes in full flow (a first batch acknowledged), then `delay` more: not a fixed time for
    # the interpreter's start-up, which a loaded machine outlasted (no report written yet).
    # (Killed in any case: the checks below tell a writer that never got there.)
    deadline = time.monotonic() + 60
    while not (report.exists() and "acked" in report.read_text()) and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the writer stopped before it was killed"
    # (a line the kill cut short, without its end, was not reported)
    lines = [line.split() for line in report.read_text().split("\n")[:-1]]
    appended = [tuple(map(int, fields[1:])) for fields in lines if fields[0] == "entry"]
    consumed_batches = {int(fields[1]) // 50 for fields in lines if fields[0] == "acked"}
    assert len(appended) > 50, "the writer acknowledged too little to make the test meaningful"
    assert consumed_batches, "the writer's consumer acknowledged nothing"
    env = StorageEnvironment(data)
    try:
        ml = await ManagedLedger.open(env, "persistent://public/default/crash")
        stored = {(e.position.ledger_id, e.position.entry_id): e.data
                  for e in ml.read_entries(Position(-1, -1), 10 ** 7)}
        for value, ledger_id, entry_id in appended:
            assert stored[(ledger_id, entry_id)] == str(value).encode()
        cursor = await ml.open_cursor("sub", "earliest")
        assert [(value, Position(ledger_id, entry_id)) for value, ledger_id, entry_id in appended
                if value // 50 in consumed_batches and not cursor.is_acked(Position(ledger_id, entry_id))] == []
        # The ledger left open by the crash was closed at its last durable entry; appends go on.
        position = await ml.append(b"after")
        assert position.ledger_id > max(ledger for _, ledger, _ in appended)
    finally:
        env.close()
