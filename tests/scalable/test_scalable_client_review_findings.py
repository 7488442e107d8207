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
