"""Findings of the native-kernels review (core_ext): each test failed before its fix."""

from __future__ import annotations

import resource
import time
import zlib

import pytest

from core_ext.records import RecordFormatError, decode_entries, decompress
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import encode_entry, headers_and_payload
from tests.core_ext.test_records import _varint, column_rows
from tests.reference import records as ref


def _entry(extra_metadata: bytes, payload: bytes) -> bytes:
    """A plain message whose metadata is followed by `extra_metadata` (raw protobuf fields)."""
    metadata = message_metadata("p", 1, 5000).SerializeToString() + extra_metadata
    return encode_entry(headers_and_payload(metadata, payload), num_messages=1, publish_time=5000)


_COMPRESSION, _UNCOMPRESSED_SIZE = b"\x40", b"\x48"       # tags of fields 8 and 9 (varints)


@pytest.mark.parametrize("extra, payload", [
    (_COMPRESSION + b"\x02" + _UNCOMPRESSED_SIZE + _varint((1 << 32) + 5), zlib.compress(b"hello")),
    (_COMPRESSION + b"\x07", b"hello"),
    (_COMPRESSION + b"\x02" + _UNCOMPRESSED_SIZE + b"\x05" + _COMPRESSION + b"\x07", zlib.compress(b"hello")),
    (_COMPRESSION + _varint((1 << 32) + 2) + _UNCOMPRESSED_SIZE + b"\x05", zlib.compress(b"hello")),
    (_COMPRESSION + _varint((1 << 64) - 1), b"hello"),
], ids=["uncompressed_size past 32 bits", "unknown codec", "unknown codec after ZLIB",
        "codec past 32 bits", "codec -1"])
def test_compression_fields_are_read_like_protobuf(extra, payload):
    """`uncompressed_size` is a uint32 and `compression` a proto2 enum: protobuf keeps a varint's
    low 32 bits, and an enum value it does not know goes to the unknown fields (the field keeps
    what it had, NONE by default). The decoder read both as 64-bit numbers and refused these
    entries ("codec 7 is not supported", "does not match uncompressed_size"), so a Spark read
    failed on messages the consumers read."""
    entry = _entry(extra, payload)
    assert column_rows(decode_entries([1], [0], [entry])) == ref.decode_entries([1], [0], [entry])


def _zlib_bomb() -> bytes:
    deflating, zeros = zlib.compressobj(9), bytes(1 << 20)
    return b"".join(deflating.compress(zeros) for _ in range(256)) + deflating.flush()   # 256 MiB


def test_zlib_claim_past_32_bits_is_refused_before_inflating():
    """An uncompressed_size of 2**64 - 1 made the inflate limit `uncompressed_size + 1` wrap to
    0, which zlib reads as "no limit": a small payload inflated in full (here 256 MiB; gigabytes
    for larger ones) before the size check refused it. MessageMetadata's uncompressed_size is a
    uint32, so anything larger is refused up front, as the other codecs already were."""
    bomb = _zlib_bomb()
    peak, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
    with pytest.raises(RecordFormatError):
        decompress(pb.ZLIB, bomb, (1 << 64) - 1)
    assert time.monotonic() - start < 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 100_000          # KiB


@pytest.mark.parametrize("field, value", [
    ("publish_time", 1 << 62),
    ("publish_time", (1 << 64) - 1),
    ("event_time", 1 << 62),
    ("event_time", (1 << 63) + 7),
])
def test_times_past_the_microsecond_range_are_refused_not_wrapped(field, value):
    """Times are milliseconds (uint64) turned into int64 microseconds: a producer's
    publish_time of 2**62 ms came out as 0 (the product wrapped), an event_time of 2**63 + 7 as
    7000, silently. Such a time has no timestamp (Spark's own conversion fails on it): the
    entry is refused with a RecordFormatError naming it."""
    fields = {"publish_time": 5000, field: value}
    md = message_metadata("p", 1, fields.pop("publish_time"), **fields)
    entry = encode_entry(headers_and_payload(md.SerializeToString(), b"x"), num_messages=1, publish_time=5000)
    with pytest.raises(RecordFormatError, match=f"entry 7:3: {field}"):
        decode_entries([7], [3], [entry])


def test_times_at_the_edge_of_the_microsecond_range_still_decode():
    """The largest millisecond count whose microseconds fit an int64 is kept exactly."""
    edge = (2**63 - 1) // 1000
    md = message_metadata("p", 1, edge, event_time=edge)
    entry = encode_entry(headers_and_payload(md.SerializeToString(), b"x"), num_messages=1, publish_time=5000)
    columns = decode_entries([7], [3], [entry])
    assert columns["publish_time"].tolist() == columns["event_time"].tolist() == [edge * 1000]
