"""A long-running coordinator's memory follows the live txns, not every txn it ever handed out
(found by an audit): the heap of live sequences behind `low_watermark` dropped ended txns only
from its top, so every txn ended while an older one stayed open (a long transaction timeout,
Flink's 3 h) — or on a coordinator whose watermark nobody asked for — stayed in it for good."""

from __future__ import annotations

from pyengine.transaction import TxnStatus
from tests.transaction.coordinator.test_log_store import drive_to, open_store

S = TxnStatus


async def test_ended_txns_leave_the_live_heap_behind_a_long_lived_one(env, clock):
    store = await open_store(env, clock)
    oldest = await drive_to(store, S.OPEN)          # stays open throughout
    for _ in range(300):
        await drive_to(store, S.COMMITTED)
        assert store.low_watermark() == oldest.least_bits - 1
    assert len(store._live) == 1
    assert len(store._live_heap) <= 2 * len(store._live) + 64
    await store.close()


async def test_ended_txns_leave_the_live_heap_when_no_watermark_is_asked(env, clock):
    store = await open_store(env, clock)
    for _ in range(300):
        await drive_to(store, S.ABORTED)            # no participant: nobody asks for the watermark
    assert not store._live
    assert len(store._live_heap) <= 64
    assert store.low_watermark() == 299
    await store.close()
