"""Producing and consuming over the network: ids, keys, properties, queues and permits."""

import asyncio

import pytest

from pyengine.client import Client, MessageId

TOPIC = "persistent://public/default/plain"


async def test_send_returns_ids_and_a_consumer_gets_everything_in_order(client):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "sub", initial_position="earliest")
    ids = [await producer.send(f"m-{i}".encode(), key=f"k{i}", properties={"i": str(i)}, event_time=1000 + i)
           for i in range(20)]
    assert ids == sorted(ids) and len(set(ids)) == 20
    for i in range(20):
        message = await consumer.receive(timeout=5)
        assert message.data == f"m-{i}".encode()
        assert message.message_id == ids[i]
        assert message.partition_key == f"k{i}" and message.properties == {"i": str(i)}
        assert message.event_time == 1000 + i and message.sequence_id == i
        assert message.producer_name == producer.producer_name
        await consumer.acknowledge(message)
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.1)


async def test_a_small_receiver_queue_is_refilled_by_flow(client):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "small", initial_position="earliest", receiver_queue_size=2)
    for i in range(25):
        producer.send_async(b"%d" % i)
    await producer.flush()
    got = [int((await consumer.receive(timeout=5)).data) for _ in range(25)]
    assert got == list(range(25))


async def test_acknowledged_messages_are_not_delivered_again(broker, client):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "acks", initial_position="earliest")
    for i in range(6):
        await producer.send(b"%d" % i)
    for i in range(3):
        await consumer.acknowledge(await consumer.receive(timeout=5))
    await consumer.close()
    again = await client.subscribe(TOPIC, "acks")
    assert [int((await again.receive(timeout=5)).data) for _ in range(3)] == [3, 4, 5]


async def test_send_async_calls_back_and_keeps_order(client):
    producer = await client.create_producer(TOPIC)
    settled = []
    futures = [producer.send_async(b"%d" % i, lambda error, mid: settled.append((error, mid))) for i in range(50)]
    ids = await asyncio.gather(*futures)
    assert ids == sorted(ids)
    assert [mid for _, mid in settled] == ids and all(error is None for error, _ in settled)


async def test_the_default_initial_position_is_latest(client):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"before")
    consumer = await client.subscribe(TOPIC, "late")
    await producer.send(b"after")
    assert (await consumer.receive(timeout=5)).data == b"after"


async def test_a_reopened_producer_continues_its_sequence(broker, client):
    # The broker remembers producers' sequence ids with de-duplication on (as Apache's).
    await broker.service.policies.set_topic_policy(TOPIC, "deduplicationEnabled", True)
    broker.service.refresh_policies()
    producer = await client.create_producer(TOPIC, producer_name="named")
    for _ in range(3):
        await producer.send(b"x")
    await producer.close()
    again = await client.create_producer(TOPIC, producer_name="named")
    assert again.last_sequence_id == 2
    await again.send(b"y")
    assert again.last_sequence_id == 3


async def test_last_sequence_id_starts_at_the_initial_sequence_id(client):
    """As Java's ProducerImpl (lastSequenceIdPublished = initialSequenceId) and the embedded
    API: before, it was -1 until the first receipt (found by a differential audit)."""
    producer = await client.create_producer(TOPIC, initial_sequence_id=10)
    assert producer.last_sequence_id == 10
    await producer.send(b"x")
    assert producer.last_sequence_id == 11
    assert (await client.create_producer(TOPIC)).last_sequence_id == -1


async def test_two_clients_share_a_broker(broker):
    async with Client(broker.url) as first, Client(broker.url) as second:
        producer = await first.create_producer(TOPIC)
        consumer = await second.subscribe(TOPIC, "other", initial_position="earliest")
        sent = await producer.send(b"hello")
        message = await consumer.receive(timeout=5)
        assert message.message_id == sent and message.value() == b"hello"


async def test_get_last_message_id(client):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "last")
    assert (await consumer.get_last_message_id()).entry_id < 0
    sent = [await producer.send(b"x") for _ in range(3)]
    last = await consumer.get_last_message_id()
    assert (last.ledger_id, last.entry_id) == (sent[-1].ledger_id, sent[-1].entry_id)


async def test_unsubscribe_drops_the_subscription(client):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "gone", initial_position="earliest")
    await producer.send(b"1")
    await consumer.unsubscribe()
    again = await client.subscribe(TOPIC, "gone", initial_position="latest")
    await producer.send(b"2")
    assert (await again.receive(timeout=5)).data == b"2"


async def test_message_id_round_trips_through_serialize(client):
    producer = await client.create_producer(TOPIC)
    sent = await producer.send(b"x")
    assert MessageId.deserialize(sent.serialize()) == sent
