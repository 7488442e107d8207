"""Chunked messages between `pyengine.client` and the official `pulsar-client` (3.13), through a
`pyengine serve` child process (5 MiB max_message_size): the official chunking producer's large
message reaches our consumer whole (and acknowledging it empties the backlog), and our chunking
producer's large message reaches the official consumer whole."""

from __future__ import annotations

import asyncio
import os

import pulsar
import pytest

from pyengine.client import Client
from pyengine.client.chunks import ChunkMessageId
from pyengine.client.scalable import _subscription_backlog

NS = "persistent://public/default"
BIG = 11 * 1024 * 1024                     # three chunks of at most 5 MiB


async def subscribe_and_receive(url: str, topic: str, ready: asyncio.Event, result: list) -> None:
    async with Client(url, operation_timeout_seconds=10) as client:
        consumer = await client.subscribe(topic, "ours", initial_position="earliest")
        ready.set()
        message = await consumer.receive(30)
        result.append(message)
        await consumer.acknowledge(message)
        after = await consumer.receive(30)
        await consumer.acknowledge(after)
        result.append(after)
        await asyncio.sleep(0.1)
        result.append(await _subscription_backlog(consumer, 5))


@pytest.mark.parametrize("compression", [None, pulsar.CompressionType.LZ4])
def test_our_consumer_receives_the_official_chunked_message_whole(broker, official, compression):
    topic = f"{NS}/chunks-from-official-{'lz4' if compression else 'none'}"
    producer = official.create_producer(topic, chunking_enabled=True, batching_enabled=False,
                                        **({"compression_type": compression} if compression else {}))
    big = os.urandom(BIG)                   # incompressible: stays over the limit once compressed
    producer.send(big, properties={"k": "v"})
    producer.send(b"after")
    result: list = []
    asyncio.run(subscribe_and_receive(broker.url, topic, asyncio.Event(), result))
    message, after, backlog = result
    assert len(message.data) == len(big) and message.data == big
    assert message.properties == {"k": "v"}
    assert isinstance(message.message_id, ChunkMessageId) and len(message.message_id.chunk_ids) == 3
    assert after.data == b"after"
    assert backlog == 0


async def send_from_ours(url: str, topic: str, big: bytes, compression: str) -> ChunkMessageId:
    async with Client(url, operation_timeout_seconds=10) as client:
        producer = await client.create_producer(topic, chunking_enabled=True, producer_name="our-chunker",
                                                compression_type=compression)
        sent = await producer.send(big)
        await producer.send(b"after")
        await producer.close()
        return sent


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_the_official_consumer_receives_our_chunked_message_whole(broker, official, compression):
    topic = f"{NS}/chunks-from-ours-{compression}"
    consumer = official.subscribe(topic, "theirs")
    # zstd: half compressible, so the compressed payload (about 5.5 MiB) is chunked in two
    big = os.urandom(BIG) if compression == "none" else os.urandom(BIG // 2) + bytes(BIG // 2)
    sent = asyncio.run(send_from_ours(broker.url, topic, big, compression))
    assert isinstance(sent, ChunkMessageId) and len(sent.chunk_ids) == (3 if compression == "none" else 2)
    message = consumer.receive(10_000)
    assert len(message.data()) == len(big) and message.data() == big
    consumer.acknowledge(message)
    after = consumer.receive(10_000)
    assert after.data() == b"after"
    consumer.acknowledge(after)
