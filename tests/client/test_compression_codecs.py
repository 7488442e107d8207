"""The consumer's decoder reads every codec the official clients produce with: LZ4 (a raw LZ4
block, sized by MessageMetadata.uncompressed_size), ZSTD (a zstd frame) and SNAPPY (raw snappy,
no framing), as well as ZLIB; a corrupt payload, or one whose size is not the announced
uncompressed_size, is a DecodeError."""

from __future__ import annotations

import cramjam
import pytest

from core_ext.batch import build_batch
from pyengine.client.message import DecodeError, decode_entry
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import headers_and_payload
from pyengine_kernels import Position

TOPIC = "persistent://public/default/codecs"
POSITION = Position(3, 7)

COMPRESS = {
    pb.LZ4: lambda data: bytes(cramjam.lz4.compress_block(data, store_size=False)),
    pb.ZSTD: lambda data: bytes(cramjam.zstd.compress(data)),
    pb.SNAPPY: lambda data: bytes(cramjam.snappy.compress_raw(data)),
}
CODECS = pytest.mark.parametrize("codec", list(COMPRESS), ids=["LZ4", "ZSTD", "SNAPPY"])


def _entry(codec: int, plain: bytes, *, uncompressed_size: int | None = None, payload: bytes | None = None,
           **fields) -> bytes:
    md = message_metadata("p", 10, 1234, compression=codec,
                          uncompressed_size=len(plain) if uncompressed_size is None else uncompressed_size,
                          **fields)
    return headers_and_payload(md.SerializeToString(), COMPRESS[codec](plain) if payload is None else payload)


def _batch(bodies: list[bytes]) -> bytes:
    singles = []
    for i, body in enumerate(bodies):
        single = pb.SingleMessageMetadata(payload_size=len(body), partition_key=f"k{i}", sequence_id=10 + i)
        single.properties.append(pb.KeyValue(key="i", value=str(i)))
        singles.append((single.SerializeToString(), body))
    return build_batch(singles)


@CODECS
@pytest.mark.parametrize("size", [0, 1, 100, 70_000])
def test_a_compressed_message_decodes(codec, size):
    plain = bytes(i % 7 for i in range(size))
    [message] = decode_entry(TOPIC, POSITION, _entry(codec, plain))
    assert message.data == plain and message.message_id.batch_index == -1


@CODECS
def test_a_compressed_batch_decodes(codec):
    bodies = [b"message-%d " % i * (i + 1) for i in range(20)]
    messages = decode_entry(TOPIC, POSITION, _entry(codec, _batch(bodies), num_messages_in_batch=len(bodies)))
    assert [m.data for m in messages] == bodies
    assert [m.partition_key for m in messages] == [f"k{i}" for i in range(20)]
    assert [m.properties for m in messages] == [{"i": str(i)} for i in range(20)]
    assert [m.message_id.batch_index for m in messages] == list(range(20))


@CODECS
@pytest.mark.parametrize("corrupt", [b"", b"\xff", b"\x28\xb5\x2f\xfd\x00", b"garbage, not compressed at all" * 3])
def test_a_corrupt_payload_is_a_decode_error(codec, corrupt):
    with pytest.raises(DecodeError, match="does not decompress|does not match"):
        decode_entry(TOPIC, POSITION, _entry(codec, b"x" * 100, payload=corrupt))


@CODECS
def test_a_truncated_payload_is_a_decode_error(codec):
    plain = bytes(range(256)) * 40
    compressed = COMPRESS[codec](plain)
    with pytest.raises(DecodeError, match="does not decompress|does not match"):
        decode_entry(TOPIC, POSITION, _entry(codec, plain, payload=compressed[:len(compressed) // 2]))


@CODECS
@pytest.mark.parametrize("delta", [-1, 1, 1000])
def test_a_size_other_than_uncompressed_size_is_a_decode_error(codec, delta):
    """LZ4 in particular: a block that inflates to fewer bytes than announced is refused, not
    padded up to uncompressed_size."""
    plain = b"0123456789" * 50
    with pytest.raises(DecodeError, match="does not decompress|does not match"):
        decode_entry(TOPIC, POSITION, _entry(codec, plain, uncompressed_size=len(plain) + delta,
                                             payload=COMPRESS[codec](plain)))


@pytest.mark.parametrize("codec", [pb.ZSTD, pb.SNAPPY], ids=["ZSTD", "SNAPPY"])
def test_zstd_and_snappy_carry_their_own_size(codec):
    """Without uncompressed_size (0, as for ZLIB: not checked) a zstd frame or snappy block still
    decodes; an LZ4 block cannot (its size is only in the metadata)."""
    plain = b"abc" * 100
    md = message_metadata("p", 1, 1, compression=codec)
    [message] = decode_entry(TOPIC, POSITION, headers_and_payload(md.SerializeToString(), COMPRESS[codec](plain)))
    assert message.data == plain



@pytest.mark.parametrize("codec", [pb.LZ4, pb.SNAPPY], ids=["LZ4", "SNAPPY"])
def test_an_uncompressed_size_the_payload_cannot_hold_is_refused_up_front(codec):
    """An LZ4 block inflates 255-fold at most and raw snappy states its size: a claim of 4 GiB
    from a few bytes is refused without allocating 4 GiB."""
    with pytest.raises(DecodeError, match="does not decompress"):
        decode_entry(TOPIC, POSITION, _entry(codec, b"tiny", uncompressed_size=(1 << 32) - 1))
