"""A consumer that reconnects just as its grace period runs out (spec, Consumer Session
Lifecycle: "If the same consumerName reconnects within the grace period, the timer is
cancelled and the consumer resumes with the same persisted assignment").

The eviction and the reconnect both wait for the coordinator while it is busy (a rebalance
writing to the store, the drain check of a split): the reconnect is answered first with its
segments, and the eviction that queued behind it must not then remove the consumer that is
connected again - else its segments go to another consumer while it keeps reading them."""

import asyncio

from pyengine.scalable.service import scalable_topic_name
from tests.scalable.conftest import TOPIC


async def test_an_eviction_queued_behind_a_reconnect_does_not_evict_it(services):
    a = await services("a", grace_period=0.05)
    await a.create_topic(TOPIC, 2)
    controller = await a.controller(TOPIC)
    pushed = {"c1": [], "c2": []}
    await controller.register_consumer("s", "c1", 1, pushed["c1"].append)
    second = await controller.register_consumer("s", "c2", 2, pushed["c2"].append)
    assert second.segment_ids == [1]
    assert [p.segment_ids for p in pushed["c1"]] == [[0]]
    coordinator = controller.subscriptions["s"]
    controller.consumer_disconnected("s", "c2")

    await coordinator._lock.acquire()                     # the coordinator is busy (a rebalance)
    try:
        resumed = asyncio.ensure_future(controller.register_consumer("s", "c2", 3, pushed["c2"].append))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while not coordinator._tasks:                     # the grace timer fired: eviction queued
            assert loop.time() < deadline, "the grace timer never fired"
            await asyncio.sleep(0.01)
        evictions = list(coordinator._tasks)
    finally:
        coordinator._lock.release()
    assert (await resumed).segment_ids == [1]             # the reconnect keeps its segments
    await asyncio.gather(*evictions)

    assert coordinator.consumers["c2"].connected
    records = await a.resources.consumers(scalable_topic_name(TOPIC), "s")
    assert [(r.consumer_name, r.segment_ids) for r in records] == [("c1", [0]), ("c2", [1])]
    assert [p.segment_ids for p in pushed["c1"]] == [[0]]  # c1 was never handed c2's segment
