"""Producer-side compression (`create_producer(compression_type=...)`): each message sent alone,
or each batch as a whole, is compressed with LZ4 (a raw block), ZLIB, ZSTD or SNAPPY (raw), its
MessageMetadata saying the codec and the uncompressed size, as Pulsar's clients write it. Our
consumer reads it back, in and out of transactions; the size limit applies to what is sent
(the compressed payload); an unknown codec is refused when the producer is created."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core_ext.records import decompress
from pyengine.client import Client, CompressionType, MessageTooBigError
from pyengine.client import producer as producer_module
from pyengine.protocol import pulsar_api_pb2 as pb

from .conftest import NetworkBroker, drain

NS = "persistent://public/default"
CODECS = {"lz4": pb.LZ4, "zlib": pb.ZLIB, "zstd": pb.ZSTD, "snappy": pb.SNAPPY}
BATCHING = pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
COUNT = 30


def _body(i: int) -> bytes:
    return b"compressible body %d " % i * (i + 3) if i % 5 else b""      # empty payloads too


async def test_an_empty_message_alone_is_sent_uncompressed(client, sent):
    producer = await client.create_producer(f"{NS}/empty-zlib", compression_type="zlib")
    consumer = await client.subscribe(f"{NS}/empty-zlib", "sub", initial_position="earliest")
    await producer.send(b"")
    await producer.send(b"x")
    [(empty, _), (one, _)] = sent
    assert not empty.HasField("compression") and not empty.HasField("uncompressed_size")
    assert one.compression == pb.ZLIB and one.uncompressed_size == 1
    assert [m.data for m in await drain(consumer)] == [b"", b"x"]


@pytest.fixture
def sent(monkeypatch) -> list[tuple[pb.MessageMetadata, bytes]]:
    """The metadata and payload of every SEND the producers build."""
    frames: list[tuple[pb.MessageMetadata, bytes]] = []
    encode = producer_module.encode_payload_frame

    def recording(command: bytes, metadata: bytes, payload: bytes) -> bytes:
        frames.append((pb.MessageMetadata.FromString(metadata), payload))
        return encode(command, metadata, payload)
    monkeypatch.setattr(producer_module, "encode_payload_frame", recording)
    return frames


def _check_sent(sent: list[tuple[pb.MessageMetadata, bytes]], codec: int, batching: bool) -> None:
    assert sent
    for metadata, payload in sent:
        assert metadata.HasField("num_messages_in_batch") == batching
        if not payload:
            # an empty message alone is sent uncompressed (the C++ client cannot inflate an
            # empty ZLIB stream); a batch is never empty
            assert not batching and not metadata.HasField("compression")
            continue
        assert metadata.compression == codec
        assert metadata.HasField("uncompressed_size")
        assert len(decompress(codec, payload, metadata.uncompressed_size)) == metadata.uncompressed_size
    if batching:
        assert len(sent) < COUNT


async def _produce(producer, *, txn=None) -> None:
    futures = [producer.send_async(_body(i), key=f"k{i % 3}", properties={"i": str(i)}, txn=txn)
               for i in range(COUNT)]
    await producer.flush()
    for future in futures:
        assert (await future).entry_id >= 0


def _check_received(messages) -> None:
    assert [m.data for m in messages] == [_body(i) for i in range(COUNT)]
    assert [m.partition_key for m in messages] == [f"k{i % 3}" for i in range(COUNT)]
    assert [m.properties for m in messages] == [{"i": str(i)} for i in range(COUNT)]


@BATCHING
@pytest.mark.parametrize("codec", list(CODECS))
async def test_a_compressed_message_or_batch_round_trips(client, sent, codec, batching):
    topic = f"{NS}/compressed-{codec}-{batching}"
    consumer = await client.subscribe(topic, "sub", initial_position="earliest")
    producer = await client.create_producer(topic, compression_type=codec, batching_enabled=batching,
                                            batching_max_messages=8, batching_max_publish_delay_ms=50)
    await _produce(producer)
    _check_sent(sent, CODECS[codec], batching)
    messages = await drain(consumer)
    _check_received(messages)
    assert all((m.message_id.batch_index >= 0) == batching for m in messages)


@BATCHING
@pytest.mark.parametrize("codec", list(CODECS))
async def test_compressed_sends_of_a_transaction_appear_on_commit(client, sent, codec, batching):
    topic = f"{NS}/compressed-txn-{codec}-{batching}"
    consumer = await client.subscribe(topic, "sub", initial_position="earliest")
    producer = await client.create_producer(topic, compression_type=codec, batching_enabled=batching,
                                            batching_max_messages=8, batching_max_publish_delay_ms=50)
    aborted = await client.new_transaction()
    await producer.send(b"aborted " * 50, txn=aborted)
    await aborted.abort()
    txn = await client.new_transaction()
    await _produce(producer, txn=txn)
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.3)                  # not visible before the commit
    await txn.commit()
    _check_sent(sent, CODECS[codec], batching)
    assert all(metadata.HasField("txnid_most_bits") for metadata, _ in sent)
    _check_received(await drain(consumer))


@pytest.mark.parametrize("name", ["LZ4", "lz4", "Zlib", "ZLIB", "zstd", "Snappy", "none", "NONE"])
async def test_the_codec_is_named_in_any_case(client, sent, name):
    producer = await client.create_producer(f"{NS}/named-{name}", compression_type=name)
    await producer.send(b"x" * 100)
    [(metadata, _)] = sent
    assert metadata.compression == getattr(pb, name.upper())
    assert metadata.HasField("uncompressed_size") == (name.lower() != "none")


@pytest.mark.parametrize("codec", [CompressionType.LZ4, CompressionType.ZLib, CompressionType.ZLIB,
                                   CompressionType.ZSTD, CompressionType.SNAPPY, CompressionType.NONE])
async def test_the_codec_is_a_compression_type(client, sent, codec):
    producer = await client.create_producer(f"{NS}/typed-{codec.name}", compression_type=codec)
    await producer.send(b"x" * 100)
    assert sent[0][0].compression == codec


async def test_pulsar_clients_compression_type_is_accepted(client, sent):
    pulsar = pytest.importorskip("pulsar")
    for i, codec in enumerate([pulsar.CompressionType.LZ4, pulsar.CompressionType.ZLib,
                               pulsar.CompressionType.ZSTD, pulsar.CompressionType.SNAPPY,
                               pulsar.CompressionType.NONE]):
        producer = await client.create_producer(f"{NS}/official-enum-{i}", compression_type=codec)
        await producer.send(b"y" * 100)
        assert sent[-1][0].compression == int(codec)


@pytest.mark.parametrize("bad", ["gzip", "", "lz4 ", "brotli"])
async def test_an_unknown_codec_is_a_value_error(client, bad):
    with pytest.raises(ValueError, match="compression_type must be one of"):
        await client.create_producer(f"{NS}/bad-codec", compression_type=bad)


@pytest.mark.parametrize("bad", [1, None, True, b"lz4"])
async def test_a_codec_of_another_type_is_a_type_error(client, bad):
    with pytest.raises(TypeError, match="compression_type"):
        await client.create_producer(f"{NS}/bad-codec", compression_type=bad)


async def test_a_scalable_producer_checks_the_codec_before_opening_anything(client):
    with pytest.raises(ValueError, match="compression_type"):
        await client.create_scalable_producer("topic://public/default/scalable-codec", compression_type="gzip")


# --- the size limit applies to the compressed payload --------------------------------------------

LIMIT = 64 * 1024


@pytest.fixture
async def small_broker(tmp_path: Path):
    async with NetworkBroker(tmp_path / "data", num_coordinators=1, max_message_size=LIMIT) as network_broker:
        yield network_broker


@BATCHING
@pytest.mark.parametrize("codec", list(CODECS))
async def test_a_message_over_the_limit_is_sent_when_it_compresses_below_it(small_broker, codec, batching):
    topic = f"{NS}/big-{codec}-{batching}"
    async with Client(small_broker.url, operation_timeout_seconds=10) as client:
        consumer = await client.subscribe(topic, "sub", initial_position="earliest")
        producer = await client.create_producer(topic, compression_type=codec, batching_enabled=batching,
                                                batching_max_publish_delay_ms=50)
        big = b"a very compressible line\n" * (4 * LIMIT // 25)
        before = producer.send_async(b"before")
        assert (await producer.send(big)).entry_id >= 0
        await before
        incompressible = os.urandom(LIMIT + 1)
        neighbour = producer.send_async(b"neighbour")
        with pytest.raises(MessageTooBigError, match="compressed"):
            await producer.send(incompressible)
        assert (await producer.send(b"after")).entry_id >= 0
        await neighbour
        assert [m.data for m in await drain(consumer)] == [b"before", big, b"neighbour", b"after"]


async def test_without_compression_the_limit_applies_to_the_payload(small_broker):
    async with Client(small_broker.url, operation_timeout_seconds=10) as client:
        producer = await client.create_producer(f"{NS}/big-none")
        with pytest.raises(MessageTooBigError):
            await producer.send(b"a" * (LIMIT + 1))
