"""A managed ledger deleted while an operation on it is under way stays deleted. Found by an
audit: a terminate waiting for the appends in flight, or a cursor open whose task had not run
yet, went on after the deletion's group commit and wrote the topic's, a ledger's or the
cursor's record back: the deleted topic came back terminated, or its cursor stayed forever
under a topic id nothing uses any more."""

import asyncio

import pytest

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment
from pyengine.storage.errors import LedgerClosedError

TOPIC = "persistent://public/default/t"


def stored_keys(env: StorageEnvironment, prefix: bytes) -> dict[str, list[bytes]]:
    """The keys left of the topic: its record, and those under its id in each database."""
    found = {}
    with env.read() as txn:
        found["topics"] = [key for key, _ in txn.cursor(db=env.db("topics")) if key == TOPIC.encode()]
        for name in ("ledgers", "entries", "cursors"):
            found[name] = [key for key, _ in txn.cursor(db=env.db(name)) if key.startswith(prefix)]
    return found


async def test_a_terminate_waiting_for_appends_does_not_bring_a_deleted_ledger_back(tmp_path):
    env = StorageEnvironment(tmp_path)
    ml = await ManagedLedger.open(env, TOPIC)
    await ml.append(b"m")
    terminating = asyncio.ensure_future(ml.terminate())
    await asyncio.sleep(0)                  # it waits for the appends in flight (a barrier)
    await ml.delete()
    with pytest.raises(LedgerClosedError):
        await terminating
    await env.drain()
    assert stored_keys(env, ml._prefix) == {"topics": [], "ledgers": [], "entries": [], "cursors": []}
    env.close()


async def test_a_cursor_open_under_way_does_not_outlive_the_ledgers_deletion(tmp_path):
    env = StorageEnvironment(tmp_path)
    ml = await ManagedLedger.open(env, TOPIC)
    await ml.append(b"m")
    opening = asyncio.ensure_future(ml.open_cursor("s", "earliest"))
    await asyncio.sleep(0)                  # open_cursor has started the cursor's creation
    await ml.delete()
    with pytest.raises(LedgerClosedError):
        await opening
    await env.drain()
    assert stored_keys(env, ml._prefix) == {"topics": [], "ledgers": [], "entries": [], "cursors": []}
    assert ml.cursors == {}
    env.close()


async def test_an_ack_after_the_ledgers_deletion_does_not_bring_its_cursor_back(tmp_path):
    env = StorageEnvironment(tmp_path)
    ml = await ManagedLedger.open(env, TOPIC)
    positions = [await ml.append(b"m") for _ in range(3)]
    cursor = await ml.open_cursor("s", "earliest")
    await ml.delete()
    await cursor.ack([positions[1]])            # a consumer's ack still on its way
    await cursor.ack_cumulative(positions[0])
    await env.drain()
    assert stored_keys(env, ml._prefix) == {"topics": [], "ledgers": [], "entries": [], "cursors": []}
    env.close()


async def test_a_trim_waiting_for_another_does_not_write_after_the_ledgers_deletion(tmp_path):
    env = StorageEnvironment(tmp_path)
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=1, retention_ms=1000))
    positions = [await ml.append(b"m") for _ in range(3)]       # ledgers of one entry each
    snapshots = env.db("tb_snapshots")
    # (as a transaction buffer's: a record of what the trim removes, in its very LMDB write)
    ml.add_trim_writer(lambda first: lambda txn: txn.put(ml._prefix + b"trimmed", b"", db=snapshots))
    first, second = (ml.ledgers[p.ledger_id] for p in positions[:2])
    first.closed_ms, second.closed_ms = 1, 10_000
    trimming = asyncio.ensure_future(ml.trim(now_ms=5_000))        # the first ledger only...
    waiting = asyncio.ensure_future(ml.trim(now_ms=20_000))        # ...this one, the second
    await asyncio.sleep(0)
    await ml.delete()
    assert await trimming == [first.ledger_id]
    with pytest.raises(LedgerClosedError):
        await waiting
    await env.drain()
    with env.read() as txn:
        assert txn.get(ml._prefix + b"trimmed", db=snapshots) is None
    assert stored_keys(env, ml._prefix) == {"topics": [], "ledgers": [], "entries": [], "cursors": []}
    env.close()
