"""Concurrent opens of one new cursor share one cursor object. Found by an audit: each made
its own, the ledger kept the last; acknowledgements made through the other were durable, yet
the one kept wrote its own state over them at close, so they were lost after a clean
restart."""

import asyncio

from pyengine.storage import ManagedLedger, StorageEnvironment

TOPIC = "persistent://public/default/c"


async def test_concurrent_opens_share_one_cursor_and_its_acks_survive_a_restart(tmp_path):
    env = StorageEnvironment(tmp_path)
    ml = await ManagedLedger.open(env, TOPIC)
    positions = [await ml.append(b"x") for _ in range(5)]
    first, second = await asyncio.gather(ml.open_cursor("s", "earliest"), ml.open_cursor("s", "earliest"))
    assert first is second is ml.cursors["s"]
    await first.ack(positions)
    await ml.close()
    await env.drain()
    env.close()

    env = StorageEnvironment(tmp_path)
    ml = await ManagedLedger.open(env, TOPIC)
    cursor = await ml.open_cursor("s", "earliest")
    assert cursor.mark_delete == positions[-1] and cursor.backlog() == 0
    await ml.close()
    env.close()


async def test_a_cancelled_open_still_opens_for_the_others(tmp_path):
    env = StorageEnvironment(tmp_path)
    ml = await ManagedLedger.open(env, TOPIC)
    cancelled = asyncio.ensure_future(ml.open_cursor("s"))
    other = asyncio.ensure_future(ml.open_cursor("s"))
    await asyncio.sleep(0)
    cancelled.cancel()
    assert (await other) is ml.cursors["s"]
    assert cancelled.cancelled()
    await ml.close()
    env.close()
