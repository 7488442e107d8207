"""Review findings on the broker's topic lifecycle (loading, unloading, deleting topics)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from pyengine.broker import Broker
from tests.broker.test_embedded_retries_on_a_closed_topic import hold_deletion

T = "persistent://public/default/lifecycle"


async def test_a_deletion_meeting_an_unload_under_way_is_not_loaded_again_before_it_is_written(tmp_path, monkeypatch):
    """A deletion asked while the topic's unload was closing it waited for that close, then the
    unload forgot the topic while the deletion was not written yet: the next use loaded it again
    from storage, and the deletion then removed the storage under the loaded topic (what it took
    afterwards was acknowledged, then gone). The topic stays known, closed, until its deletion
    is written, as when no unload came first."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        service = broker.service
        await (await broker.create_producer(T)).send(b"m")
        topic = service.topics[T]
        closing, finish = asyncio.Event(), asyncio.Event()
        close = topic.compaction.close

        async def held_close():
            closing.set()
            await finish.wait()
            await close()

        monkeypatch.setattr(topic.compaction, "close", held_close)
        unloading = asyncio.ensure_future(service.unload_topic(T))
        await closing.wait()
        deleted, release = hold_deletion(monkeypatch)
        deleting = asyncio.ensure_future(service.delete_topic(T))
        await asyncio.sleep(0)
        finish.set()
        await deleted.wait()
        await unloading
        # The deletion is not written yet: the topic is refused, not loaded again from storage.
        assert service.topics.get(T) is topic and topic.closed
        release.set()
        await deleting
        assert T not in service.topics and not service.topic_exists(T)


@pytest.mark.parametrize("level", ["topic", "namespace"])
async def test_a_policy_change_whose_caller_stopped_waiting_applies_to_the_loaded_topics(tmp_path, level):
    """A policy change was applied to the loaded topics after its write, by its caller: one
    cancelled meanwhile (a timeout around it) was stored and in force for topics loaded later,
    while the loaded ones kept the old policy (here de-duplication off) until reloaded."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        service = broker.service
        await (await broker.create_producer(T)).send(b"m")
        topic = service.topics[T]
        assert not topic.dedup.enabled
        if level == "topic":
            change = service.policies.set_topic_policy(T, "deduplicationEnabled", True)
        else:
            policies = replace(service.policies.policies("public/default"), deduplication_enabled=True)
            change = service.policies.set_policies("public/default", policies)
        changing = asyncio.ensure_future(change)
        await asyncio.sleep(0)
        changing.cancel()
        await service.env.barrier()
        await asyncio.sleep(0.05)
        assert service.policies.deduplication_enabled(T)           # stored
        assert topic.dedup.enabled                                  # and applied
