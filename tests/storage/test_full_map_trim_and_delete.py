"""Trims and topic deletions free space in a full LMDB map. Found by an audit: each deleted its
entries in one write transaction, and in LMDB a delete needs new pages to record the pages it
frees, so in a full map that write failed (MDB_MAP_FULL) every time, also after a restart with
the same map size: nothing could free space again, and appends failed for good.

Now one small write deletes the records that reach the entries (the trimmed ledgers', a deleted
topic's) and notes what is to go; bounded writes then remove the entries. A crash between those
writes leaves the entries unreachable, and their removal is resumed. And appends are refused
once 95% of the map is used: in a map filled to its very last page, LMDB cannot write even the
deletion of a single entry (it needs a few free pages to copy the pages it changes)."""

import asyncio

import pytest

import pyengine.storage.managed_ledger as managed_ledger
from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment, StorageFullError
from pyengine.storage.reader import StoreReader
from pyengine_kernels import Position
from tests.storage.helpers import settled

TOPIC = "persistent://public/default/full"
MAP_SIZE = 4 << 20
CONFIG = ManagedLedgerConfig(max_entries_per_ledger=100, retention_ms=0)
PAYLOAD = b"x" * 1000


def stored_entries(env: StorageEnvironment, prefix: bytes) -> int:
    with env.read() as txn:
        cursor = txn.cursor(db=env.db("entries"))
        count = 0
        if cursor.set_range(prefix):
            for key in cursor.iternext(values=False):
                if not key.startswith(prefix):
                    break
                count += 1
        return count


async def fill(ml: ManagedLedger) -> int:
    """Append until the storage refuses: how many entries went in."""
    appended = 0
    with pytest.raises(StorageFullError):
        while True:
            appended += len(await ml.append_batch([PAYLOAD] * 20))
    return appended


async def test_a_trim_frees_a_full_map_and_appends_work_again(tmp_path):
    env = StorageEnvironment(tmp_path / "data", map_size=MAP_SIZE, sync=False)
    try:
        ml = await ManagedLedger.open(env, TOPIC, CONFIG)
        cursor = await ml.open_cursor("sub", "earliest")
        appended = await fill(ml)
        assert appended > 1000
        await cursor.ack_cumulative(ml.lac)
        await settled(ml)
        await ml.trim()
        assert ml.trimmed_through is not None
        assert stored_entries(env, ml._prefix) < 100           # only the current ledger's are left
        for _ in range(5):                                      # the space is there again
            await ml.append_batch([PAYLOAD] * 20)
        await ml.close()
    finally:
        env.close()


async def test_a_trim_after_a_restart_with_the_same_map_size_frees_it(tmp_path):
    env = StorageEnvironment(tmp_path / "data", map_size=MAP_SIZE, sync=False)
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=100))
    cursor = await ml.open_cursor("sub", "earliest")
    await fill(ml)
    await cursor.ack_cumulative(ml.lac)
    await ml.close()
    env.close()

    env = StorageEnvironment(tmp_path / "data", map_size=MAP_SIZE, sync=False)
    try:
        ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=100))
        ml.set_retention(0, -1)
        assert len(await ml.trim(10**15)) > 10
        assert stored_entries(env, ml._prefix) == 0
        await ml.append_batch([PAYLOAD] * 20)
        await ml.close()
    finally:
        env.close()


async def test_deleting_a_topic_frees_a_full_map(tmp_path):
    env = StorageEnvironment(tmp_path / "data", map_size=MAP_SIZE, sync=False)
    try:
        ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=100))
        await ml.open_cursor("sub", "earliest")
        await fill(ml)
        prefix = ml._prefix
        await ml.delete()
        assert stored_entries(env, prefix) == 0
        other = await ManagedLedger.open(env, TOPIC + "-2")
        await other.append_batch([PAYLOAD] * 200)
        await other.close()
    finally:
        env.close()


async def test_appends_are_refused_before_the_map_is_full_and_trims_still_go(tmp_path):
    """Appends stop at FULL_SHARE of the map (a bookie's read-only mode): what frees space
    still finds pages to write to, however the appends filled the map."""
    env = StorageEnvironment(tmp_path / "data", map_size=MAP_SIZE, sync=False)
    try:
        ml = await ManagedLedger.open(env, TOPIC, CONFIG)
        cursor = await ml.open_cursor("sub", "earliest")
        with pytest.raises(StorageFullError):
            while True:
                await ml.append(PAYLOAD)                      # one entry a commit: no overshoot
        assert env.nearly_full
        with pytest.raises(StorageFullError, match="nearly full"):
            await ml.append(b"small")
        await ml.set_property("still", "written")              # records are
        await cursor.ack_cumulative(ml.lac)
        await settled(ml)
        await ml.trim()
        await env.barrier()
        assert not env.nearly_full
        await ml.append(b"small")
        await ml.close()
    finally:
        env.close()


class CrashAfter:
    """Lets group commits through until one has deleted a record of the database `db_name`,
    then fails every later one: what a kill -9 right after that commit leaves on disk."""

    def __init__(self, env: StorageEnvironment, db_name: str) -> None:
        self.db = env.db(db_name)
        self.original = env._write_batch
        self.crashed = False
        env._write_batch = self._write

    def _write(self, writes):
        if self.crashed:
            raise RuntimeError("crashed")
        deleted: list[bytes] = []
        result = self.original([None if write is None else self._watch(write, deleted) for write in writes])
        if deleted:
            self.crashed = True
        return result

    def _watch(self, write, deleted):
        return lambda txn: write(_Recording(txn, self.db, deleted))


class _Recording:
    """An LMDB write transaction that remembers the keys deleted from one database."""

    def __init__(self, txn, db, deleted: list) -> None:
        self._txn, self._db, self._deleted = txn, db, deleted

    def delete(self, key, *args, db=None, **kwargs):
        if db is not None and db == self._db:
            self._deleted.append(key)
        return self._txn.delete(key, *args, db=db, **kwargs)

    def __getattr__(self, name):
        return getattr(self._txn, name)


async def test_a_crash_between_a_trims_writes_leaves_its_entries_unreachable_then_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(managed_ledger, "PURGE_RETRIES", 0, raising=False)
    env = StorageEnvironment(tmp_path / "data", sync=False)
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=1000))
    positions = [p for _ in range(5) for p in await ml.append_batch([PAYLOAD] * 500)]   # ledgers of 1000
    kept = positions[2000:]
    ml.set_retention(0, -1)
    crash = CrashAfter(env, "ledgers")
    trimmed = await ml.trim(10**15)
    assert crash.crashed and trimmed == [positions[0].ledger_id, positions[1000].ledger_id]
    prefix = ml._prefix
    env.close()                                    # the process dies; its entries may be left

    env = StorageEnvironment(tmp_path / "data", sync=False)
    try:
        ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=1000))
        # Whatever is still stored, the trim happened as a whole: its ledgers and entries are gone.
        assert ml.trimmed_through == positions[1999]
        assert list(ml.ledgers)[0] == kept[0].ledger_id
        assert [e.position for e in ml.read_entries(Position(-1, -1), 10)] == kept[:10]
        assert ml.read_entry(positions[5]) is None
        assert [e.position for e in ml.read_entries_reverse(kept[0], 10)] == [kept[0]]
        # ... and the open resumed the removal of what was left.
        await asyncio.wait_for(_removed(env), 10)
        assert stored_entries(env, prefix) == len(kept)
        assert [e.position for e in ml.read_entries(Position(-1, -1), 5000)] == kept
        await ml.close()
    finally:
        env.close()
    with StoreReader(tmp_path / "data") as reader, reader.view() as view:
        info = view.topic(TOPIC)
        assert info.first_position == kept[0] and info.trimmed_through == positions[1999]


async def test_a_crash_between_a_topic_deletions_writes_leaves_its_entries_removed_later(tmp_path, monkeypatch):
    monkeypatch.setattr(managed_ledger, "PURGE_RETRIES", 0, raising=False)
    env = StorageEnvironment(tmp_path / "data", sync=False)
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=1000))
    for _ in range(6):
        await ml.append_batch([PAYLOAD] * 500)
    await ml.open_cursor("sub", "earliest")
    prefix = ml._prefix
    crash = CrashAfter(env, "topics")
    await ml.delete()              # (the removal's failure is logged: resumed by the next open)
    assert crash.crashed
    env.close()

    env = StorageEnvironment(tmp_path / "data", sync=False)
    try:
        with env.read() as txn:
            assert txn.get(TOPIC.encode(), db=env.db("topics")) is None      # deleted as a whole
        again = await ManagedLedger.open(env, TOPIC)                         # a new topic of that name
        assert again._prefix != prefix and again.read_entries(Position(-1, -1), 10) == []
        await asyncio.wait_for(_removed(env), 10)
        assert stored_entries(env, prefix) == 0
        await again.close()
    finally:
        env.close()


async def _removed(env: StorageEnvironment) -> None:
    """Wait until no deletion is noted any more (the background removal is done)."""
    while True:
        with env.read() as txn:
            cursor = txn.cursor(db=env.db("meta"))
            if not (cursor.set_range(b"purge/") and cursor.key().startswith(b"purge/")):
                return
        await asyncio.sleep(0.01)
