"""CONSUMER_STATS_RESPONSE is a response the client's connection expects (the QueueConsumer of a
scalable topic asks a sealed segment's backlog with CONSUMER_STATS): its answer settles the
request, its error is raised, and the connection stays open."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client.scalable import _subscription_backlog
from pyengine.errors import ConsumerNotFoundError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command

TOPIC = "persistent://public/default/stats"


async def test_the_backlog_of_a_subscription_follows_its_acks(client):
    consumer = await client.subscribe(TOPIC, "s", consumer_type="shared")
    producer = await client.create_producer(TOPIC)
    for i in range(3):
        await producer.send(b"m%d" % i)
    assert await _subscription_backlog(consumer, 5) == 3
    messages = [await consumer.receive(5) for _ in range(3)]
    for message in messages[:2]:
        await consumer.acknowledge(message)
    await asyncio.sleep(0)                                     # the acks go out first
    assert await _subscription_backlog(consumer, 5) == 1
    await consumer.acknowledge(messages[2])
    await asyncio.sleep(0)
    assert await _subscription_backlog(consumer, 5) == 0


async def test_a_consumer_stats_error_is_raised_and_the_connection_stays(client):
    consumer = await client.subscribe(TOPIC, "s")
    (handler,) = consumer._handlers.values()
    connection = handler.connection
    cmd = base_command(pb.BaseCommand.CONSUMER_STATS, consumer_id=987654, request_id=connection.new_request_id())
    with pytest.raises(ConsumerNotFoundError):
        await connection.request(cmd, 5)
    assert connection.usable
    assert await _subscription_backlog(consumer, 5) == 0
