"""A reader created at MessageId.latest with start_message_id_inclusive: as the Java and C++
clients, its has_message_available (nothing read yet) moves it to the topic's last message,
answers whether there is one, and that message is read next. Found by an audit: it answered
False and the last message was never read."""

from __future__ import annotations

import asyncio

from pyengine.client import MessageId

T = "persistent://public/default/reader-latest-inclusive"


async def test_the_last_message_is_available_and_read(client):
    producer = await client.create_producer(T)
    for i in range(3):
        await producer.send(b"%d" % i)
    reader = await client.create_reader(T, MessageId.latest, start_message_id_inclusive=True)
    assert await reader.has_message_available()
    assert (await reader.read_next(timeout=5)).data == b"2"
    assert not await reader.has_message_available()
    await producer.send(b"3")
    assert (await reader.read_next(timeout=5)).data == b"3"


async def test_the_last_message_of_a_batch_alone_is_read(client):
    producer = await client.create_producer(T, batching_enabled=True, batching_max_publish_delay_ms=50)
    ids = await asyncio.gather(*(producer.send(b"%d" % i) for i in range(4)))
    assert len({(m.ledger_id, m.entry_id) for m in ids}) == 1            # one batch entry
    reader = await client.create_reader(T, MessageId.latest, start_message_id_inclusive=True)
    assert await reader.has_message_available()
    assert (await reader.read_next(timeout=5)).data == b"3"
    assert not await reader.has_message_available()


async def test_an_empty_topic_has_nothing_available(client):
    reader = await client.create_reader(T, MessageId.latest, start_message_id_inclusive=True)
    assert not await reader.has_message_available()
    producer = await client.create_producer(T)
    await producer.send(b"first")
    assert (await reader.read_next(timeout=5)).data == b"first"


async def test_without_inclusive_the_last_message_is_not_read(client):
    producer = await client.create_producer(T)
    await producer.send(b"old")
    reader = await client.create_reader(T, MessageId.latest)
    assert not await reader.has_message_available()
    await producer.send(b"new")
    assert await reader.has_message_available()
    assert (await reader.read_next(timeout=5)).data == b"new"
