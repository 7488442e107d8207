"""A read-compacted seek by publish time into the compacted view: a binary search over the
view (as the managed ledger's), not a scan of every entry of it on the event loop, with the
answer of a scan where publish times do not go back."""

from __future__ import annotations

from types import SimpleNamespace

from pyengine.broker.compaction import TopicCompaction
from pyengine.storage.entry import Entry
from pyengine.storage.environment import StorageEnvironment
from pyengine_kernels import Position


async def _compaction(env, entries: list[Entry]) -> TopicCompaction:
    """A topic's compaction whose view holds `entries` (its horizon the last), a view of
    another topic beside it."""
    compaction = TopicCompaction(SimpleNamespace(ledger=SimpleNamespace(env=env, topic_id=5)))
    other = TopicCompaction(SimpleNamespace(ledger=SimpleNamespace(env=env, topic_id=6)))
    for c, rows in ((compaction, entries), (other, [Entry(Position(9, 0), b"x", publish_time=1)])):
        await env.submit(c.view.stage_write(1, rows))
        c.view.use(1)
        c.horizon = rows[-1].position
    return compaction


def _scanned(entries: list[Entry], timestamp_ms: int, found: Position) -> Position:
    for entry in entries:
        if entry.position >= found:
            break
        if entry.publish_time >= timestamp_ms:
            return entry.position
    return found


async def test_the_search_finds_what_a_scan_finds(tmp_path):
    """Entries over ledgers with gaps between them and in them, equal publish times."""
    env = StorageEnvironment(tmp_path / "data", sync=False)
    try:
        entries, published = [], 10
        for ledger_id in (3, 4, 8, 20):
            for entry_id in range(0, 40, 1 + ledger_id % 3):
                published += entry_id % 4 // 2          # steps of 0 and 1
                entries.append(Entry(Position(ledger_id, entry_id), b"m", publish_time=published))
        compaction = await _compaction(env, entries)
        bounds = [Position(3, 0), Position(3, 5), Position(4, 0), Position(8, 17), Position(20, 39),
                  Position(21, 0), Position(1 << 40, 0)]
        for found in bounds:
            for timestamp in range(8, published + 3):
                assert compaction.find_by_publish_time(timestamp, found) == _scanned(entries, timestamp, found), \
                    (timestamp, found)
    finally:
        env.close()


async def test_a_seek_reads_a_few_entries_of_a_large_view(tmp_path, monkeypatch):
    env = StorageEnvironment(tmp_path / "data", sync=False)
    try:
        entries = [Entry(Position(2 + i // 1000, i % 1000), b"m" * 64, publish_time=1000 + i) for i in range(20_000)]
        compaction = await _compaction(env, entries)
        decoded = []
        original = Entry.decode.__func__
        monkeypatch.setattr(Entry, "decode", classmethod(lambda cls, *a: decoded.append(1) or original(cls, *a)))
        found = Position(30, 0)                          # the stored ledger's answer (after the view)
        assert compaction.find_by_publish_time(1000 + 19_990, found) == entries[19_990].position
        assert compaction.find_by_publish_time(1000 + 30_000, found) == found
        assert len(decoded) < 300, f"{len(decoded)} entries of the view decoded for two seeks"
    finally:
        env.close()
