"""Redelivery of chunked messages and of partly acknowledged batches.

- Ack timeout: a chunked message received and not acknowledged comes again whole (every chunk
  is asked for again, as pulsar-client-cpp's tracker with a ChunkMessageIdImpl), and chunks
  the consumer could not put together are tracked too (C++ trackMessage), so they come again.
- A deserialized chunked id (first and last chunk only) acknowledges every chunk of a message
  this consumer received (as the Java client's map of received chunk ids).
- Without batch-index acks, the per-batch counts of a Shared consumer stay bounded however
  often a batch comes again.
"""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import consumer as consumer_module
from pyengine.client.chunks import ChunkAssembler, ChunkMessageId
from pyengine.client.message import MessageId
from pyengine.client.scalable import _subscription_backlog

from .test_chunking import LIMIT, _payload, small_broker, small_client  # noqa: F401  (fixtures)

TOPIC = "persistent://public/default/chunk-batch-redelivery"


@pytest.fixture
def short_ack_timeouts(monkeypatch):
    """Pulsar's minimum ack timeout is 10 s: tests lower it (the public check stays)."""
    monkeypatch.setattr(consumer_module, "MIN_UNACKED_MESSAGES_TIMEOUT_MS", 1)


# --- defect 1: chunks and the ack-timeout tracker ----------------------------------------------

async def test_an_unacked_chunked_message_times_out_and_comes_again_whole(small_client, short_ack_timeouts):
    consumer = await small_client.subscribe(TOPIC, "sub", consumer_type="shared",
                                            unacked_messages_timeout_ms=200)
    consumer._unacked.tick_ms = 50             # not part of the API: C++'s tickDurationInMs
    producer = await small_client.create_producer(TOPIC, chunking_enabled=True)
    payload = _payload(LIMIT * 3 + 1)
    sent = await producer.send(payload)
    first = await consumer.receive(5)
    assert first.data == payload and first.redelivery_count == 0
    again = await consumer.receive(2)               # not acknowledged: every chunk comes again
    assert again.data == payload and again.redelivery_count == 1
    assert again.message_id.chunk_ids == sent.chunk_ids
    await consumer.acknowledge(again)
    await asyncio.sleep(0.05)
    assert await _subscription_backlog(consumer, 5) == 0


def test_the_assembler_names_the_chunks_it_leaves_for_redelivery():
    assembler = ChunkAssembler(max_pending=1, auto_ack_oldest_on_queue_full=False, expire_ms=1000)
    mid = lambda entry: MessageId(1, entry)             # noqa: E731
    assembler.process("a", 0, 2, 4, 0, mid(1), b"ab", 10)
    evicted = assembler.process("b", 0, 2, 4, 0, mid(2), b"ab", 10)      # the cache is full
    assert evicted.ack == [] and evicted.track == [mid(1)]
    assert assembler.process("c", 1, 2, 4, 0, mid(3), b"cd", 10).track == [mid(3)]     # no first chunk
    gap = assembler.process("b", 2, 3, 6, 0, mid(4), b"ef", 10)          # chunk 1 is missing
    assert gap.ack == [] and gap.track == [mid(2), mid(4)]
    assembler.process("d", 0, 3, 6, 0, mid(5), b"ab", 10)
    expired_gap = assembler.process("d", 2, 3, 6, 0, mid(6), b"ef", 5000)
    assert expired_gap.ack == [mid(5), mid(6)] and expired_gap.track == []


async def test_chunks_without_their_first_are_tracked_and_acked_once_expired(small_client, short_ack_timeouts):
    # Chunk 0 never reaches the broker: the others cannot be assembled. They are tracked, come
    # again on ack timeout and are acknowledged once the message is past its expiry.
    consumer = await small_client.subscribe(TOPIC, "sub", consumer_type="shared",
                                            unacked_messages_timeout_ms=100,
                                            expire_time_of_incomplete_chunked_message_ms=400)
    consumer._unacked.tick_ms = 50
    producer = await small_client.create_producer(TOPIC, chunking_enabled=True, send_timeout_ms=0)
    (partition,) = producer._partitions
    enqueue = partition._enqueue
    skipped = []

    def all_but_the_first_chunk(op, messages, gate=None):
        if not skipped:
            skipped.append(op)
            return
        enqueue(op, messages, gate)

    partition._enqueue = all_but_the_first_chunk
    pending = producer.send_async(_payload(LIMIT * 3))
    for _ in range(100):
        if await _subscription_backlog(consumer, 5) >= 2:
            break
        await asyncio.sleep(0.02)
    partition._enqueue = enqueue
    assert await _subscription_backlog(consumer, 5) >= 2
    for _ in range(100):
        if await _subscription_backlog(consumer, 5) == 0:
            break
        await asyncio.sleep(0.05)
    assert await _subscription_backlog(consumer, 5) == 0
    pending.cancel()


# --- defect 2: acknowledging a deserialized chunked id -------------------------------------------

async def test_a_deserialized_chunked_id_acknowledges_every_chunk(small_client):
    consumer = await small_client.subscribe(TOPIC, "sub", consumer_type="shared")
    producer = await small_client.create_producer(TOPIC, chunking_enabled=True)
    payload = _payload(LIMIT * 4)
    sent = await producer.send(payload)
    assert len(sent.chunk_ids) >= 4
    message = await consumer.receive(5)
    wire = MessageId.deserialize(message.message_id.serialize())
    assert isinstance(wire, ChunkMessageId) and len(wire.chunk_ids) == 2       # first and last only
    await consumer.acknowledge(wire)
    await asyncio.sleep(0.05)
    assert await _subscription_backlog(consumer, 5) == 0
    (handler,) = consumer._handlers.values()
    assert handler._chunked_unacked == {}


async def test_a_reader_keeps_no_chunk_lists(small_client):
    """A reader acknowledges nothing: remembering its chunked messages' chunks would only grow."""
    producer = await small_client.create_producer(TOPIC, chunking_enabled=True)
    payloads = [_payload(LIMIT * 2 + i) for i in range(3)]
    for payload in payloads:
        await producer.send(payload)
    reader = await small_client.create_reader(TOPIC, MessageId.earliest)
    assert [(await reader.read_next(5)).data for _ in payloads] == payloads
    (handler,) = reader._handlers.values()
    assert handler._chunked_unacked == {}


# --- defect 3: partly acknowledged batches without batch-index acks ------------------------------

async def test_partial_batch_counts_are_empty_after_a_redelivered_batch_is_acked(small_client):
    producer = await small_client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=3,
                                                  batching_max_publish_delay_ms=1000)
    consumer = await small_client.subscribe(TOPIC, "sub", consumer_type="shared", batch_index_ack_enabled=False,
                                            negative_ack_redelivery_delay_ms=0)
    (handler,) = consumer._handlers.values()
    for round_ in range(3):
        await asyncio.gather(*(producer.send(b"%d-%d" % (round_, i)) for i in range(3)))
        first = [await consumer.receive(5) for _ in range(3)]
        assert len({m.message_id.entry_id for m in first}) == 1
        await consumer.acknowledge(first[0])
        await consumer.negative_acknowledge(first[1])       # the whole batch comes again ...
        assert handler._batch_remaining == {}               # ... maybe to another consumer
        await consumer.acknowledge(first[2])
        again = [await consumer.receive(5) for _ in range(3)]
        assert [m.data for m in again] == [m.data for m in first]
        for message in again:
            await consumer.acknowledge(message)
        await consumer.acknowledge(first[0])                # late: the batch is settled already
        assert handler._batch_remaining == {} and handler._batch_left == {}
    await asyncio.sleep(0.05)
    assert await _subscription_backlog(consumer, 5) == 0
