"""The read-only store reader: topics, ledger ranges, entries in chunks, consistent views, and
that it never writes (a broker may be serving the same data dir from another process)."""

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import lmdb
import pytest

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment, StorageError
from pyengine.storage.entry import MARKER_TXN_ABORT
from pyengine.storage.reader import DataDirNotFoundError, StoreReader, TopicNotStoredError
from pyengine_kernels import Position

ROOT = Path(__file__).resolve().parents[2]
A = "persistent://public/default/a"
B = "persistent://public/default/b"


async def _fill(data_dir: Path, *, per_ledger: int = 3) -> dict[str, list]:
    """Two topics; `a` rolls over several ledgers and is reopened once (a new ledger, the old
    one closed at its last entry). Returns what ManagedLedger itself reads back."""
    env = StorageEnvironment(data_dir, sync=False)
    config = ManagedLedgerConfig(max_entries_per_ledger=per_ledger)
    a = await ManagedLedger.open(env, A, config)
    b = await ManagedLedger.open(env, B, config)
    for i in range(7):
        await a.append(f"a{i}".encode(), publish_time=1000 + i)
    await b.append(b"b0", txn_most=2, txn_least=9, num_messages=4)
    await b.append(b"", txn_most=2, txn_least=9, marker_type=MARKER_TXN_ABORT)
    await a.close()
    a = await ManagedLedger.open(env, A, config)         # starts a new ledger
    await a.append(b"a7")
    expected = {A: a.read_entries(Position.EARLIEST, 100), B: b.read_entries(Position.EARLIEST, 100),
                "ledgers": dict(a.ledgers), "lac": {A: a.lac, B: b.lac}}
    await a.close()
    await b.close()
    await env.drain()
    env.close()
    return expected


def _digest(data_dir: Path) -> str:
    return hashlib.sha256((data_dir / "lmdb" / "data.mdb").read_bytes()).hexdigest()


async def test_topics_ledgers_and_ranges(tmp_path):
    expected = await _fill(tmp_path)
    with StoreReader(tmp_path) as reader:
        assert reader.topic_names() == [A, B]
        a = reader.topic(A)
        assert a.properties == {} and a.terminated_at is None
        assert [ledger.ledger_id for ledger in a.ledgers] == list(expected["ledgers"])
        stored = [(l.ledger_id, l.first_entry, l.last_entry, l.entries) for l in a.ledgers if l.entries]
        by_ledger: dict[int, list[int]] = {}
        for entry in expected[A]:
            by_ledger.setdefault(entry.position.ledger_id, []).append(entry.position.entry_id)
        assert stored == [(lid, ids[0], ids[-1], len(ids)) for lid, ids in by_ledger.items()]
        assert a.entries == 8
        assert a.first_position == expected[A][0].position
        assert a.last_position == expected["lac"][A]
        assert reader.topic(B).last_position == expected["lac"][B]


async def test_counters_are_the_last_values_allocated(tmp_path):
    expected = await _fill(tmp_path)
    with StoreReader(tmp_path) as reader, reader.view() as view:
        assert view.counter("ledger") == max(expected["ledgers"])
        assert view.counter("never-allocated") == -1


async def test_open_ledger_range_comes_from_the_entries(tmp_path):
    """The ledger the writer was appending to has a record saying nothing of its entries."""
    expected = await _fill(tmp_path)
    with StoreReader(tmp_path) as reader:
        last = reader.topic(A).ledgers[-1]
    assert not last.closed
    assert last.entries == 1 and last.last == expected["lac"][A]


async def test_entries_in_chunks_between_inclusive_bounds(tmp_path):
    expected = await _fill(tmp_path)
    with StoreReader(tmp_path) as reader:
        a = reader.topic(A)
        with reader.view() as view:
            chunks = list(view.iter_entries(a.topic_id, Position.EARLIEST, Position.LATEST, chunk_entries=3))
            assert [len(c) for c in chunks] == [3, 3, 2]
            got = [e for c in chunks for e in c]
            assert [(e.position, e.data, e.publish_time) for e in got] == \
                [(e.position, e.data, e.publish_time) for e in expected[A]]
            start, end = expected[A][2].position, expected[A][5].position
            middle = [e.position for c in view.iter_entries(a.topic_id, start, end) for e in c]
            assert middle == [e.position for e in expected[A][2:6]]
            assert list(view.iter_raw(a.topic_id, end, start)) == []
            b = view.topic(B)
            headers = [h for c in view.iter_headers(b.topic_id, Position.EARLIEST, Position.LATEST) for h in c]
            (l0, e0, *_), (l1, e1, *_) = headers
            assert [h[2:] for h in headers] == [(0, 2, 9, 4), (MARKER_TXN_ABORT, 2, 9, 1)]
            assert (Position(l0, e0), Position(l1, e1)) == tuple(e.position for e in expected[B])


async def test_entries_backwards_from_a_position_down_to_a_floor(tmp_path):
    """`iter_raw_before`: what `iter_raw` gives over [floor, before), newest first, never
    another topic's entries (topic `b` is stored after `a`, and `a`'s prefix is below it)."""
    expected = await _fill(tmp_path)
    positions = [e.position for e in expected[A]]
    with StoreReader(tmp_path) as reader, reader.view() as view:
        a, b = view.topic(A), view.topic(B)

        def backwards(topic_id, before, floor, chunk_entries=2):
            chunks = list(view.iter_raw_before(topic_id, before, floor, chunk_entries))
            assert all(0 < len(c[2]) <= chunk_entries for c in chunks)
            return [(Position(l, e), v) for ls, es, vs in chunks for l, e, v in zip(ls, es, vs)]

        forward = [(Position(l, e), v) for ls, es, vs in view.iter_raw(a.topic_id, Position.EARLIEST, Position.LATEST)
                   for l, e, v in zip(ls, es, vs)]
        assert backwards(a.topic_id, Position.LATEST, Position.EARLIEST) == forward[::-1]
        for before in positions + [Position.LATEST]:
            for floor in [Position.EARLIEST] + positions:
                want = [(p, v) for p, v in forward if floor <= p < before][::-1]
                assert backwards(a.topic_id, before, floor) == want, (before, floor)
        assert [p for p, _ in backwards(b.topic_id, Position.LATEST, Position.EARLIEST)] == \
            [e.position for e in expected[B]][::-1]
        assert backwards(b.topic_id, Position.EARLIEST, Position.EARLIEST) == []
        assert backwards(b.topic_id + 1, Position.LATEST, Position.EARLIEST) == []     # no such topic
        with pytest.raises(ValueError, match="chunk_entries must be >= 1"):
            list(view.iter_raw_before(a.topic_id, Position.LATEST, Position.EARLIEST, 0))


async def test_entries_in_chunks_bounded_by_bytes(tmp_path):
    """`chunk_bytes`: a chunk ends with the entry that reaches that many bytes (the Spark
    source reads large messages and chunks without holding gigabytes at once)."""
    expected = await _fill(tmp_path)
    with StoreReader(tmp_path) as reader, reader.view() as view:
        a = view.topic(A)
        entry_size = len(next(view.iter_raw(a.topic_id, Position.EARLIEST, Position.LATEST, 1))[2][0])
        chunks = list(view.iter_raw(a.topic_id, Position.EARLIEST, Position.LATEST, 100, 2 * entry_size))
        assert [len(c[2]) for c in chunks] == [2, 2, 2, 2]
        assert [Position(l, e) for c in chunks for l, e in zip(c[0], c[1])] == [e.position for e in expected[A]]
        backwards = list(view.iter_raw_before(a.topic_id, Position.LATEST, Position.EARLIEST, 100, 3 * entry_size))
        assert [len(c[2]) for c in backwards] == [3, 3, 2]
        with pytest.raises(ValueError, match="chunk_bytes must be >= 1"):
            list(view.iter_raw(a.topic_id, Position.EARLIEST, Position.LATEST, 100, 0))


async def test_previous_position_is_the_managed_ledgers(tmp_path):
    await _fill(tmp_path)
    env = StorageEnvironment(tmp_path, sync=False)
    ml = await ManagedLedger.open(env, A, ManagedLedgerConfig(max_entries_per_ledger=3))
    ledgers = {lid: info.last_entry_id for lid, info in ml.ledgers.items()}
    probes = [Position(lid, e) for lid in ledgers for e in (0, 1, 2)]
    want = [ml.previous_position(p) for p in probes]
    await ml.close()
    await env.drain()
    env.close()
    with StoreReader(tmp_path) as reader:
        topic = reader.topic(A)
        assert [topic.previous_position(p) for p in probes] == want


async def test_reading_writes_nothing(tmp_path):
    await _fill(tmp_path)
    before = _digest(tmp_path)
    with StoreReader(tmp_path) as reader:
        with reader.view() as view:
            for name in view.topic_names():
                topic = view.topic(name)
                for _ in view.iter_raw(topic.topic_id, Position.EARLIEST, Position.LATEST):
                    pass
                view.transaction_buffer_snapshot(topic.topic_id)
    assert _digest(tmp_path) == before


def test_not_a_data_dir(tmp_path):
    with pytest.raises(DataDirNotFoundError, match="not a pyengine data dir"):
        StoreReader(tmp_path / "missing")


async def test_unknown_topic(tmp_path):
    await _fill(tmp_path)
    with StoreReader(tmp_path) as reader, pytest.raises(TopicNotStoredError, match="no topic") as info:
        reader.topic("persistent://public/default/nope")
    assert isinstance(info.value, KeyError)


WRITER = textwrap.dedent("""
    import asyncio, sys
    from pyengine.storage import ManagedLedger, StorageEnvironment

    async def main(path):
        env = StorageEnvironment(path, sync=False)
        ml = await ManagedLedger.open(env, "persistent://public/default/live")
        await ml.append(b"first")
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() == "stop":
                break
            await ml.append(line.strip().encode())
            print("appended", flush=True)
        await ml.close()
        await env.drain()
        env.close()

    asyncio.run(main(sys.argv[1]))
""")


def test_a_view_is_a_snapshot_while_a_broker_process_writes(tmp_path):
    """A writer in another process keeps appending; an open view keeps seeing its snapshot,
    a new view sees the new entries."""
    with subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=ROOT, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as writer:
        try:
            assert writer.stdout.readline().strip() == "ready"
            with StoreReader(tmp_path) as reader:
                with reader.view() as view:
                    topic = view.topic("persistent://public/default/live")

                    def data(v):
                        return [e.data for c in v.iter_entries(topic.topic_id, Position.EARLIEST, Position.LATEST)
                                for e in c]

                    assert data(view) == [b"first"]
                    writer.stdin.write("second\n")
                    writer.stdin.flush()
                    assert writer.stdout.readline().strip() == "appended"
                    assert data(view) == [b"first"]
                with reader.view() as fresh:
                    assert data(fresh) == [b"first", b"second"]
                assert reader.topic("persistent://public/default/live").entries == 2
            writer.stdin.write("stop\n")
            writer.stdin.flush()
            assert writer.wait(timeout=30) == 0
        finally:
            if writer.poll() is None:
                writer.kill()


def test_a_read_only_open_refuses_another_format_or_another_programs_environment(tmp_path):
    """What a reader cannot read is refused at open, with the reason (the broker's read-write
    open refuses another format the same way)."""
    data = tmp_path / "data"
    StorageEnvironment(data).close()
    env = lmdb.open(str(data / "lmdb"), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.put(b"format", (2).to_bytes(8, "big"), db=env.open_db(b"meta", txn=txn))
    env.close()
    for open_it in (StoreReader, lambda path: StorageEnvironment(path, readonly=True), StorageEnvironment):
        with pytest.raises(StorageError, match="holds data format 2, this pyengine reads format 1"):
            open_it(data)
    foreign = tmp_path / "foreign"
    (foreign / "lmdb").mkdir(parents=True)
    env = lmdb.open(str(foreign / "lmdb"))
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v")
    env.close()
    with pytest.raises(DataDirNotFoundError, match="lacks pyengine's databases"):
        StoreReader(foreign)
