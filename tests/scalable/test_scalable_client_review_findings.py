"""Findings of a review of the scalable topics' client (pyengine.client.scalable)."""

from __future__ import annotations

import asyncio

import pytest

T = "topic://public/default/orders"


async def test_a_poll_with_no_time_left_takes_a_queued_message(client, service):
    """receive(timeout=0) of a QueueConsumer or a StreamConsumer raised TimeoutError with a
    message queued (asyncio.wait_for with 0 cancels the queue's get before it runs): a polling
    loop never got anything. Consumer.receive(timeout=0) hands out what is queued."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    queue = await client.subscribe_queue(T, "q")
    stream = await client.subscribe_stream(T, "s", "c")
    await producer.send(b"m", key="k")
    for consumer in (queue, stream):
        for _ in range(100):                       # until the segment consumer queued it
            if not consumer._queue.empty():
                break
            await asyncio.sleep(0.02)
        assert (await consumer.receive(0)).data == b"m"
        with pytest.raises(TimeoutError):
            await consumer.receive(0)
    await producer.close()


@pytest.mark.parametrize("key", [-1, 3, 1.5, b"k", ["k"]])
async def test_a_key_that_is_no_string_is_refused_before_it_is_routed(client, service, key):
    """A ScalableProducer hashed the key before any check (bytes(key) of whatever it was): an
    int key was hashed as that many zero bytes (key=10**12: a 1 TB allocation) and then
    refused by the segment's producer, a negative one raised ValueError("negative count"), a
    list "'str' object cannot be interpreted as an integer". Now TypeError, as a Producer's,
    before anything is opened."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    with pytest.raises(TypeError, match="key must be a string"):
        await producer.send(b"m", key=key)
    assert producer._producers == {}                 # no segment producer opened for it
    await producer.close()


@pytest.mark.parametrize("size, error", [(0, ValueError), ("10", TypeError)])
async def test_a_bad_receiver_queue_size_of_a_stream_consumer_is_refused_at_once(client, service, size, error):
    """subscribe_stream passed receiver_queue_size on to each segment's subscribe, unchecked: a
    consumer assigned no segment yet (the only one is another consumer's) was registered with
    it, and each later assignment then failed to subscribe, logged and retried for good."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    first = await client.subscribe_stream(T, "s", "c1")
    with pytest.raises(error, match="receiver_queue_size"):
        await client.subscribe_stream(T, "s", "c2", receiver_queue_size=size)
    with pytest.raises(error, match="receiver_queue_size"):
        await client.subscribe_queue(T, "q", receiver_queue_size=size)
    controller = await scalable.leader(T)
    consumers = (await controller.stats())["subscriptions"]["s"]["consumers"]
    assert [c["consumerName"] for c in consumers] == ["c1"]     # nothing registered for c2
    await first.close()
