"""Deleting a scalable topic's subscription (or the topic) unregisters its consumers first
(PIP-468's admin API: "The controller unregisters all consumers and deletes the subscription
from every segment"). Before, they were not told: their segment consumers subscribed again
when the segments' subscriptions were deleted and read everything, acknowledged or not, a
second time, and the segments had the subscription the metadata no longer listed."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import SubscriptionNotFoundError

T = "topic://public/default/orders"


async def segment_subscriptions(service) -> dict[str, list[str]]:
    return {t: sorted((await service.get_topic(t)).subscriptions) for t in service.list_topics()
            if t.startswith("segment://")}


@pytest.mark.parametrize("kind", ["stream", "checkpoint"])
async def test_the_consumers_of_a_deleted_subscription_stop_and_read_nothing_again(client, service, kind):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    producer = await client.create_producer(T)
    for i in range(10):
        await producer.send(b"m%d" % i, key=f"k{i}")
    if kind == "stream":
        consumer = await client.subscribe_stream(T, "s", "c1")
    else:
        consumer = await client.subscribe_checkpoint(T, "s", "c1")
    for _ in range(10):
        message = await consumer.receive(5)
        if kind == "stream":
            await consumer.acknowledge(message)
    controller = await scalable.leader(T)
    await controller.delete_subscription("s")
    with pytest.raises(SubscriptionNotFoundError, match="was deleted"):
        await consumer.receive(5)
    with pytest.raises(SubscriptionNotFoundError):
        await consumer.receive(1)                       # and every receive after it
    await asyncio.sleep(0.5)                            # what a segment consumer's reconnect would take
    assert await scalable.resources.subscriptions(controller.topic) == []
    assert all(subs == [] for subs in (await segment_subscriptions(service)).values())
    await consumer.close()


async def test_the_consumers_of_a_deleted_topic_stop(client, service):
    from pyengine.errors import TopicNotFoundError

    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    consumer = await client.subscribe_stream(T, "s", "c1")
    await scalable.delete_topic(T)
    with pytest.raises(TopicNotFoundError, match="was deleted"):
        await consumer.receive(5)
    await consumer.close()
