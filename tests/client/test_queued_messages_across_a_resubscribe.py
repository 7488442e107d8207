"""A reader reconnecting resumes at the first message it has not handed out, as Java's
ConsumerImpl.clearReceiverQueue: the first queued one (inclusive; a chunked message at its first
chunk, also one still being put together), else after the last handed out. One that had handed
out nothing resubscribed at its configured start: started at latest (or sought by time), the
messages queued before the reconnect were lost. And what was queued (of any consumer) is not
handed out, nor counted, while the SUBSCRIBE is on its way: it comes again."""

from __future__ import annotations

import asyncio

import time

from pyengine.client import Client, ConsumerBatchReceivePolicy
from pyengine.client.message import MessageId
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import command_body, message_metadata
from pyengine.storage.entry import headers_and_payload
from tests.client.conftest import answer_late

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
    await resubscribed(handler, generation)


async def resubscribed(handler, generation: int) -> None:
    """Wait until `handler` (a partition's consumer) has subscribed again since `generation`."""
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


async def store(broker, payload: bytes, sequence_id: int, **chunk_fields) -> None:
    """Store one message (or one chunk of one) as a producer named `chunker` sends it."""
    topic = await broker.service.get_topic(T)
    producer = topic.add_producer(f"chunker-{sequence_id}")
    metadata = message_metadata(producer.name, sequence_id, int(time.time() * 1000), **chunk_fields)
    await topic.publish(producer, headers_and_payload(metadata.SerializeToString(), payload),
                        sequence_id=sequence_id, deduplicate=False)
    topic.remove_producer(producer)


async def test_a_reader_resumes_at_a_chunked_message_it_was_putting_together(broker):
    """X, the first chunk of A, B, then A's other chunks: having handed out X, holding A's first
    chunk and B queued, the reader resumes at A's first chunk, not at B (A was lost)."""
    chunk = dict(uuid="a", num_chunks_from_msg=3, total_chunk_msg_size=9)
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        await store(broker, b"X", 0)
        await store(broker, b"AAA", 1, chunk_id=0, **chunk)
        await store(broker, b"B", 2)
        reader = await client.create_reader(T, MessageId.earliest)
        assert (await reader.read_next(timeout=5)).data == b"X"
        await queued(reader, 1)                 # B; A's first chunk in its assembler
        await restarted(broker, reader)
        await store(broker, b"BBB", 3, chunk_id=1, **chunk)
        await store(broker, b"CCC", 4, chunk_id=2, **chunk)
        assert await read_all(reader) == [b"B", b"AAABBBCCC"]


def subscribe_answers_delayed(monkeypatch, delay: float) -> list[int]:
    """SUBSCRIBE answers come `delay` s late; the SUBSCRIBEs sent since (a list that grows)."""
    subscribes: list[int] = []

    def late(cmd) -> bool:
        if cmd.type == pb.BaseCommand.SUBSCRIBE:
            subscribes.append(command_body(cmd).request_id)
            return True
        return False

    answer_late(monkeypatch, delay, late)
    return subscribes

async def restarted_until_subscribing(broker, subscribes: list[int]) -> None:
    await broker.restart()
    for _ in range(1000):
        if subscribes:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("no SUBSCRIBE was sent again")


async def test_what_is_queued_is_not_handed_out_while_the_subscribe_is_on_its_way(broker, monkeypatch):
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        producer = await client.create_producer(T)
        for i in range(5):
            await producer.send(b"m%d" % i)
        reader = await client.create_reader(T, MessageId.earliest)
        await queued(reader, 5)
        await restarted_until_subscribing(broker, subscribe_answers_delayed(monkeypatch, 0.5))
        assert await read_all(reader, timeout=1.5) == [b"m%d" % i for i in range(5)]      # once each


async def test_a_batch_receive_waits_while_the_subscribe_is_on_its_way(broker, monkeypatch):
    """The queue's count ends with it: counted still, a full queue made batch_receive() return []
    at once, without a turn of the event loop, which a loop of batch receives never gave back."""
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        consumer = await client.subscribe(T, "s", receiver_queue_size=10, initial_position="earliest",
                                          batch_receive_policy=ConsumerBatchReceivePolicy(5, -1, 3000))
        producer = await client.create_producer(T)
        for i in range(10):
            await producer.send(b"m%d" % i)
        for _ in range(500):
            if consumer._queued_totals()[0] >= 10:
                break
            await asyncio.sleep(0.01)
        await restarted_until_subscribing(broker, subscribe_answers_delayed(monkeypatch, 1.0))
        batch = await asyncio.wait_for(consumer.batch_receive(), 10)
        assert [m.data for m in batch] == [b"m%d" % i for i in range(5)]
