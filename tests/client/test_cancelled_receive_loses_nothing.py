"""A receive cancelled in the loop turn its message arrives (an enclosing timeout fires, the
task is shut down) raises CancelledError and leaves the message in the queue for the next
receive. Python 3.11's asyncio.wait_for ignored such a cancel once its waiter was done: the
cancelled receive took the message and nobody got it (found by an audit)."""

from __future__ import annotations

import asyncio
import re

import pytest

from pyengine.client import ConsumerBatchReceivePolicy, MessageId, pattern

TOPIC = "persistent://public/default/cancelled-receive"


def cancel_on_arrival(consumer, task: list[asyncio.Task]) -> None:
    """Cancel `task[0]` right after a message is queued, before the woken receive runs."""
    push = consumer._push

    def pushing(handler, message) -> None:
        push(handler, message)
        task[0].cancel()
    consumer._push = pushing


RECEIVES = {
    "receive(timeout)": lambda consumer: consumer.receive(timeout=10),
    "receive()": lambda consumer: consumer.receive(),
    "batch_receive()": lambda consumer: consumer.batch_receive(),
}


@pytest.mark.parametrize("receive", list(RECEIVES))
async def test_a_receive_cancelled_as_its_message_arrives_leaves_it_queued(client, receive):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "s", batch_receive_policy=ConsumerBatchReceivePolicy(
        max_num_message=1, timeout_ms=10_000))
    receiving: list[asyncio.Task] = [asyncio.ensure_future(RECEIVES[receive](consumer))]
    await asyncio.sleep(0.05)
    cancel_on_arrival(consumer, receiving)
    await producer.send(b"precious")
    with pytest.raises(asyncio.CancelledError):
        await receiving[0]
    assert (await consumer.receive(timeout=2)).data == b"precious"


async def test_a_read_next_cancelled_as_its_message_arrives_leaves_it_queued(client):
    producer = await client.create_producer(TOPIC)
    reader = await client.create_reader(TOPIC, MessageId.latest)
    reading: list[asyncio.Task] = [asyncio.ensure_future(reader.read_next(timeout=10))]
    await asyncio.sleep(0.05)
    cancel_on_arrival(reader, reading)
    await producer.send(b"precious")
    with pytest.raises(asyncio.CancelledError):
        await reading[0]
    assert (await reader.read_next(timeout=2)).data == b"precious"


async def test_a_multi_topic_receive_cancelled_as_its_message_arrives_leaves_it_buffered(client, monkeypatch):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(re.compile(TOPIC), "s")
    receiving = asyncio.ensure_future(consumer.receive(timeout=10))
    await asyncio.sleep(0.05)
    wake_one = pattern.wake_one

    def waking(waiters) -> None:
        wake_one(waiters)
        receiving.cancel()
    monkeypatch.setattr(pattern, "wake_one", waking)
    await producer.send(b"precious")
    with pytest.raises(asyncio.CancelledError):
        await receiving
    monkeypatch.setattr(pattern, "wake_one", wake_one)
    assert (await consumer.receive(timeout=2)).data == b"precious"
