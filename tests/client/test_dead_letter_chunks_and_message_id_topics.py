"""A chunked message that fails to reach the dead letter topic comes again whole; and the ids of
received messages name their topic (as pulsar-client-cpp's getTopicName), so a consumer of
several topics acknowledges by MessageId."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pyengine.client import Client, ConsumerDeadLetterPolicy, MessageId
from pyengine.client.chunks import ChunkMessageId
from pyengine.client.scalable import _subscription_backlog

from .conftest import NetworkBroker

LIMIT = 10_000
NS = "persistent://public/default"


@pytest.fixture
async def small_client(tmp_path: Path) -> AsyncIterator[Client]:
    """A broker whose max_message_size makes a chunking producer chunk at LIMIT bytes."""
    broker = NetworkBroker(tmp_path / "data", num_coordinators=1, max_message_size=LIMIT)
    await broker.start()
    try:
        async with Client(broker.url, operation_timeout_seconds=10) as network_client:
            yield network_client
    finally:
        await broker.stop()


async def test_a_chunked_message_the_dlq_refused_comes_again_whole(small_client):
    topic = f"{NS}/dlq-chunks"
    consumer = await small_client.subscribe(topic, "sub", consumer_type="shared",
                                            negative_ack_redelivery_delay_ms=0,
                                            dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=1))
    sender = consumer._dead_letter
    dead_lettered: list[bytes] = []

    async def refuse_the_first(consumer_topic, message):
        if not dead_lettered:
            dead_lettered.append(b"")                     # the refused try
            raise ConnectionError("the dead letter topic refused it")
        dead_lettered.append(message.data)

    sender.send = refuse_the_first
    producer = await small_client.create_producer(topic, chunking_enabled=True)
    payload = bytes(i % 251 for i in range(LIMIT * 3))
    sent = await producer.send(payload)
    assert isinstance(sent, ChunkMessageId) and len(sent.chunk_ids) >= 4
    first = await consumer.receive(5)
    await consumer.negative_acknowledge(first)
    last_chance = await consumer.receive(5)              # redelivery_count == max_redeliver_count
    assert last_chance.data == payload and last_chance.redelivery_count == 1
    await consumer.negative_acknowledge(last_chance)     # to the DLQ: refused, so asked for again
    again = await consumer.receive(5)                    # every chunk came again, to the application
    assert again.data == payload and again.redelivery_count == 2
    await consumer.negative_acknowledge(again)           # to the DLQ again: taken this time
    for _ in range(300):
        if len(dead_lettered) == 2:
            break
        await asyncio.sleep(0.01)
    # the message was put together and dead-lettered whole
    assert dead_lettered == [b"", payload]
    for _ in range(100):
        if await _subscription_backlog(consumer, 5) == 0:
            break
        await asyncio.sleep(0.02)
    assert await _subscription_backlog(consumer, 5) == 0          # every chunk acknowledged
    with pytest.raises(TimeoutError):
        await consumer.receive(0.1)


async def test_a_chunked_message_id_names_its_topic(small_client):
    topic = f"{NS}/chunk-topic-name"
    consumer = await small_client.subscribe([topic, f"{NS}/chunk-topic-other"], "sub")
    producer = await small_client.create_producer(topic, chunking_enabled=True)
    await producer.send(b"x" * (LIMIT * 2))
    message = await consumer.receive(5)
    assert isinstance(message.message_id, ChunkMessageId) and message.message_id.topic_name == topic
    await consumer.acknowledge(message.message_id)
    await consumer.redeliver_unacknowledged_messages()
    with pytest.raises(TimeoutError):
        await consumer.receive(0.3)


async def test_a_received_message_id_names_its_topic_but_compares_by_position(client):
    topic = f"{NS}/id-topic"
    producer = await client.create_producer(topic)
    consumer = await client.subscribe(topic, "sub", initial_position="earliest")
    sent = await producer.send(b"a")
    message = await consumer.receive(5)
    received = message.message_id
    assert received.topic_name == topic and sent.topic_name == ""
    assert received == sent and hash(received) == hash(sent)     # the topic is not part of equality
    assert received.serialize() == sent.serialize()               # nor of the wire form
    assert MessageId.deserialize(received.serialize()).topic_name == ""
    assert str(received) == str(sent)


async def test_a_consumer_of_several_topics_acknowledges_by_message_id(client, broker):
    partitioned = f"{NS}/ids-partitioned"
    await broker.service.policies.create_partitioned_topic(partitioned, 2)
    topics = [f"{NS}/ids-plain", partitioned]
    for topic in topics:
        producer = await client.create_producer(topic)
        for i in range(2):
            await producer.send(b"%d" % i, key=f"k{i}")
    consumer = await client.subscribe(topics, "sub", consumer_type="shared", initial_position="earliest",
                                      negative_ack_redelivery_delay_ms=0)
    received = [await consumer.receive(5) for _ in range(4)]
    assert {m.message_id.topic_name for m in received} - {topics[0]} <= {f"{partitioned}-partition-0",
                                                                        f"{partitioned}-partition-1"}
    nacked = received.pop()
    await consumer.negative_acknowledge(nacked.message_id)
    again = await consumer.receive(5)
    assert again.data == nacked.data and again.redelivery_count == 1
    for message in received + [again]:
        await consumer.acknowledge(message.message_id)
    await consumer.redeliver_unacknowledged_messages()
    with pytest.raises(TimeoutError):
        await consumer.receive(0.5)


async def test_a_message_id_without_its_topic_is_refused_by_a_consumer_of_several_topics(client):
    topic = f"{NS}/ids-anonymous"
    producer = await client.create_producer(topic)
    consumer = await client.subscribe([topic, f"{NS}/ids-anonymous-b"], "sub", initial_position="earliest")
    await producer.send(b"a")
    message = await consumer.receive(5)
    for anonymous in (MessageId.deserialize(message.message_id.serialize()),
                      MessageId(message.message_id.ledger_id, message.message_id.entry_id)):
        with pytest.raises(TypeError, match="does not name its topic"):
            await consumer.acknowledge(anonymous)
    with pytest.raises(TypeError, match="Message or MessageId"):
        await consumer.acknowledge(b"not an id")
