"""A nack or an ack timeout of one message of a batch has the broker send the whole entry again:
the batch's messages still in the receiver queue leave it (their permits given back), as the
Java client's removeExpiredMessagesFromQueue drops them, or they would come twice."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import consumer as consumer_module

from .conftest import drain

TOPIC = "persistent://public/default/redelivered-batch"


@pytest.fixture
def short_ack_timeouts(monkeypatch):
    """Pulsar's minimum ack timeout is 10 s: tests lower it (the public check stays)."""
    monkeypatch.setattr(consumer_module, "MIN_UNACKED_MESSAGES_TIMEOUT_MS", 1)


async def _batch_of_three_queued(client, **options):
    consumer = await client.subscribe(TOPIC, "s", consumer_type="shared", **options)
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_publish_delay_ms=50)
    await asyncio.gather(*(producer.send(b"m%d" % i) for i in range(3)))
    for _ in range(100):                        # the whole entry in the receiver queue
        if consumer._queue:
            break
        await asyncio.sleep(0.01)
    return consumer


async def _every_message_once(consumer) -> None:
    received = await drain(consumer, 1.0)
    assert sorted(m.data for m in received) == [b"m0", b"m1", b"m2"]
    for message in received:
        await consumer.acknowledge(message)


async def test_a_nack_of_one_message_of_a_batch(client):
    consumer = await _batch_of_three_queued(client, negative_ack_redelivery_delay_ms=100)
    first = await consumer.receive(5)
    assert first.data == b"m0"
    await consumer.negative_acknowledge(first)
    await asyncio.sleep(0.4)                    # the entry has come again
    await _every_message_once(consumer)


async def test_an_ack_timeout_of_one_message_of_a_batch(client, short_ack_timeouts):
    consumer = await _batch_of_three_queued(client, unacked_messages_timeout_ms=200)
    consumer._unacked.tick_ms = 50              # not part of the API: C++'s tickDurationInMs
    first = await consumer.receive(5)
    assert first.data == b"m0"
    await asyncio.sleep(0.6)                    # m0 timed out, the entry has come again
    await _every_message_once(consumer)
