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
