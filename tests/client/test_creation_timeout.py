"""A producer or consumer whose creation the client gives up on (no answer within the
operation timeout) is closed on the broker too: the client sends CLOSE_PRODUCER /
CLOSE_CONSUMER on the connection it keeps using (as the C++ and Java clients do), so what
the broker creates late holds no exclusive subscription or topic for a client that was told
it failed."""

import asyncio

import pytest

from pyengine.client import Client
from pyengine.protocol.connection import ServerConnection

TOPIC = "persistent://public/default/creation-timeout"


@pytest.fixture
def slow_creations(monkeypatch):
    """PRODUCER and SUBSCRIBE are handled by the broker only once the returned event is set."""
    release = asyncio.Event()
    subscribe, create_producer = ServerConnection._subscribe, ServerConnection._create_producer

    async def slow_subscribe(self, *args):
        await release.wait()
        await subscribe(self, *args)

    async def slow_create_producer(self, *args):
        await release.wait()
        await create_producer(self, *args)

    monkeypatch.setattr(ServerConnection, "_subscribe", slow_subscribe)
    monkeypatch.setattr(ServerConnection, "_create_producer", slow_create_producer)
    return release


async def _settled(broker) -> None:
    """Until the broker has finished every request of its connections."""
    for connection in list(broker.server.connections):
        await connection.wait_for_tasks()


async def test_a_subscribe_given_up_leaves_no_consumer_on_the_broker(broker, slow_creations):
    async with Client(broker.url, operation_timeout_seconds=0.5) as client:
        with pytest.raises(TimeoutError):
            await client.subscribe(TOPIC, "exclusive-sub", consumer_type="exclusive")
        slow_creations.set()
        await _settled(broker)
        topic = broker.service.topics[TOPIC]
        assert not topic.subscriptions["exclusive-sub"].consumers
        # The same client subscribes again: the subscription is free.
        consumer = await client.subscribe(TOPIC, "exclusive-sub", consumer_type="exclusive")
        await consumer.close()


async def test_a_producer_given_up_leaves_no_producer_on_the_broker(broker, slow_creations):
    async with Client(broker.url, operation_timeout_seconds=0.5) as client:
        with pytest.raises(TimeoutError):
            await client.create_producer(TOPIC, producer_name="given-up")
        slow_creations.set()
        await _settled(broker)
        assert not broker.service.topics[TOPIC].producers
        producer = await client.create_producer(TOPIC, producer_name="given-up")
        assert (await producer.send(b"x")).entry_id >= 0
