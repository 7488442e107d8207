"""A v5 rewind waiting for its transactions' decisions when the subscription closes (its topic
unloaded or deleted, the broker stopping) ends quietly, and so do the redeliveries queued
behind it.

The subscription's close cancelled the rewind's task. A caller awaiting the rewind (the
embedding API's redeliver_unacknowledged_messages) then got a CancelledError though its own
task was not cancelled; and a rewind cancelled before its task first ran never settled the
redeliveries queued behind it, whose callers waited for ever. Now the rewind's future is
settled whatever becomes of its task: nothing is left to redeliver to a closed subscription."""

from __future__ import annotations

import asyncio

from pyengine.broker import Broker
from tests.broker.test_v5_abort_rewind_reads_the_decision import SEGMENT, acked_cumulatively_in_a_txn


async def rewinds_at_close(broker, *, started: bool) -> list[asyncio.Future]:
    """Two rewinds of an Exclusive consumer whose cumulative ack waits in an open v5 txn (the
    second queued behind the first), then the subscription's close: with `started`, once the
    first rewind's task waits for the decisions; else in the same event-loop turn."""
    consumer, txn = await acked_cumulatively_in_a_txn(broker, "exclusive")
    subscription = broker.service.topics[SEGMENT].subscriptions["s"]
    headers, reading = broker.service.v5.headers, asyncio.Event()
    fresh_read = headers.get

    async def held_read(*args, **kwargs):
        reading.set()
        await asyncio.Event().wait()            # the decisions are never read
        return await fresh_read(*args, **kwargs)

    headers.get = held_read
    rewinds = [subscription.redeliver_unacknowledged(consumer._consumer, epoch=epoch) for epoch in (1, 2)]
    assert all(isinstance(rewind, asyncio.Future) for rewind in rewinds)
    if started:
        await reading.wait()
    await subscription.close()
    del headers.get
    return rewinds


async def test_a_rewind_waiting_at_close_ends_and_so_do_those_behind_it(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        rewinds = await rewinds_at_close(broker, started=True)
        done, _ = await asyncio.wait(rewinds, timeout=2)
        assert len(done) == 2
        assert [rewind.cancelled() for rewind in rewinds] == [False, False]
        assert [rewind.result() for rewind in rewinds] == [None, None]


async def test_a_rewind_closed_before_its_task_ran_settles_those_behind_it(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        rewinds = await rewinds_at_close(broker, started=False)
        done, _ = await asyncio.wait(rewinds, timeout=2)
        assert len(done) == 2, "a redelivery queued behind the rewind still waits after the close"
        assert [rewind.cancelled() for rewind in rewinds] == [False, False]
