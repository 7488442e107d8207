"""Deleting a topic leaves nothing of it in the broker's policy cache (found by an audit): the
cache kept an entry for its topic-level policies (None) and one for "not partitioned" per topic
ever deleted, so a process creating and deleting topics grew without bound. (The schema
registry's cache and locks still keep one entry per deleted topic: pyengine/schema, reported.)"""

from __future__ import annotations

from pyengine.broker import Broker


async def test_topics_created_and_deleted_leave_the_policy_cache_as_it_was(tmp_path):
    async with Broker.embedded(tmp_path / "data", sync=False) as client:
        service = client.service

        async def cycle(first: int, count: int) -> None:
            for i in range(first, first + count):
                topic = f"persistent://public/default/churn-{i}"
                producer = await client.create_producer(topic)
                await producer.send(b"m")
                await producer.close()
                await service.delete_topic(topic)

        await cycle(0, 5)
        size = len(service.policies._cache)
        await cycle(5, 100)
        assert len(service.policies._cache) == size
        assert not [key for key in service.policies._cache if "churn-" in key]
