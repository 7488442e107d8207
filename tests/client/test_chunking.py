"""Chunked messages between our producer and our consumer, on a broker with a small
max_message_size: split on the way in, put back together on the way out, acknowledged whole,
and dropped (their chunks acknowledged) when incomplete for too long."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pyengine.client import Client, MessageTooBigError
from pyengine.client.chunks import ChunkAssembler, ChunkMessageId
from pyengine.client.message import MessageId
from pyengine.client.scalable import _subscription_backlog

from .conftest import NetworkBroker

LIMIT = 10_000
TOPIC = "persistent://public/default/chunks"


@pytest.fixture
async def small_broker(tmp_path: Path) -> AsyncIterator[NetworkBroker]:
    async with NetworkBroker(tmp_path / "data", num_coordinators=1, max_message_size=LIMIT) as network_broker:
        yield network_broker


@pytest.fixture
async def small_client(small_broker: NetworkBroker) -> AsyncIterator[Client]:
    async with Client(small_broker.url, operation_timeout_seconds=10) as network_client:
        yield network_client


def _payload(size: int) -> bytes:
    return bytes(i * 7 % 251 for i in range(size))


@pytest.mark.parametrize("size", [LIMIT + 1, LIMIT * 25 + 3])
async def test_a_message_over_the_limit_is_chunked_and_received_whole(small_client, size):
    consumer = await small_client.subscribe(TOPIC, "sub", consumer_type="shared")
    producer = await small_client.create_producer(TOPIC, chunking_enabled=True, producer_name="p")
    payload = _payload(size)
    sent = await producer.send(payload, key="k", properties={"a": "b"})
    after = await producer.send(b"small")
    assert isinstance(sent, ChunkMessageId) and len(sent.chunk_ids) >= 2
    assert (sent.ledger_id, sent.entry_id) == (sent.chunk_ids[-1].ledger_id, sent.chunk_ids[-1].entry_id)
    message = await consumer.receive(5)
    assert message.data == payload and message.key == "k" and message.properties == {"a": "b"}
    assert isinstance(message.message_id, ChunkMessageId)
    assert [(m.ledger_id, m.entry_id) for m in message.message_id.chunk_ids] == \
        [(m.ledger_id, m.entry_id) for m in sent.chunk_ids]
    small = await consumer.receive(5)
    assert small.data == b"small" and small.message_id == after
    # acknowledging the chunked message acknowledges every chunk entry
    assert await _subscription_backlog(consumer, 5) == len(sent.chunk_ids) + 1
    await consumer.acknowledge(message)
    await consumer.acknowledge(small)
    await asyncio.sleep(0.05)
    assert await _subscription_backlog(consumer, 5) == 0


async def test_a_compressed_chunked_message_is_decompressed_after_reassembly(small_client):
    consumer = await small_client.subscribe(TOPIC, "sub")
    producer = await small_client.create_producer(TOPIC, chunking_enabled=True, compression_type="zstd")
    payload = os.urandom(LIMIT * 3) + bytes(LIMIT * 30)     # compresses, but stays over the limit
    sent = await producer.send(payload)
    assert isinstance(sent, ChunkMessageId)
    message = await consumer.receive(5)
    assert message.data == payload


async def test_without_chunking_too_big_fails_and_chunking_refuses_batching(small_client):
    producer = await small_client.create_producer(TOPIC)
    with pytest.raises(MessageTooBigError):
        await producer.send(_payload(LIMIT + 1))
    with pytest.raises(ValueError, match="Batching and chunking"):
        await small_client.create_producer(TOPIC, chunking_enabled=True, batching_enabled=True)


async def test_a_small_message_of_a_chunking_producer_is_one_entry(small_client):
    consumer = await small_client.subscribe(TOPIC, "sub")
    producer = await small_client.create_producer(TOPIC, chunking_enabled=True)
    sent = await producer.send(b"x" * (LIMIT // 2))
    assert type(sent) is MessageId
    assert (await consumer.receive(5)).data == b"x" * (LIMIT // 2)


async def test_an_incomplete_chunked_message_expires_and_its_chunks_are_acknowledged(small_client):
    consumer = await small_client.subscribe(TOPIC, "sub", consumer_type="shared",
                                            expire_time_of_incomplete_chunked_message_ms=300)
    producer = await small_client.create_producer(TOPIC, chunking_enabled=True, send_timeout_ms=0)
    (partition,) = producer._partitions
    sent_ops = []
    enqueue = partition._enqueue

    def first_chunk_only(op, messages, gate=None):
        sent_ops.append(op)
        if len(sent_ops) == 1:
            enqueue(op, messages, gate)

    partition._enqueue = first_chunk_only
    pending = producer.send_async(_payload(LIMIT * 3))
    await asyncio.sleep(0.2)
    partition._enqueue = enqueue
    assert len(sent_ops) >= 3 and not pending.done()
    await producer.send(b"next")
    assert (await consumer.receive(5)).data == b"next"
    assert await _subscription_backlog(consumer, 5) == 2       # the lone chunk and "next"
    (handler,) = consumer._handlers.values()
    assert len(handler._chunks) == 1
    await asyncio.sleep(0.8)
    assert len(handler._chunks) == 0
    assert await _subscription_backlog(consumer, 5) == 1       # the chunk was acknowledged
    with pytest.raises(TimeoutError):
        await consumer.receive(0.2)
    pending.cancel()


async def test_a_negatively_acknowledged_chunked_message_comes_again_whole(small_client):
    consumer = await small_client.subscribe(TOPIC, "sub", consumer_type="shared",
                                            negative_ack_redelivery_delay_ms=0)
    producer = await small_client.create_producer(TOPIC, chunking_enabled=True)
    payload = _payload(LIMIT * 4)
    await producer.send(payload)
    first = await consumer.receive(5)
    await consumer.negative_acknowledge(first)
    again = await consumer.receive(5)
    assert again.data == payload and again.redelivery_count == 1
    await consumer.acknowledge(again)
    await asyncio.sleep(0.05)
    assert await _subscription_backlog(consumer, 5) == 0


def _mid(entry: int) -> MessageId:
    return MessageId(1, entry)


def test_the_assembler_follows_the_cpp_client_on_duplicates_gaps_and_a_full_cache():
    assembler = ChunkAssembler(max_pending=2, auto_ack_oldest_on_queue_full=True, expire_ms=1000)
    assert assembler.process("u", 0, 3, 6, 0, _mid(1), b"ab", 10).message_id is None
    # a redelivered chunk (same entry): dropped, not acknowledged
    assert assembler.process("u", 0, 3, 6, 0, _mid(1), b"ab", 10).ack == []
    assert assembler.process("u", 1, 3, 6, 0, _mid(2), b"cd", 10).ack == []
    assert assembler.process("u", 1, 3, 6, 0, _mid(2), b"cd", 10).ack == []          # duplicate
    assert assembler.process("u", 1, 3, 6, 0, _mid(9), b"cd", 10).ack == [_mid(9)]   # another entry
    done = assembler.process("u", 2, 3, 6, 0, _mid(3), b"ef", 10)
    assert done.payload == b"abcdef" and done.message_id.chunk_ids == (_mid(1), _mid(2), _mid(3))
    # a gap drops the message; the chunk is acknowledged only once it is expired
    assembler.process("g", 0, 3, 6, 0, _mid(4), b"ab", 10)
    assert assembler.process("g", 2, 3, 6, 0, _mid(5), b"ef", 10).ack == []
    assert len(assembler) == 0
    assert assembler.process("h", 1, 3, 6, 0, _mid(6), b"cd", 5000).ack == [_mid(6)]  # no first chunk, expired
    # a full cache drops (and here acknowledges) the oldest incomplete message
    assembler.process("a", 0, 2, 4, 0, _mid(10), b"ab", 10)
    assembler.process("b", 0, 2, 4, 0, _mid(11), b"ab", 10)
    assert assembler.process("c", 0, 2, 4, 0, _mid(12), b"ab", 10).ack == [_mid(10)]
    assert assembler.expire(2000) == [_mid(11), _mid(12)]
