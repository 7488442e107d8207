"""A reader reconnecting resumes at the first message it has not handed out, as Java's
ConsumerImpl.clearReceiverQueue: the first queued one (inclusive), else after the last handed
out. One that had handed out nothing resubscribed at its configured start: started at latest
(or sought by time), the messages queued before the reconnect were lost."""

from __future__ import annotations

import asyncio

from pyengine.client import Client
from pyengine.client.message import MessageId

T = "persistent://public/default/reader-resumes-at-its-first-queued"


async def queued(reader, count: int) -> None:
    (handler,) = reader._handlers.values()
    for _ in range(500):
        if handler.queued >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{handler.queued} queued, not {count}")


async def restarted(broker, reader) -> None:
    """Restart the broker and wait until the reader has subscribed again."""
    (handler,) = reader._handlers.values()
    generation = handler.generation
    await broker.restart()
    for _ in range(1000):
        if handler.generation != generation and handler.state == "ready":
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the reader never subscribed again")


async def read_all(reader, timeout: float = 1.0) -> list[bytes]:
    got = []
    while True:
        try:
            got.append((await reader.read_next(timeout=timeout)).data)
        except TimeoutError:
            return got


async def test_a_reader_started_at_latest_keeps_its_queued_messages_across_a_reconnect(broker):
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        producer = await client.create_producer(T)
        await producer.send(b"before")
        reader = await client.create_reader(T, MessageId.latest)
        for i in range(3):
            await producer.send(b"m%d" % i)
        await queued(reader, 3)                 # queued, none handed out
        await restarted(broker, reader)
        assert await read_all(reader) == [b"m0", b"m1", b"m2"]


async def test_a_reader_sought_by_time_keeps_its_queued_messages_across_a_reconnect(broker):
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        producer = await client.create_producer(T)
        for i in range(3):
            await producer.send(b"m%d" % i)
        reader = await client.create_reader(T, MessageId.latest)
        await reader.seek(0)                    # by publish time: everything
        await queued(reader, 3)
        await restarted(broker, reader)
        assert await read_all(reader) == [b"m0", b"m1", b"m2"]


async def test_a_reader_resumes_at_its_first_queued_message_after_what_it_handed_out(broker):
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        producer = await client.create_producer(T)
        for i in range(4):
            await producer.send(b"m%d" % i)
        reader = await client.create_reader(T, MessageId.earliest, start_message_id_inclusive=True)
        assert (await reader.read_next(timeout=5)).data == b"m0"
        await queued(reader, 3)
        await restarted(broker, reader)
        assert await read_all(reader) == [b"m1", b"m2", b"m3"]
