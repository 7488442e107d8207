"""A pattern consumer's rediscovery drops the topics that are gone one after the other; one of
them whose consumer fails for good meanwhile is dropped by its own pump first (found by an
audit): the rediscovery then failed with a KeyError, the rest of its work undone - the
resubscription the pump started for the gone topic went on, and new topics waited a period."""

from __future__ import annotations

import asyncio
import re

from pyengine.client.errors import ConnectError

NS = "persistent://public/default"


async def test_a_gone_topic_dropped_by_its_failed_pump_during_rediscovery(client, monkeypatch):
    topics = [f"{NS}/race-gone-a", f"{NS}/race-gone-b", f"{NS}/race-kept-c"]
    for topic in topics:
        await (await client.create_producer(topic)).close()
    consumer = await client.subscribe(re.compile(f"{NS}/race-.*"), "s", pattern_auto_discovery_period=3600)
    assert consumer.topics == topics
    first, second = consumer._consumers[topics[0]], consumer._consumers[topics[1]]
    closing, release = asyncio.Event(), asyncio.Event()
    close = first.close

    async def slow_close() -> None:
        closing.set()
        await release.wait()
        await close()
    monkeypatch.setattr(first, "close", slow_close)

    async def matching() -> list[str]:
        return [topics[2]]                  # a and b are gone
    monkeypatch.setattr(consumer, "_matching_topics", matching)
    rediscovery = asyncio.ensure_future(consumer._rediscover())
    await asyncio.wait_for(closing.wait(), 5)           # dropping a
    # b's consumer fails for good meanwhile: its pump drops it and starts subscribing it again
    handler = next(iter(second._handlers.values()))
    second._handler_failed(handler, ConnectError("failed for good"))
    async def resubscribing() -> None:
        while topics[1] not in consumer._resubscribing:
            await asyncio.sleep(0.01)
    await asyncio.wait_for(resubscribing(), 5)
    release.set()
    await asyncio.wait_for(rediscovery, 5)              # KeyError before the fix
    assert consumer.topics == [topics[2]]
    assert consumer._resubscribing == {}                # b is gone: not subscribed again
    await consumer.close()
