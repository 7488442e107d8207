"""Review findings of the scalable topic controller and its subscription coordinators
(PIP-468, server side): consumer assignment across splits and merges."""

from __future__ import annotations

import asyncio

from pyengine.errors import ServiceNotReadyError
from tests.broker.helpers import drain
from tests.scalable.conftest import TOPIC

PARENT = "segment://public/default/orders/0000-ffff-0"


async def test_a_drained_parent_whose_broker_is_down_holds_up_no_rebalance(services):
    """The drain gate asked a sealed parent's broker for its backlog at every rebalance, long
    after the parent was found drained (a sealed segment takes no more messages: drained, it
    stays so). With that broker down, every rebalance failed: a consumer joining was refused,
    and a split of an active segment reported a failure after its layout was stored. A parent
    found drained is now remembered and not asked again."""
    a = await services("a", grace_period=5)
    await a.create_topic(TOPIC, 1)
    controller = await a.controller(TOPIC)
    assert (await controller.register_consumer("s", "c1")).segment_ids == [0]
    await controller.split_segment(0)                   # nothing written: drained at once
    assert controller.subscriptions["s"].assignment_of("c1").segment_ids == [1, 2]
    stats = a.segments.stats

    async def stats_unless_down(segment):
        if segment == PARENT:
            raise ServiceNotReadyError("the sealed parent's broker is down")
        return await stats(segment)

    a.segments.stats = stats_unless_down
    assert (await controller.register_consumer("s", "c2")).segment_ids == [2]
    assert controller.subscriptions["s"].assignment_of("c1").segment_ids == [1]
    layout = await controller.split_segment(1)
    assert layout.epoch == 2
    assert await a.resources.pending_operation(controller.topic) is None
    coordinator = controller.subscriptions["s"]
    assigned = coordinator.assignment_of("c1").segment_ids + coordinator.assignment_of("c2").segment_ids
    assert sorted(assigned) == [2, 3, 4]


async def test_a_split_whose_rebalance_fails_is_done_and_every_subscription_hears_of_it(broker, services):
    """Step 5 (notify) ran the subscriptions' rebalances one after the other and gave up at
    the first that failed (here: the sealed parent's broker went down once it was terminated,
    so its backlog could not be read). The split, whose layout was stored, was then reported
    failed, stayed pending (so every later split, merge or subscription change failed until
    that broker was back), and the subscriptions after the failing one never got the new
    layout. A failing rebalance now stays with its coordinator, which has the layout and
    retries it, and the split completes."""
    a = await services("a", grace_period=5)
    await a.create_topic(TOPIC, 2)
    controller = await a.controller(TOPIC)
    await controller.register_consumer("s1", "c1")
    await controller.register_consumer("s2", "c2")
    parent = "segment://public/default/orders/0000-7fff-0"
    producer = await broker.create_producer(parent)
    await producer.send(b"m", key="k")
    stats, terminate = a.segments.stats, a.segments.terminate
    down = False

    async def stats_unless_down(segment):
        if down and segment == parent:
            raise ServiceNotReadyError("the parent's broker is down")
        return await stats(segment)

    async def terminate_then_go_down(segment):
        nonlocal down
        await terminate(segment)
        down = True

    a.segments.stats, a.segments.terminate = stats_unless_down, terminate_then_go_down
    assert (await controller.split_segment(0)).epoch == 1
    assert await a.resources.pending_operation(controller.topic) is None
    assert [c.layout.epoch for c in controller.subscriptions.values()] == [1, 1]
    assert (await controller.split_segment(1)).epoch == 2           # the topic goes on
    down = False                                                    # back: the rebalances retried
    for subscription in ("s1", "s2"):
        consumer = await broker.subscribe(parent, subscription, initial_position="earliest")
        for message in await drain(consumer):
            await consumer.acknowledge(message)
        await consumer.close()
    coordinators = controller.subscriptions
    for _ in range(100):
        if all(sorted(coordinators[s].assignment_of(c).segment_ids) == [2, 3, 4, 5]
               for s, c in (("s1", "c1"), ("s2", "c2"))):
            break
        await asyncio.sleep(0.05)
    assert sorted(coordinators["s1"].assignment_of("c1").segment_ids) == [2, 3, 4, 5]
    assert sorted(coordinators["s2"].assignment_of("c2").segment_ids) == [2, 3, 4, 5]
