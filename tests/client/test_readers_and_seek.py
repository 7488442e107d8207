"""Readers, seek by message id and by time, has_message_available."""

import asyncio
import time

from pyengine.client import MessageId

TOPIC = "persistent://public/default/reading"


async def _fill(client, count, **options):
    producer = await client.create_producer(TOPIC, **options)
    return [await producer.send(b"%d" % i) for i in range(count)]


async def test_reader_from_earliest_latest_and_an_id(client):
    ids = await _fill(client, 5)
    earliest = await client.create_reader(TOPIC, MessageId.earliest)
    assert [int((await earliest.read_next(timeout=5)).data) for _ in range(5)] == list(range(5))
    assert not await earliest.has_message_available()

    # As pulsar-client: a reader at an id starts after it unless start-inclusive.
    from_id = await client.create_reader(TOPIC, ids[2])
    assert int((await from_id.read_next(timeout=5)).data) == 3
    inclusive = await client.create_reader(TOPIC, ids[2], start_message_id_inclusive=True)
    assert int((await inclusive.read_next(timeout=5)).data) == 2
    last = await client.create_reader(TOPIC, ids[4])
    assert not await last.has_message_available()

    latest = await client.create_reader(TOPIC, MessageId.latest)
    assert not await latest.has_message_available()
    producer = await client.create_producer(TOPIC)
    await producer.send(b"new")
    assert await latest.has_message_available()
    assert (await latest.read_next(timeout=5)).data == b"new"


async def test_reader_inside_a_batch(client):
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=4,
                                            batching_max_publish_delay_ms=500)
    ids = await asyncio.gather(*(producer.send(b"%d" % i) for i in range(4)))
    reader = await client.create_reader(TOPIC, ids[1], start_message_id_inclusive=False)
    assert [(await reader.read_next(timeout=5)).data for _ in range(2)] == [b"2", b"3"]


async def test_consumer_seek_to_an_id_and_back_to_earliest(client):
    ids = await _fill(client, 6)
    consumer = await client.subscribe(TOPIC, "seeker", initial_position="earliest")
    for _ in range(6):
        await consumer.acknowledge(await consumer.receive(timeout=5))
    await consumer.seek(ids[3])             # as the official clients: a consumer resumes after the id
    assert [int((await consumer.receive(timeout=5)).data) for _ in range(2)] == [4, 5]
    await consumer.seek(MessageId.earliest)
    assert int((await consumer.receive(timeout=5)).data) == 0


async def test_seek_by_publish_time(client):
    await _fill(client, 3)
    await asyncio.sleep(0.05)
    middle = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    producer = await client.create_producer(TOPIC)
    await producer.send(b"after")
    consumer = await client.subscribe(TOPIC, "by-time", initial_position="earliest")
    await consumer.seek(middle)
    assert (await consumer.receive(timeout=5)).data == b"after"


async def test_reader_seek_follows_start_message_id_inclusive(client):
    ids = await _fill(client, 4)
    reader = await client.create_reader(TOPIC, MessageId.earliest)
    assert int((await reader.read_next(timeout=5)).data) == 0
    await reader.seek(ids[2])                # by default (as pulsar-client) after the id
    assert int((await reader.read_next(timeout=5)).data) == 3
    inclusive = await client.create_reader(TOPIC, MessageId.earliest, start_message_id_inclusive=True)
    assert int((await inclusive.read_next(timeout=5)).data) == 0
    await inclusive.seek(ids[2])
    assert int((await inclusive.read_next(timeout=5)).data) == 2
