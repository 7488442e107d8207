"""A rebalance stores (and tells) every consumer giving a segment up before any consumer is
given one. Found by an audit: records were written one consumer after the other, each new
assignment pushed as soon as stored, so when a write failed part-way (the store unreachable)
a consumer already told to read a segment and the consumer not yet told to leave it both
held it until the retry: a split's rebalance had two consumers reading one segment (a
CheckpointConsumer reads with readers: the same messages processed twice)."""

from __future__ import annotations

import asyncio

from pyengine.metadata import MetadataStoreError
from pyengine.scalable.service import scalable_topic_name
from tests.scalable.conftest import TOPIC

NAME = scalable_topic_name(TOPIC)


def overlap(held: dict[str, set[int]]) -> set[int]:
    seen: set[int] = set()
    twice: set[int] = set()
    for segments in held.values():
        twice |= seen & segments
        seen |= segments
    return twice


async def stored(service) -> dict[str, set[int]]:
    return {r.consumer_name: set(r.segment_ids) for r in await service.resources.consumers(NAME, "s")}


async def test_a_rebalance_failing_part_way_never_gives_a_segment_to_two_consumers(services, monkeypatch):
    service = await services("a")
    await service.create_topic(TOPIC, 2)
    controller = await service.controller(TOPIC)
    told: dict[str, set[int]] = {}

    def listener(name):
        def on_assignment(assignment):
            if hasattr(assignment, "segment_ids"):
                told[name] = set(assignment.segment_ids)
        return on_assignment

    for i, name in enumerate(["c1", "c2"]):
        told[name] = set((await controller.register_consumer("s", name, i, listener(name))).segment_ids)
    assert told == {"c1": {0}, "c2": {1}}
    save, snapshots = service.resources.save_consumer, []

    async def flaky(topic, subscription, record, **kwargs):
        # the split's rebalance (children 2 and 3 of segment 0): c1 [2, 1], c2 [3]; c2's first
        # write fails, whenever it comes
        if record.consumer_name == "c2" and not snapshots:
            snapshots.append(({k: set(v) for k, v in told.items()}, await stored(service)))
            raise MetadataStoreError("save_consumer: etcd is unreachable")
        return await save(topic, subscription, record, **kwargs)
    monkeypatch.setattr(service.resources, "save_consumer", flaky)
    # the split is done all the same: its coordinator retries the rebalance
    assert (await controller.split_segment(0)).epoch == 1
    assert snapshots, "the split's rebalance never wrote c2's record"
    pushed, records = snapshots[0]
    assert not overlap(pushed), f"segments told to two consumers at once: {pushed}"
    assert not overlap(records), f"segments stored for two consumers at once: {records}"
    # the failed rebalance is retried (the coordinator's drain watch): the final assignment is
    # stored and told
    for _ in range(100):
        if await stored(service) == {"c1": {1, 2}, "c2": {3}}:
            break
        await asyncio.sleep(0.05)
    assert await stored(service) == {"c1": {1, 2}, "c2": {3}}
    assert told == {"c1": {1, 2}, "c2": {3}}
