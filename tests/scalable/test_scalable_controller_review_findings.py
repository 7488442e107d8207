"""Review findings of the scalable topic controller and its subscription coordinators
(PIP-468, server side): consumer assignment across splits and merges."""

from __future__ import annotations

from pyengine.errors import ServiceNotReadyError
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
