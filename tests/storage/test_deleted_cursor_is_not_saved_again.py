"""A cursor being deleted, or deleted, is never saved again: an ack racing its deletion (a
subscription's consumer, an expiry under way) wrote its record back, so the deleted
subscription came back after a restart; queued in the deletion's own group commit, the save
took the deletion's place under the same key."""

import asyncio

from pyengine.storage import ManagedLedger, StorageEnvironment

TOPIC = "persistent://public/default/t"


async def reopened_cursors(path) -> list[str]:
    """The names of the cursor records stored for the topic."""
    env = StorageEnvironment(path)
    try:
        ml = await ManagedLedger.open(env, TOPIC)
        with env.read() as txn:
            keys = [key for key, _ in txn.cursor(db=env.db("cursors")) if key.startswith(ml._prefix)]
        return [key[len(ml._prefix):].decode() for key in keys]
    finally:
        env.close()


async def test_an_ack_in_the_deletions_group_commit_does_not_bring_the_cursor_back(tmp_path):
    env = StorageEnvironment(tmp_path)
    ml = await ManagedLedger.open(env, TOPIC)
    positions = [await ml.append(b"m") for _ in range(3)]
    cursor = await ml.open_cursor("s", "earliest")
    deleting = asyncio.ensure_future(ml.delete_cursor("s"))
    await asyncio.sleep(0)                      # the deletion is queued, not yet committed
    acked = cursor.ack([positions[1]])          # queued in the same group commit
    await asyncio.gather(deleting, acked)
    await ml.close()
    env.close()
    assert await reopened_cursors(tmp_path) == []


async def test_an_ack_after_the_deletion_does_not_bring_the_cursor_back(tmp_path):
    env = StorageEnvironment(tmp_path)
    ml = await ManagedLedger.open(env, TOPIC)
    positions = [await ml.append(b"m") for _ in range(3)]
    cursor = await ml.open_cursor("s", "earliest")
    await ml.delete_cursor("s")
    await cursor.ack_cumulative(positions[0])
    await ml.close()
    env.close()
    assert await reopened_cursors(tmp_path) == []
