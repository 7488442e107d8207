"""core_ext.frames against the pure-Python reference, the protocol brief's bytes, and fuzzing."""

from __future__ import annotations

import itertools
import pickle
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_ext import frames as native
from core_ext.frames import (
    ChecksumMismatch,
    Frame,
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    MalformedFrame,
    crc32c,
    decode_frame,
    encode_command,
    encode_payload_frame,
)
from tests.reference import frames as ref

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Observed on the wire (protocol brief, section 1.1).
PING = bytes.fromhex("00000009 00000005 08 12 92 01 00")
CONNECT = (
    bytes.fromhex("00000029 00000025 0802 1221 0a11")
    + b"Pulsar-CPP-v4.2.0"
    + bytes.fromhex("2014 2a04")
    + b"none"
    + bytes.fromhex("5204 0801 1001")
)


def as_tuple(frame) -> tuple:
    """The observable content of a native or reference frame."""
    return (
        frame.command,
        frame.broker_entry_metadata,
        frame.metadata,
        frame.payload,
        frame.checksum,
        frame.is_payload,
    )


def unchecked_payload_frame(command: bytes, metadata: bytes, payload: bytes,
                            broker_entry_metadata: bytes | None = None) -> bytes:
    """A payload frame without the 0x0e01 checksum, as clients of protocol version < 6 send."""
    body = struct.pack(">I", len(command)) + command
    if broker_entry_metadata is not None:
        body += struct.pack(">HI", 0x0E02, len(broker_entry_metadata)) + broker_entry_metadata
    body += struct.pack(">I", len(metadata)) + metadata + payload
    return struct.pack(">I", len(body)) + body


def frame_of(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def feed_all(decoder, chunks) -> list:
    frames = []
    for chunk in chunks:
        frames += decoder.feed(chunk)
    return frames


def outcome(decoder, chunks) -> list:
    """What a decoder does with a chunked stream: the frames of each feed, then the error if any."""
    steps = []
    for chunk in chunks:
        try:
            steps.append([as_tuple(frame) for frame in decoder.feed(chunk)])
        except (FrameError, ref.FrameError) as error:
            steps.append(type(error).__name__)
            break
    return steps


def split_at(data: bytes, cuts) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


blobs = st.binary(max_size=40)


@st.composite
def encoded_frames(draw):
    """(wire bytes, expected content) of a simple or payload frame, built by the reference."""
    command = draw(blobs)
    if draw(st.booleans()):
        return ref.encode_command(command), (command, None, None, None, None, False)
    metadata = draw(blobs)
    payload = draw(st.binary(max_size=1500))
    block = draw(st.none() | blobs)
    if draw(st.booleans()):
        checksum = ref.crc32c(struct.pack(">I", len(metadata)) + metadata + payload)
        wire = ref.encode_payload_frame(command, metadata, payload, block)
    else:
        checksum = None
        wire = unchecked_payload_frame(command, metadata, payload, block)
    return wire, (command, block, metadata, payload, checksum, True)


@st.composite
def chunked(draw, data: bytes):
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=12))
    return split_at(data, cuts)


@st.composite
def chunked_stream(draw):
    frames = draw(st.lists(encoded_frames(), max_size=8))
    stream = b"".join(wire for wire, _ in frames)
    return frames, draw(chunked(stream))


# --- CRC32C ------------------------------------------------------------------------------

def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283


def test_crc32c_extends_a_running_value_over_any_bytes_like():
    running = crc32c(bytearray(b"1234"))
    running = crc32c(memoryview(b"xx5678xx")[2:6], running)
    assert crc32c(b"9", running) == 0xE3069283
    assert crc32c(b"") == 0
    assert crc32c(b"", 0xDEADBEEF) == 0xDEADBEEF


@given(st.binary(max_size=3000), st.integers(0, 2**32 - 1))
@PROPERTY
def test_crc32c_matches_google_crc32c(data, value):
    assert crc32c(data, value) == ref.crc32c(data, value)


def test_crc32c_rejects_bad_arguments():
    with pytest.raises(TypeError):
        crc32c("123456789")
    with pytest.raises(TypeError):
        crc32c(None)
    with pytest.raises(OverflowError):
        crc32c(b"x", -1)
    with pytest.raises(OverflowError):
        crc32c(b"x", 2**32)


# --- the brief's observed bytes ----------------------------------------------------------

def test_observed_ping():
    frame = decode_frame(PING)
    assert frame.command == bytes.fromhex("0812920100")
    assert not frame.is_payload
    assert (frame.metadata, frame.payload, frame.checksum, frame.broker_entry_metadata) == (
        None, None, None, None)
    assert encode_command(frame.command) == PING
    assert as_tuple(FrameDecoder().feed(PING)[0]) == as_tuple(frame)


def test_observed_connect():
    assert len(CONNECT) == 4 + 41            # "41 bytes" is the totalSize the frame announces
    frame = decode_frame(CONNECT)
    assert frame.command.startswith(b"\x08\x02\x12\x21")
    assert b"Pulsar-CPP-v4.2.0" in frame.command
    assert encode_command(frame.command) == CONNECT


# --- encoding ----------------------------------------------------------------------------

@given(blobs, blobs, st.binary(max_size=3000), st.none() | blobs)
@PROPERTY
def test_encoding_matches_reference_and_round_trips(command, metadata, payload, block):
    wire = encode_payload_frame(command, metadata, payload, block)
    assert wire == ref.encode_payload_frame(command, metadata, payload, block)
    frame = decode_frame(wire)
    checksum = ref.crc32c(struct.pack(">I", len(metadata)) + metadata + payload)
    assert as_tuple(frame) == (command, block, metadata, payload, checksum, True)
    assert encode_command(command) == ref.encode_command(command)
    assert decode_frame(encode_command(command)).command == command


def test_payload_frame_layout():
    wire = encode_payload_frame(b"C", b"MD", b"PAY", broker_entry_metadata=b"BE")
    checksum = crc32c(b"\x00\x00\x00\x02MDPAY")
    expected_body = (
        b"\x00\x00\x00\x01C" + b"\x0e\x02\x00\x00\x00\x02BE"
        + b"\x0e\x01" + struct.pack(">I", checksum) + b"\x00\x00\x00\x02MDPAY"
    )
    assert wire == frame_of(expected_body)


def test_encoders_accept_bytes_likes():
    wire = encode_payload_frame(bytearray(b"cmd"), memoryview(b"meta"), bytearray(b"data"),
                                memoryview(b"xbex")[1:3])
    assert wire == encode_payload_frame(b"cmd", b"meta", b"data", b"be")
    assert encode_command(memoryview(b"_ping_")[1:5]) == encode_command(b"ping")


@pytest.mark.parametrize("args", [
    ("cmd", b"m", b"p"),
    (b"cmd", None, b"p"),
    (b"cmd", b"m", 7),
    (b"cmd", b"m", b"p", "block"),
])
def test_encode_payload_frame_rejects_non_bytes(args):
    with pytest.raises(TypeError):
        encode_payload_frame(*args)


@pytest.mark.parametrize("command", ["ping", None, 18, [8, 18]])
def test_encode_command_rejects_non_bytes(command):
    with pytest.raises(TypeError):
        encode_command(command)


# --- decoding a stream -------------------------------------------------------------------

@given(chunked_stream())
@PROPERTY
def test_decoder_agrees_with_reference_on_any_chunking(case):
    frames, chunks = case
    expected = [content for _, content in frames]
    decoder = FrameDecoder()
    assert [as_tuple(f) for f in feed_all(decoder, chunks)] == expected
    assert decoder.buffered == 0
    assert [as_tuple(f) for f in feed_all(ref.PyFrameDecoder(), chunks)] == expected


def sample_stream() -> tuple[bytes, list[tuple]]:
    parts = [
        (PING, as_tuple(decode_frame(PING))),
        (encode_payload_frame(b"send", b"meta", b"payload"), None),
        (encode_payload_frame(b"", b"", b""), None),
        (encode_payload_frame(b"msg", b"m", b"p" * 70, b"broker"), None),
        (unchecked_payload_frame(b"old", b"md", b"no checksum"), None),
        (unchecked_payload_frame(b"old", b"md", b"", b"be"), None),
        (encode_command(b""), None),
    ]
    stream = b"".join(wire for wire, _ in parts)
    return stream, [as_tuple(ref.decode_frame(wire)) for wire, _ in parts]


def test_decoder_splits_at_every_byte_boundary():
    stream, expected = sample_stream()
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        first = decoder.feed(stream[:cut])
        complete = _complete_prefix(stream, cut)
        assert len(first) == len(complete)
        assert decoder.buffered == cut - sum(map(len, complete))
        rest = decoder.feed(stream[cut:])
        assert [as_tuple(f) for f in first + rest] == expected
        assert decoder.buffered == 0


def _complete_prefix(stream: bytes, cut: int) -> list[bytes]:
    """The complete frames within stream[:cut]."""
    frames, pos = [], 0
    while pos + 4 <= cut:
        end = pos + 4 + struct.unpack_from(">I", stream, pos)[0]
        if end > cut:
            break
        frames.append(stream[pos:end])
        pos = end
    return frames


def test_decoder_one_byte_at_a_time():
    stream, expected = sample_stream()
    decoder = FrameDecoder()
    frames = []
    for i in range(len(stream)):
        frames += decoder.feed(stream[i:i + 1])
    assert [as_tuple(f) for f in frames] == expected


def test_decoder_accepts_bytes_likes():
    stream, expected = sample_stream()
    decoder = FrameDecoder()
    frames = decoder.feed(bytearray(stream[:50]))
    frames += decoder.feed(memoryview(b"??" + stream[50:] + b"??")[2:-2])
    assert [as_tuple(f) for f in frames] == expected
    assert decoder.feed(b"") == []


def test_decoder_frames_do_not_alias_the_input():
    data = bytearray(encode_payload_frame(b"cmd", b"meta", b"payload"))
    frame = FrameDecoder().feed(data)[0]
    data[:] = bytes(len(data))
    assert (frame.command, frame.metadata, frame.payload) == (b"cmd", b"meta", b"payload")


def test_decoder_rejects_non_bytes_without_failing():
    decoder = FrameDecoder()
    for bad in ("text", None, 12, [1, 2]):
        with pytest.raises(TypeError):
            decoder.feed(bad)
    with pytest.raises(BufferError):
        decoder.feed(memoryview(PING * 2)[::2])
    assert as_tuple(decoder.feed(PING)[0]) == as_tuple(decode_frame(PING))


def test_large_frame_in_small_chunks():
    payload = bytes(range(256)) * 4096          # 1 MiB, above the retained-buffer size
    wire = encode_payload_frame(b"cmd", b"meta", payload)
    decoder = FrameDecoder()
    frames = []
    for i in range(0, len(wire), 4093):
        frames += decoder.feed(wire[i:i + 4093])
        assert decoder.buffered == (i + len(wire[i:i + 4093])) % len(wire)
    assert [f.payload for f in frames] == [payload]
    assert decoder.feed(PING)[0].command == decode_frame(PING).command


def test_decoder_default_limit_is_max_message_size_plus_padding():
    assert native.DEFAULT_MAX_FRAME_SIZE == 5 * 1024 * 1024 + 10 * 1024
    limit = native.DEFAULT_MAX_FRAME_SIZE
    assert FrameDecoder().feed(struct.pack(">I", limit)) == []
    with pytest.raises(FrameTooLarge):
        FrameDecoder().feed(struct.pack(">I", limit + 1))


def test_frame_too_large_is_raised_on_the_length_alone():
    decoder = FrameDecoder(max_frame_size=100)
    assert decoder.feed(frame_of(b"\x00\x00\x00\x60" + bytes(96))) != []
    assert decoder.feed(b"\x00\x00") == []
    with pytest.raises(FrameTooLarge):
        decoder.feed(b"\x00\x65")
    with pytest.raises(FrameTooLarge):
        FrameDecoder(max_frame_size=100).feed(PING + b"\xff\xff\xff\xff")


def test_decoder_is_poisoned_after_an_error():
    decoder = FrameDecoder()
    with pytest.raises(FrameTooLarge):
        decoder.feed(PING + b"\xff\xff\xff\xff")
    for data in (b"", PING):
        with pytest.raises(FrameError):
            decoder.feed(data)
    assert decoder.buffered == 0


def test_checksum_mismatch():
    wire = bytearray(encode_payload_frame(b"cmd", b"meta", b"payload"))
    wire[-1] ^= 0x01
    with pytest.raises(ChecksumMismatch):
        decode_frame(wire)
    decoder = FrameDecoder()
    with pytest.raises(ChecksumMismatch):
        decoder.feed(PING + wire)
    with pytest.raises(FrameError):
        decoder.feed(PING)
    frame = FrameDecoder(verify_checksum=False).feed(wire)[0]
    assert frame.payload == b"payloae"
    assert frame.checksum == crc32c(b"\x00\x00\x00\x04metapayload")


def test_checksum_valid_says_whether_the_checksum_was_verified():
    good = encode_payload_frame(b"cmd", b"meta", b"payload")
    assert decode_frame(good).checksum_valid is True
    assert FrameDecoder().feed(good)[0].checksum_valid is True
    assert FrameDecoder(verify_checksum=False).feed(good)[0].checksum_valid is None
    assert FrameDecoder().feed(unchecked_payload_frame(b"old", b"md", b"x"))[0].checksum_valid is None
    assert decode_frame(PING).checksum_valid is None


def test_checksum_errors_raise_is_the_default():
    bad = bytearray(encode_payload_frame(b"cmd", b"meta", b"payload"))
    bad[-1] ^= 0x01
    decoder = FrameDecoder(checksum_errors="raise")
    with pytest.raises(ChecksumMismatch):
        decoder.feed(bad)
    with pytest.raises(FrameError):
        decoder.feed(PING)


def test_checksum_errors_report_flags_the_frame_and_goes_on():
    good = encode_payload_frame(b"cmd", b"meta", b"payload")
    bad = bytearray(good)
    bad[-1] ^= 0x01
    stream = PING + bad + good
    decoder = FrameDecoder(checksum_errors="report")
    frames = decoder.feed(stream)
    assert [f.checksum_valid for f in frames] == [None, False, True]
    assert frames[1].payload == b"payloae"
    assert frames[1].checksum == crc32c(b"\x00\x00\x00\x04metapayload")
    # Byte by byte, every frame is completed in the decoder's pending buffer.
    assert [f.checksum_valid for f in feed_all(decoder, [stream[i:i + 1] for i in range(len(stream))])] == [
        None, False, True]
    unverified = FrameDecoder(verify_checksum=False, checksum_errors="report").feed(bad)[0]
    assert unverified.checksum_valid is None


def test_checksum_errors_report_still_stops_at_malformed_frames():
    decoder = FrameDecoder(checksum_errors="report")
    with pytest.raises(MalformedFrame):
        decoder.feed(MALFORMED["metadata overruns"])
    with pytest.raises(FrameError):
        decoder.feed(PING)


@pytest.mark.parametrize("mode", ["ignore", "RAISE", None])
def test_checksum_errors_must_be_raise_or_report(mode):
    with pytest.raises(ValueError):
        FrameDecoder(checksum_errors=mode)


def test_exception_hierarchy():
    for error in (FrameTooLarge, ChecksumMismatch, MalformedFrame):
        assert issubclass(error, FrameError)
    assert issubclass(FrameError, ValueError)


MALFORMED = {
    "no command size": frame_of(b"\x00\x00"),
    "empty frame": frame_of(b""),
    "command overruns": frame_of(b"\x00\x00\x00\x05" + b"abcd"),
    "one byte after the command": frame_of(b"\x00\x00\x00\x01c" + b"\x0e"),
    "checksum magic without checksum": frame_of(b"\x00\x00\x00\x01c" + b"\x0e\x01\x00\x00"),
    "checksum without metadata size": frame_of(
        b"\x00\x00\x00\x01c" + b"\x0e\x01\x00\x00\x00\x00" + b"\x00\x00"),
    "metadata overruns": frame_of(
        b"\x00\x00\x00\x01c" + b"\x0e\x01\x00\x00\x00\x00" + b"\x00\x00\x00\x09meta"),
    "unchecked metadata overruns": frame_of(b"\x00\x00\x00\x01c" + b"\x00\x00\x00\x09meta"),
    "broker entry metadata without size": frame_of(b"\x00\x00\x00\x01c" + b"\x0e\x02\x00\x00"),
    "broker entry metadata overruns": frame_of(
        b"\x00\x00\x00\x01c" + b"\x0e\x02\x00\x00\x01\x00" + b"be"),
    "nothing after broker entry metadata": frame_of(
        b"\x00\x00\x00\x01c" + b"\x0e\x02\x00\x00\x00\x02" + b"be"),
}


BROKEN = {**MALFORMED, "too large": struct.pack(">I", 1 << 20) + b"x" * 8,
          "bad checksum": encode_payload_frame(b"send", b"meta", b"payload")[:-1] + b"?"}


def frames_until_error(decoder, chunks) -> tuple[list, str | None]:
    """Every frame a decoder hands over, including those an error carries, and the error."""
    frames = []
    for chunk in chunks:
        try:
            frames += decoder.feed(chunk)
        except (FrameError, ref.FrameError) as error:
            return frames + list(error.frames), type(error).__name__
    return frames, None


@st.composite
def stream_with_a_broken_frame(draw):
    before = draw(st.lists(encoded_frames(), max_size=6))
    broken = draw(st.sampled_from(sorted(BROKEN)))
    after = draw(st.lists(encoded_frames(), max_size=2))
    stream = b"".join(wire for wire, _ in before) + BROKEN[broken] + b"".join(wire for wire, _ in after)
    return [content for _, content in before], broken, draw(chunked(stream))


@given(stream_with_a_broken_frame())
@PROPERTY
def test_the_frames_before_a_broken_one_are_handed_over(case):
    """However the stream is cut, the frames before a broken one reach the caller (returned
    by earlier feeds, or carried by the error of the feed that met it), and nothing after it;
    as Netty's decoders in a Pulsar broker pass on what they decoded before failing."""
    expected, broken, chunks = case
    error = "ChecksumMismatch" if broken == "bad checksum" else "FrameTooLarge" if broken == "too large" \
        else "MalformedFrame"
    for decoder in (FrameDecoder(max_frame_size=64 * 1024), ref.PyFrameDecoder(max_frame_size=64 * 1024)):
        frames, raised = frames_until_error(decoder, chunks)
        assert raised == error
        assert [as_tuple(frame) for frame in frames] == expected


def test_a_failed_feed_carries_no_frames_of_earlier_feeds():
    decoder = FrameDecoder()
    assert len(decoder.feed(PING)) == 1
    with pytest.raises(MalformedFrame) as raised:
        decoder.feed(PING + MALFORMED["command overruns"] + PING)
    assert [as_tuple(frame) for frame in raised.value.frames] == [as_tuple(decode_frame(PING))]
    with pytest.raises(FrameError) as again:
        decoder.feed(PING)              # poisoned: nothing decoded any more
    assert list(again.value.frames) == []


@pytest.mark.parametrize("wire", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frames(wire):
    with pytest.raises(MalformedFrame):
        decode_frame(wire)
    with pytest.raises(MalformedFrame):
        FrameDecoder().feed(PING + wire + PING)
    with pytest.raises(ref.MalformedFrame):
        ref.decode_frame(wire)


@pytest.mark.parametrize("buf", [b"", b"\x00\x00\x00", PING[:-1], PING + b"\x00", PING * 2])
def test_decode_frame_needs_exactly_one_frame(buf):
    with pytest.raises(MalformedFrame):
        decode_frame(buf)


@pytest.mark.parametrize("buf", ["ping", None, 9])
def test_decode_frame_rejects_non_bytes(buf):
    with pytest.raises(TypeError):
        decode_frame(buf)


@pytest.mark.parametrize("kwargs", [{"max_frame_size": 3}, {"max_frame_size": -1}])
def test_decoder_rejects_bad_limits(kwargs):
    with pytest.raises(ValueError):
        FrameDecoder(**kwargs)


def test_decoder_rejects_non_int_limit():
    with pytest.raises(TypeError):
        FrameDecoder(max_frame_size="big")


def test_frames_do_not_pickle():
    """Neither a frame nor a decoder: a frame's state restored by Cython's generated pickle
    support took its offsets unchecked, and a crafted one read far past its buffer (a segfault)."""
    frame = decode_frame(encode_payload_frame(b"cmd", b"meta", b"x", b"be"))
    for unpicklable in (frame, FrameDecoder()):
        with pytest.raises(TypeError):
            pickle.dumps(unpicklable)
    assert not hasattr(frame, "__setstate_cython__")


def test_frames_are_read_only_and_not_constructible():
    frame = decode_frame(encode_payload_frame(b"cmd", b"meta", b"x", b"be"))
    with pytest.raises(AttributeError):
        frame.payload = b"y"
    with pytest.raises(TypeError):
        Frame()
    assert repr(frame).startswith("<Frame command=3B broker_entry_metadata=2B metadata=4B")


# --- headers_and_payload and the lazily sliced fields -----------------------------------

def test_headers_and_payload_is_what_a_broker_stores():
    wire = encode_payload_frame(b"cmd", b"meta", b"payload", broker_entry_metadata=b"be")
    frame = decode_frame(wire)
    checksum = struct.pack(">I", crc32c(b"\x00\x00\x00\x04metapayload"))
    assert frame.headers_and_payload == b"\x0e\x01" + checksum + b"\x00\x00\x00\x04metapayload"
    assert wire.endswith(frame.headers_and_payload)
    unchecked = decode_frame(unchecked_payload_frame(b"old", b"md", b"data", b"be"))
    assert unchecked.headers_and_payload == b"\x00\x00\x00\x02mddata"
    assert decode_frame(PING).headers_and_payload is None


@given(encoded_frames())
@PROPERTY
def test_headers_and_payload_matches_the_fields(case):
    wire, (command, block, metadata, payload, checksum, is_payload) = case
    frame = decode_frame(wire)
    if not is_payload:
        assert frame.headers_and_payload is None
        return
    header = b"" if checksum is None else struct.pack(">HI", 0x0E01, checksum)
    assert frame.headers_and_payload == header + struct.pack(">I", len(metadata)) + metadata + payload


def test_metadata_and_payload_are_sliced_once():
    frame = decode_frame(encode_payload_frame(b"cmd", b"meta", b"payload"))
    assert frame.payload is frame.payload
    assert frame.metadata is frame.metadata
    assert type(frame.payload) is bytes and type(frame.headers_and_payload) is bytes


# --- fuzzing: garbage and mutated streams ------------------------------------------------

@given(st.data(), st.binary(max_size=400),
       st.sampled_from([64, 1000, native.DEFAULT_MAX_FRAME_SIZE]), st.booleans())
@PROPERTY
def test_random_bytes_behave_like_the_reference(data, garbage, limit, verify):
    chunks = data.draw(chunked(garbage))
    assert outcome(FrameDecoder(limit, verify), chunks) == outcome(
        ref.PyFrameDecoder(limit, verify), chunks)


MUTATIONS = ["flip", "truncate", "insert", "huge_length", "delete"]


@st.composite
def mutated_stream(draw):
    frames = draw(st.lists(encoded_frames(), min_size=1, max_size=5))
    stream = bytearray(b"".join(wire for wire, _ in frames))
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, len(stream)))
        kind = draw(st.sampled_from(MUTATIONS))
        if kind == "flip" and pos < len(stream):
            stream[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del stream[pos:]
        elif kind == "insert":
            stream[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "huge_length":
            stream[pos:pos + 4] = struct.pack(">I", draw(st.integers(2**20, 2**32 - 1)))
        elif kind == "delete":
            del stream[pos:pos + draw(st.integers(1, 8))]
    return bytes(stream)


@given(st.data(), mutated_stream(), st.booleans())
@PROPERTY
def test_mutated_streams_behave_like_the_reference(data, stream, verify):
    chunks = data.draw(chunked(stream))
    assert outcome(FrameDecoder(verify_checksum=verify), chunks) == outcome(
        ref.PyFrameDecoder(verify_checksum=verify), chunks)


@st.composite
def corrupted_checksums(draw):
    """(stream, expected checksum_valid per frame): payload frames whose last byte (metadata or
    payload, never a size) may be flipped, which only a checksum can tell."""
    stream, expected = b"", []
    for wire, (_, _, metadata, payload, checksum, is_payload) in draw(
            st.lists(encoded_frames(), max_size=6)):
        flip = is_payload and len(metadata) + len(payload) > 0 and draw(st.booleans())
        if flip:
            wire = wire[:-1] + bytes([wire[-1] ^ 0x80])
        stream += wire
        expected.append(None if checksum is None else not flip)
    return stream, expected


@given(st.data(), corrupted_checksums())
@PROPERTY
def test_report_mode_decodes_like_an_unverifying_reference(data, case):
    stream, expected = case
    chunks = data.draw(chunked(stream))
    frames = feed_all(FrameDecoder(checksum_errors="report"), chunks)
    assert [as_tuple(f) for f in frames] == [
        as_tuple(f) for f in feed_all(ref.PyFrameDecoder(verify_checksum=False), chunks)]
    assert [f.checksum_valid for f in frames] == expected


@given(mutated_stream())
@PROPERTY
def test_decode_frame_on_mutated_input_behaves_like_the_reference(stream):
    try:
        expected = as_tuple(ref.decode_frame(stream))
    except ref.FrameError as error:
        expected = type(error).__name__
    try:
        actual = as_tuple(decode_frame(stream))
    except FrameError as error:
        actual = type(error).__name__
    assert actual == expected

