"""Messages the OFFICIAL pulsar-client (3.13) produces compressed with LZ4, ZSTD or SNAPPY, with
batching on and off, through a `pyengine serve` child process, read by `pyengine.client`."""

from __future__ import annotations

import asyncio

import pulsar
import pytest

from pyengine.client import Client
from pyengine.testing import ServeProcess

NS = "persistent://public/default"
COUNT = 40

CODECS = {"lz4": pulsar.CompressionType.LZ4, "zstd": pulsar.CompressionType.ZSTD,
          "snappy": pulsar.CompressionType.SNAPPY}


def _produce(client: pulsar.Client, topic: str, codec: pulsar.CompressionType, batching: bool) -> None:
    producer = client.create_producer(topic, compression_type=codec, batching_enabled=batching,
                                      batching_max_messages=10, batching_max_publish_delay_ms=50,
                                      producer_name=f"official-{topic.rsplit('/', 1)[-1]}")
    try:
        for i in range(COUNT):
            body = b"compressible payload %d " % i * (i + 5)
            if batching:
                producer.send_async(body, None, properties={"i": str(i)}, partition_key=f"k{i % 4}")
            else:
                producer.send(body, properties={"i": str(i)}, partition_key=f"k{i % 4}")
        producer.flush()
    finally:
        producer.close()


@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("codec", list(CODECS))
async def test_pyengine_client_reads_what_the_official_client_compressed(
        broker: ServeProcess, official: pulsar.Client, codec: str, batching: bool) -> None:
    topic = f"{NS}/compressed-{codec}-{'batched' if batching else 'unbatched'}"
    async with Client(broker.url) as client:
        consumer = await client.subscribe(topic, "sub", initial_position="earliest")
        await asyncio.to_thread(_produce, official, topic, CODECS[codec], batching)
        messages = []
        for _ in range(COUNT):
            message = await consumer.receive(timeout=10)
            await consumer.acknowledge(message)
            messages.append(message)
    assert [m.data for m in messages] == [b"compressible payload %d " % i * (i + 5) for i in range(COUNT)]
    assert [m.properties for m in messages] == [{"i": str(i)} for i in range(COUNT)]
    assert [m.partition_key for m in messages] == [f"k{i % 4}" for i in range(COUNT)]
    batched = [m for m in messages if m.message_id.batch_index >= 0]
    assert (len(batched) > 0) == batching


# --- the other way: pyengine.client compresses, the official client decompresses ---------------

OUR_CODECS = {"lz4": "LZ4", "zlib": "ZLib", "zstd": "ZSTD", "snappy": "SNAPPY"}


def _our_body(i: int) -> bytes:
    return b"compressible payload %d " % i * (i + 5) if i % 7 else b""     # empty ones too


def _consume(client: pulsar.Client, topic: str, count: int) -> list[pulsar.Message]:
    consumer = client.subscribe(topic, "official-sub", initial_position=pulsar.InitialPosition.Earliest)
    try:
        messages = []
        for _ in range(count):
            message = consumer.receive(timeout_millis=10_000)
            consumer.acknowledge(message)
            messages.append(message)
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=300)
        return messages
    finally:
        consumer.close()


@pytest.mark.parametrize("in_txn", [False, True], ids=["plain", "txn"])
@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("codec", list(OUR_CODECS))
async def test_the_official_client_reads_what_pyengine_client_compressed(
        broker: ServeProcess, official: pulsar.Client, codec: str, batching: bool, in_txn: bool) -> None:
    topic = f"{NS}/ours-compressed-{codec}-{'batched' if batching else 'unbatched'}-{'txn' if in_txn else 'plain'}"
    async with Client(broker.url) as client:
        # the codec named as pulsar-client names it, in a case of its own
        producer = await client.create_producer(topic, compression_type=OUR_CODECS[codec].swapcase(),
                                                batching_enabled=batching, batching_max_messages=10,
                                                batching_max_publish_delay_ms=50)
        txn = await client.new_transaction() if in_txn else None
        futures = [producer.send_async(_our_body(i), properties={"i": str(i)}, key=f"k{i % 4}", txn=txn)
                   for i in range(COUNT)]
        await producer.flush()
        await asyncio.gather(*futures)
        if txn is not None:
            await txn.commit()
    messages = await asyncio.to_thread(_consume, official, topic, COUNT)
    assert [m.data() for m in messages] == [_our_body(i) for i in range(COUNT)]
    assert [m.properties() for m in messages] == [{"i": str(i)} for i in range(COUNT)]
    assert [m.partition_key() for m in messages] == [f"k{i % 4}" for i in range(COUNT)]
    batched = [m for m in messages if m.message_id().batch_index() >= 0]
    assert (len(batched) > 0) == batching


async def test_the_official_client_reads_a_large_compressed_message(broker: ServeProcess,
                                                                    official: pulsar.Client) -> None:
    topic = f"{NS}/ours-compressed-large"
    body = b"0123456789abcdef" * (1 << 18)                      # 4 MiB, one LZ4 block
    async with Client(broker.url) as client:
        producer = await client.create_producer(topic, compression_type=pulsar.CompressionType.LZ4)
        await producer.send(body)
    [message] = await asyncio.to_thread(_consume, official, topic, 1)
    assert message.data() == body
