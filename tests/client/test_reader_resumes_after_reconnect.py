"""A reader resumes where it was after a reconnect: nothing it handed out comes again, nothing
after its start (a message id or a seek by publish time) is skipped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pyengine.client import Client
from pyengine.client.message import MessageId

from .conftest import NetworkBroker
from .test_queued_messages_across_a_resubscribe import read_all, resubscribed

LIMIT = 10_000


@pytest.fixture
async def small_broker(tmp_path: Path) -> AsyncIterator[NetworkBroker]:
    async with NetworkBroker(tmp_path / "data", num_coordinators=1, max_message_size=LIMIT) as network_broker:
        yield network_broker


def _payload(size: int) -> bytes:
    return bytes(i * 7 % 251 for i in range(size))


async def _ready_again(handler) -> None:
    """Wait until the reader is subscribed (the broker closes it for a seek: it subscribes again)."""
    for _ in range(500):
        if handler.state == "ready" and handler.connection is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the reader never subscribed again")


@pytest.mark.parametrize("completed_before_reconnect", [False, True])
async def test_reader_reconnect_around_a_chunked_message_does_not_repeat_what_it_read(small_broker,
                                                                                        completed_before_reconnect):
    """Entries: [A chunk 0] [B] [A chunk 1..]. The reader hands out B, then reconnects while A is
    still being put together (or is complete and queued, not handed out): it resubscribes at A's
    first chunk (inclusive), and B, already read, comes again."""
    topic = "persistent://public/default/reader-chunk-reconnect"
    async with Client(small_broker.url, operation_timeout_seconds=10) as producing, \
            Client(small_broker.url, operation_timeout_seconds=10) as reading:
        reader = await reading.create_reader(topic, MessageId.earliest)
        chunker = await producing.create_producer(topic, chunking_enabled=True, producer_name="a")
        plain = await producing.create_producer(topic, producer_name="b")
        (partition,) = chunker._partitions
        enqueue = partition._enqueue
        held = []
        sent = []

        def first_chunk_only(op, messages, gate=None):
            if not sent:
                sent.append(op)
                enqueue(op, messages, gate)
            else:
                held.append((op, messages, gate))

        partition._enqueue = first_chunk_only
        big = _payload(LIMIT * 3)
        pending = chunker.send_async(big)
        await asyncio.sleep(0.1)
        partition._enqueue = enqueue
        assert held
        await plain.send(b"b")
        assert (await reader.read_next(timeout=5)).data == b"b"
        (handler,) = reader._handlers.values()
        assert handler._chunks is not None and len(handler._chunks) == 1
        if completed_before_reconnect:
            for op, messages, gate in held:
                enqueue(op, messages, gate)
            await asyncio.wait_for(pending, 5)
            for _ in range(500):
                if handler.queued:
                    break
                await asyncio.sleep(0.01)
            assert handler.queued == 1
        generation = handler.generation
        handler.connection.close()
        await resubscribed(handler, generation)
        if not completed_before_reconnect:
            for op, messages, gate in held:
                enqueue(op, messages, gate)
            await asyncio.wait_for(pending, 5)
        assert await read_all(reader) == [big]


async def _three_sent_and_a_reader_at_latest(client: Client, topic: str):
    producer = await client.create_producer(topic)
    for i in range(3):
        await producer.send(b"m%d" % i)
    reader = await client.create_reader(topic, MessageId.latest)
    (handler,) = reader._handlers.values()
    return reader, handler


async def test_a_reader_sought_by_time_that_reconnects_before_anything_arrives_still_reads_from_that_time(broker):
    """seek(publish time) moves the broker's cursor; the reader's own start becomes None. If the
    connection drops before the first message arrives (nothing queued, nothing handed out), the
    reader subscribes again with no start id: the broker puts it at the reader's initial position
    (latest), and everything after the sought time is skipped."""
    topic = "persistent://public/default/reader-seek-time-reconnect"
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        reader, handler = await _three_sent_and_a_reader_at_latest(client, topic)
        # (the messages are on their way: no FLOW reaches the broker until the reconnect)
        flow = handler._flow
        handler._flow = lambda permits: None
        await reader.seek(0)                        # by publish time: everything
        await _ready_again(handler)                 # the broker closes the consumer on a seek
        assert handler.queued == 0 and handler.last_dequeued is None
        generation = handler.generation
        handler._flow = flow
        handler.connection.close()                  # the connection drops before any message came
        await resubscribed(handler, generation)
        assert await read_all(reader) == [b"m0", b"m1", b"m2"]


async def test_a_reader_seeks_by_time_once_when_the_broker_keeps_its_subscription(broker):
    """The broker closes a reader for its seek and keeps the moved subscription for it: the
    SUBSCRIBE that follows finds it, and the reader must not seek again (each seek closes it
    once more: it would seek for ever). After a lost connection it seeks once more, then reads."""
    topic = "persistent://public/default/reader-seek-time-once"
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        reader, handler = await _three_sent_and_a_reader_at_latest(client, topic)
        seeks = []
        seek = handler.seek

        async def counted_seek(target):
            seeks.append(target)
            await seek(target)

        handler.seek = counted_seek
        await reader.seek(0)
        assert (await reader.read_next(timeout=5)).data == b"m0"
        await asyncio.sleep(0.3)
        assert seeks == [0]
        await reader.seek(0)                        # again, then the connection drops
        await _ready_again(handler)
        generation = handler.generation
        handler.connection.close()
        await resubscribed(handler, generation)
        got = await read_all(reader)
        assert seeks in ([0, 0], [0, 0, 0]), seeks  # the second's re-seek only when nothing came first
        assert got == [b"m0", b"m1", b"m2"]
