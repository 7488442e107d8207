"""core_ext.records decodes entries compressed with every codec the official clients use (LZ4
block, ZSTD frame, raw SNAPPY, ZLIB), batched or not, as the consumer's decoder does; a corrupt
payload is a RecordFormatError."""

from __future__ import annotations

import zlib

import cramjam
import pytest

from core_ext.batch import build_batch
from core_ext.records import RecordFormatError, decode_entries
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import encode_entry, headers_and_payload
from tests.core_ext.test_records import column_rows
from tests.reference import records as ref

COMPRESS = {
    pb.LZ4: lambda data: bytes(cramjam.lz4.compress_block(data, store_size=False)),
    pb.ZLIB: zlib.compress,
    pb.ZSTD: lambda data: bytes(cramjam.zstd.compress(data)),
    pb.SNAPPY: lambda data: bytes(cramjam.snappy.compress_raw(data)),
}
CODECS = pytest.mark.parametrize("codec", list(COMPRESS), ids=["LZ4", "ZLIB", "ZSTD", "SNAPPY"])


def _batched_entry(codec: int, bodies: list[bytes], *, payload: bytes | None = None,
                   size_delta: int = 0) -> bytes:
    singles = []
    for i, body in enumerate(bodies):
        single = pb.SingleMessageMetadata(payload_size=len(body), partition_key=f"k{i}")
        single.properties.append(pb.KeyValue(key="i", value=str(i)))
        singles.append((single.SerializeToString(), body))
    plain = build_batch(singles)
    md = message_metadata("p", 100, 5000, compression=codec, num_messages_in_batch=len(bodies),
                          uncompressed_size=len(plain) + size_delta)
    data = headers_and_payload(md.SerializeToString(), COMPRESS[codec](plain) if payload is None else payload)
    return encode_entry(data, num_messages=len(bodies), publish_time=5000)


def _single_entry(codec: int, body: bytes) -> bytes:
    md = message_metadata("p", 7, 5000, compression=codec, uncompressed_size=len(body))
    return encode_entry(headers_and_payload(md.SerializeToString(), COMPRESS[codec](body)), publish_time=5000)


@CODECS
def test_compressed_batched_entries_decode_like_the_consumers_decoder(codec):
    values = [_batched_entry(codec, [b"entry-%d-message-%d " % (e, i) * (i + 1) for i in range(e + 1)])
              for e in range(6)]
    values.append(_single_entry(codec, b"not batched " * 50))
    ledgers, entries = [1] * len(values), list(range(len(values)))
    columns = decode_entries(ledgers, entries, values)
    rows = column_rows(columns)
    assert columns["rows"] == sum(range(1, 7)) + 1
    assert [r["value"] for r in rows[:3]] == [b"entry-0-message-0 ", b"entry-1-message-0 ", b"entry-1-message-1 " * 2]
    assert rows[-1]["value"] == b"not batched " * 50 and rows[-1]["batch_index"] == -1
    assert rows == ref.decode_entries(ledgers, entries, values)


@CODECS
def test_a_compressed_entry_left_out_by_keep_is_not_decompressed(codec):
    good = _batched_entry(codec, [b"a", b"b"])
    corrupt = _batched_entry(codec, [b"c"], payload=b"\xff" * 9)
    rows = column_rows(decode_entries([1, 1], [0, 1], [good, corrupt], keep=[True, False]))
    assert [r["value"] for r in rows] == [b"a", b"b"]


@CODECS
@pytest.mark.parametrize("payload", [b"", b"\xff" * 9, b"garbage, not compressed at all" * 3])
def test_a_corrupt_compressed_entry_is_a_record_format_error(codec, payload):
    with pytest.raises(RecordFormatError, match="entry 1:0: .*(does not decompress|does not match)"):
        decode_entries([1], [0], [_batched_entry(codec, [b"x" * 50], payload=payload)])


@CODECS
@pytest.mark.parametrize("delta", [-1, 1])
def test_a_size_other_than_uncompressed_size_is_a_record_format_error(codec, delta):
    with pytest.raises(RecordFormatError, match="does not decompress|does not match"):
        decode_entries([1], [0], [_batched_entry(codec, [b"0123456789" * 20], size_delta=delta)])


@pytest.mark.parametrize("codec", [pb.ZLIB, pb.ZSTD], ids=["ZLIB", "ZSTD"])
def test_a_lying_uncompressed_size_is_refused_before_its_memory_is_taken(codec):
    """A few bytes claiming gigabytes (ZSTD: more than a zstd frame of that size can hold is
    refused before its buffer is allocated), or a small payload inflating to gigabytes (ZLIB:
    never inflated past uncompressed_size + 1): a RecordFormatError, at once."""
    import resource
    import time

    if codec == pb.ZSTD:
        payload, claimed = COMPRESS[codec](b"x"), 0xFFFFFFFF
    else:
        deflating, zeros = zlib.compressobj(9), bytes(1 << 20)
        payload = b"".join(deflating.compress(zeros) for _ in range(256)) + deflating.flush()
        claimed = 10                                            # ~250 KB inflating to 256 MiB
    md = message_metadata("p", 1, 5000, compression=codec, uncompressed_size=claimed)
    entry = encode_entry(headers_and_payload(md.SerializeToString(), payload), num_messages=1, publish_time=5000)
    peak, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
    with pytest.raises(RecordFormatError):
        decode_entries([1], [0], [entry])
    assert time.monotonic() - start < 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000          # KiB
