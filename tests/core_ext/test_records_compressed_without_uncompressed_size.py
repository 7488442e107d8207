"""A compressed message whose metadata has no uncompressed_size (protobuf's default, 0).

Pulsar's producers always set it; its consumers decode into a buffer of uncompressed_size
bytes (Java's CompressionCodec.decode, C++'s CompressionCodec::decode), so such a message
decodes to nothing or is discarded as corrupt. The decoder inflated it whole, with no bound: a
64 KB ZLIB payload made 64 MiB (a few more, gigabytes or a MemoryError), at every read of its
topic. It is now held to 0 bytes, except a zstd frame or raw snappy block that states its own size (as the
consumer's decoder has it, `tests/client/test_compression_codecs.py`), which is held to that
and checked as an uncompressed_size is.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc
import zlib
from pathlib import Path

import cramjam
import pytest

from core_ext.records import RecordFormatError, decode_entries, decompress
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import encode_entry, headers_and_payload
from tests.core_ext.test_records import column_rows

BOMB_SIZE = 64 << 20


def _entry(codec: int, payload: bytes, **fields) -> bytes:
    md = message_metadata("p", 1, 5000, compression=codec, **fields)
    return encode_entry(headers_and_payload(md.SerializeToString(), payload), publish_time=5000)


def _zlib_bomb() -> bytes:
    deflating, zeros = zlib.compressobj(9), bytes(1 << 20)
    return b"".join(deflating.compress(zeros) for _ in range(BOMB_SIZE >> 20)) + deflating.flush()


def _zstd_streamed(data: bytes) -> bytes:
    compressing = cramjam.zstd.Compressor()
    compressing.compress(data)
    return bytes(compressing.finish())


def _zstd_bomb_without_its_size() -> bytes:
    frame = _zstd_streamed(bytes(BOMB_SIZE))         # streamed: the header states no size
    assert frame[4] >> 6 == 0 and not frame[4] & 0x20    # no content size field
    return frame


def _refused_at_once(call) -> RecordFormatError:
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(RecordFormatError) as caught:
            call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - start < 1.0
    assert peak < 4 << 20, f"{peak} bytes allocated to refuse a small payload"
    return caught.value


@pytest.mark.parametrize("codec, bomb", [(pb.ZLIB, _zlib_bomb), (pb.ZSTD, _zstd_bomb_without_its_size)],
                         ids=["ZLIB", "ZSTD"])
def test_a_bomb_without_uncompressed_size_is_refused_before_it_inflates(codec, bomb):
    payload = bomb()
    error = _refused_at_once(lambda: decode_entries([4], [9], [_entry(codec, payload)]))
    assert str(error).startswith("entry 4:9: ")
    _refused_at_once(lambda: decompress(codec, payload, 0))


@pytest.mark.parametrize("codec, compress", [
    (pb.ZLIB, zlib.compress),
    (pb.LZ4, lambda data: bytes(cramjam.lz4.compress_block(data, store_size=False))),
    (pb.ZSTD, _zstd_streamed),                      # a frame that does not state its size
], ids=["ZLIB", "LZ4", "ZSTD"])
def test_a_payload_without_uncompressed_size_decompresses_to_nothing(codec, compress):
    assert column_rows(decode_entries([1], [0], [_entry(codec, compress(b""))]))[0]["value"] == b""
    with pytest.raises(RecordFormatError, match="entry 1:0: .*(does not decompress|does not match)"):
        decode_entries([1], [0], [_entry(codec, compress(b"not nothing"))])


@pytest.mark.parametrize("payload", [b"", zlib.compress(b"abc")[:-6], b"\xff" * 9])
def test_a_cut_or_corrupt_zlib_payload_without_uncompressed_size_is_refused(payload):
    with pytest.raises(RecordFormatError, match="entry 1:0: .*(does not decompress|does not match)"):
        decode_entries([1], [0], [_entry(pb.ZLIB, payload)])


@pytest.mark.parametrize("codec", [pb.ZSTD, pb.SNAPPY], ids=["ZSTD", "SNAPPY"])
def test_a_zstd_frame_or_snappy_block_is_held_to_the_size_it_states(codec):
    plain = bytes(range(256)) * 40
    payload = bytes(cramjam.zstd.compress(plain) if codec == pb.ZSTD else cramjam.snappy.compress_raw(plain))
    assert column_rows(decode_entries([1], [0], [_entry(codec, payload)]))[0]["value"] == plain
    if codec == pb.ZSTD:                    # single segment, 2-byte content size (+256)
        assert payload[4] >> 5 == 0b011
        lying = payload[:5] + (len(plain) - 256 - 1).to_bytes(2, "little") + payload[7:]
    else:
        assert payload[:2] == bytes([len(plain) & 0x7F | 0x80, len(plain) >> 7])
        lying = bytes([(len(plain) - 1) & 0x7F | 0x80, (len(plain) - 1) >> 7]) + payload[2:]
    with pytest.raises(RecordFormatError, match="entry 1:0: .*(does not decompress|does not match)"):
        decode_entries([1], [0], [_entry(codec, lying)])


@pytest.mark.parametrize("given", [True, False], ids=["uncompressed_size", "none"])
def test_a_snappy_block_stating_more_than_it_can_hold_is_refused_before_its_memory_is_taken(given):
    """Raw snappy makes 64 bytes of a 3-byte copy at most: a block of a few bytes stating
    512 MiB (as does its uncompressed_size, or without one) is refused before 512 MiB are
    allocated."""
    stated = 512 << 20
    preamble = bytes([0x80, 0x80, 0x80, 0x80, stated >> 28])
    assert cramjam.snappy.decompress_raw_len(preamble + b"\x00x") == stated
    fields = {"uncompressed_size": stated} if given else {}
    _refused_at_once(lambda: decode_entries([1], [0], [_entry(pb.SNAPPY, preamble + b"\x00x", **fields)]))


# A child whose address space is capped at 2 GiB: there a block stating 4 GiB, decompressed
# whole, aborted the process (a failed allocation in cramjam) before it was found corrupt.
_CHILD = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from core_ext.records import RecordFormatError, decompress
try:
    decompress(4, bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F]) + b"\\x00x", 0)
except RecordFormatError as exc:
    print(exc)
"""


def test_a_snappy_block_stating_4_gib_without_uncompressed_size_is_refused_under_a_memory_limit():
    child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120,
                           cwd=Path(__file__).resolve().parents[2])
    assert child.returncode == 0, child.stderr[-2000:]
    assert "does not decompress to its uncompressed_size of 4294967295 bytes" in child.stdout
