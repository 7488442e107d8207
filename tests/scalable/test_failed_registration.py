"""A consumer registration that fails (the metadata store refusing a write during its rebalance)
leaves nothing behind: the consumer is not registered, the others keep every segment, and a
registration stored only in part is stored in full by the next rebalance. Before, the refused
consumer stayed registered as connected, with no grace period ever started (its caller forgot
it), and kept segments that nobody read until a leader failover."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.metadata import MetadataStoreError
from tests.scalable.conftest import TOPIC


class FlakyWrites:
    """The resources' save_consumer fails on the listed calls (1-based), then works."""

    def __init__(self, resources, failing: set[int]):
        self.original = resources.save_consumer
        self.failing = failing
        self.calls = 0
        resources.save_consumer = self

    async def __call__(self, topic, subscription, record, **kwargs):
        self.calls += 1
        if self.calls in self.failing:
            raise MetadataStoreError("the metadata store refused the write")
        return await self.original(topic, subscription, record, **kwargs)


async def stored_assignments(service, topic_name) -> dict[str, list[int]]:
    return {r.consumer_name: r.segment_ids for r in await service.resources.consumers(topic_name, "s")}


@pytest.mark.parametrize("failing", [{1}, {2}], ids=["its-own-record", "another-consumers-record"])
async def test_a_refused_registration_leaves_no_phantom_consumer(services, failing):
    service = await services("a", grace_period=0.2)
    await service.create_topic(TOPIC, 4)
    controller = await service.controller(TOPIC)
    pushed: list[list[int]] = []
    assert (await controller.register_consumer("s", "c1", 1, lambda a: pushed.append(a.segment_ids))
            ).segment_ids == [0, 1, 2, 3]
    FlakyWrites(service.resources, failing)
    with pytest.raises(MetadataStoreError):
        await controller.register_consumer("s", "c2", 2, lambda a: None)
    coordinator = controller.subscriptions["s"]
    assert list(coordinator.consumers) == ["c1"]
    assert coordinator.assignment_of("c1").segment_ids == [0, 1, 2, 3]
    assert await stored_assignments(service, controller.topic) == {"c1": [0, 1, 2, 3]}
    # The next consumer shares the segments with c1 alone, and both are stored as assigned.
    c3 = await controller.register_consumer("s", "c3", 3, lambda a: None)
    assert c3.segment_ids == [1, 3] and coordinator.assignment_of("c1").segment_ids == [0, 2]
    assert await stored_assignments(service, controller.topic) == {"c1": [0, 2], "c3": [1, 3]}
    assert pushed[-1] == [0, 2]


async def test_a_failed_restore_of_a_new_subscription_leaves_no_grace_timer_behind(services):
    """A subscription the leader did not restore (its record missing, a consumer's record left)
    is restored on first use; when that fails, its coordinator is closed. Before, it stayed
    unreferenced with the restored session's grace timer, which evicted the session (nobody
    had served it a grace period: it is the next restore's to give)."""
    from pyengine.scalable.resources import ConsumerRecord
    service = await services("a", grace_period=0.2)
    await service.create_topic(TOPIC, 2)
    controller = await service.controller(TOPIC)
    await service.resources.save_consumer(controller.topic, "s", ConsumerRecord("c1", 0, [0, 1]))
    FlakyWrites(service.resources, {1})                 # the restore's rewrite of c1's record
    with pytest.raises(MetadataStoreError):
        await controller.register_consumer("s", "c2", 2, lambda a: None)
    assert "s" not in controller.subscriptions
    await asyncio.sleep(0.4)
    assert await stored_assignments(service, controller.topic) == {"c1": [0, 1]}
