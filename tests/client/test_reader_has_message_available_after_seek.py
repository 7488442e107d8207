"""A reader's has_message_available after a seek by publish time, as the C++ client answers it:
the seek's time names no message, so until something is read the answer comes from the
broker (the subscription's mark-delete position against the topic's last message). Found by
an audit: it answered True whatever the time, as if the reader were at the topic's start, and
a read_next after it then waited for nothing."""

from __future__ import annotations

import asyncio
import time

from pyengine.client import MessageId

T = "persistent://public/default/reader-seek-by-time"


async def test_nothing_is_available_after_a_seek_past_the_last_message(client):
    producer = await client.create_producer(T)
    for i in range(3):
        await producer.send(b"%d" % i)
    reader = await client.create_reader(T, MessageId.earliest)
    await reader.seek(int(time.time() * 1000) + 3_600_000)
    assert not await reader.has_message_available()
    await producer.send(b"later")
    assert await reader.has_message_available()
    assert (await reader.read_next(timeout=5)).data == b"later"
    assert not await reader.has_message_available()


async def test_what_follows_a_seek_by_time_is_available(client):
    producer = await client.create_producer(T)
    await producer.send(b"before")
    await asyncio.sleep(0.05)
    middle = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    await producer.send(b"after")
    reader = await client.create_reader(T, MessageId.earliest, start_message_id_inclusive=True)
    await reader.seek(middle)
    assert await reader.has_message_available()
    assert (await reader.read_next(timeout=5)).data == b"after"
    assert not await reader.has_message_available()
