"""core_ext.batch against the pure-Python reference, protobuf itself and the brief's bytes."""

from __future__ import annotations

import struct

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_ext.batch import BatchFormatError, build_batch, decode_batch, single_payload_size, split_batch
from pyengine.protocol import pulsar_api_pb2 as pb
from tests.reference import batch as ref

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Observed batch of five (protocol brief, section 1.3): payload_size=3, sequence_id=i.
OBSERVED = b"".join(
    b"\x00\x00\x00\x04" + bytes([0x18, 0x03, 0x40, i]) + f"b-{i}".encode() for i in range(5))


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def payload_size_field(size: int) -> bytes:
    return tag(3, 0) + varint(size)


def _single_message_metadata_class():
    """SingleMessageMetadata as in the brief's table, built at run time for protobuf to encode."""
    fdp = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="core_ext_tests/single.proto", package="core_ext_tests", syntax="proto2")
    key_value = proto.message_type.add(name="KeyValue")
    key_value.field.add(name="key", number=1, type=fdp.TYPE_STRING, label=fdp.LABEL_REQUIRED)
    key_value.field.add(name="value", number=2, type=fdp.TYPE_STRING, label=fdp.LABEL_REQUIRED)
    single = proto.message_type.add(name="SingleMessageMetadata")
    fields = [
        ("properties", 1, fdp.TYPE_MESSAGE, fdp.LABEL_REPEATED),
        ("partition_key", 2, fdp.TYPE_STRING, fdp.LABEL_OPTIONAL),
        ("payload_size", 3, fdp.TYPE_INT32, fdp.LABEL_REQUIRED),
        ("compacted_out", 4, fdp.TYPE_BOOL, fdp.LABEL_OPTIONAL),
        ("event_time", 5, fdp.TYPE_UINT64, fdp.LABEL_OPTIONAL),
        ("partition_key_b64_encoded", 6, fdp.TYPE_BOOL, fdp.LABEL_OPTIONAL),
        ("ordering_key", 7, fdp.TYPE_BYTES, fdp.LABEL_OPTIONAL),
        ("sequence_id", 8, fdp.TYPE_UINT64, fdp.LABEL_OPTIONAL),
        ("null_value", 9, fdp.TYPE_BOOL, fdp.LABEL_OPTIONAL),
        ("null_partition_key", 10, fdp.TYPE_BOOL, fdp.LABEL_OPTIONAL),
    ]
    for name, number, kind, label in fields:
        field = single.field.add(name=name, number=number, type=kind, label=label)
        if kind == fdp.TYPE_MESSAGE:
            field.type_name = ".core_ext_tests.KeyValue"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("core_ext_tests.SingleMessageMetadata"))


SingleMessageMetadata = _single_message_metadata_class()

text = st.text(max_size=12)
u64 = st.integers(0, 2**64 - 1)


@st.composite
def protobuf_metadata(draw, payload_size: int) -> bytes:
    """SingleMessageMetadata serialized by protobuf, with a random selection of the fields."""
    message = SingleMessageMetadata(payload_size=payload_size)
    for key, value in draw(st.lists(st.tuples(text, text), max_size=3)):
        message.properties.add(key=key, value=value)
    optional = {
        "partition_key": text, "compacted_out": st.booleans(), "event_time": u64,
        "partition_key_b64_encoded": st.booleans(), "ordering_key": st.binary(max_size=12),
        "sequence_id": u64, "null_value": st.booleans(), "null_partition_key": st.booleans(),
    }
    for name, values in optional.items():
        if draw(st.booleans()):
            setattr(message, name, draw(values))
    return message.SerializeToString()


@st.composite
def raw_metadata(draw, payload_size: int) -> bytes:
    """Hand-assembled metadata: unknown fields of every wire type around payload_size, which
    may appear several times (the last one counts)."""
    def unknown_field():
        field = draw(st.integers(11, 2**29 - 1))
        kind = draw(st.sampled_from([0, 1, 2, 5]))
        if kind == 0:
            return tag(field, 0) + varint(draw(u64))
        if kind == 1:
            return tag(field, 1) + draw(st.binary(min_size=8, max_size=8))
        if kind == 5:
            return tag(field, 5) + draw(st.binary(min_size=4, max_size=4))
        blob = draw(st.binary(max_size=10))
        return tag(field, 2) + varint(len(blob)) + blob

    parts = [unknown_field() for _ in range(draw(st.integers(0, 4)))]
    for earlier in draw(st.lists(st.integers(-2**31, 2**31 - 1), max_size=2)):
        parts.insert(draw(st.integers(0, len(parts))), payload_size_field(earlier))
    parts.append(payload_size_field(payload_size))
    parts += [unknown_field() for _ in range(draw(st.integers(0, 2)))]
    return b"".join(parts)


@st.composite
def messages(draw):
    pairs = []
    for _ in range(draw(st.integers(0, 8))):
        payload = draw(st.binary(max_size=200))
        metadata = draw(st.one_of(protobuf_metadata(len(payload)), raw_metadata(len(payload))))
        pairs.append((metadata, payload))
    return pairs


def mutated(batch: bytes, data) -> bytes:
    """`batch` with one bit flipped, its tail cut off, or a few bytes inserted."""
    batch = bytearray(batch)
    pos = data.draw(st.integers(0, len(batch)))
    kind = data.draw(st.sampled_from(["flip", "truncate", "insert"]))
    if kind == "flip" and pos < len(batch):
        batch[pos] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "truncate":
        del batch[pos:]
    else:
        batch[pos:pos] = data.draw(st.binary(min_size=1, max_size=6))
    return bytes(batch)


def outcome(function, *args):
    try:
        return function(*args)
    except (BatchFormatError, ref.BatchFormatError):
        return BatchFormatError


# --- the brief's observed batch ----------------------------------------------------------

def test_observed_batch():
    pairs = split_batch(OBSERVED, 5)
    assert pairs == [(bytes([0x18, 0x03, 0x40, i]), f"b-{i}".encode()) for i in range(5)]
    assert single_payload_size(b"\x18\x03\x40\x00") == 3
    assert build_batch(pairs) == OBSERVED
    assert split_batch(OBSERVED) == ref.split_batch(OBSERVED, 5)


# --- differential and round-trip properties ----------------------------------------------

@given(messages())
@PROPERTY
def test_build_and_split_round_trip(pairs):
    batch = build_batch(pairs)
    assert batch == ref.build_batch(pairs)
    assert split_batch(batch) == pairs
    assert split_batch(batch, len(pairs)) == pairs
    assert ref.split_batch(batch, len(pairs)) == pairs


@given(st.integers(0, 2**31 - 1).flatmap(protobuf_metadata))
@PROPERTY
def test_payload_size_of_protobuf_encoded_metadata(metadata):
    expected = SingleMessageMetadata.FromString(metadata).payload_size
    assert single_payload_size(metadata) == expected == ref.single_payload_size(metadata)


@given(st.integers(-2**31, -1).flatmap(protobuf_metadata))
@PROPERTY
def test_negative_payload_size_is_rejected(metadata):
    with pytest.raises(BatchFormatError, match="negative"):
        single_payload_size(metadata)


@given(st.integers(0, 2**31 - 1).flatmap(raw_metadata))
@PROPERTY
def test_last_payload_size_wins_like_protobuf(metadata):
    expected = SingleMessageMetadata.FromString(metadata).payload_size
    assert single_payload_size(metadata) == expected == ref.single_payload_size(metadata)


@given(st.binary(max_size=40))
@PROPERTY
def test_payload_size_scan_on_random_bytes_matches_reference(metadata):
    assert outcome(single_payload_size, metadata) == outcome(ref.single_payload_size, metadata)


@given(st.binary(max_size=120), st.none() | st.integers(0, 6))
@PROPERTY
def test_split_on_random_bytes_matches_reference(payload, count):
    assert outcome(split_batch, payload, count) == outcome(ref.split_batch, payload, count)


@given(messages(), st.data())
@PROPERTY
def test_split_of_mutated_batches_matches_reference(pairs, data):
    batch = mutated(build_batch(pairs), data)
    count = data.draw(st.none() | st.just(len(pairs)))
    assert outcome(split_batch, batch, count) == outcome(ref.split_batch, batch, count)


# --- specific malformed input ------------------------------------------------------------

def test_empty_batch_and_empty_messages():
    assert split_batch(b"") == [] == split_batch(b"", 0)
    assert build_batch([]) == b""
    pairs = [(payload_size_field(0), b""), (payload_size_field(0) + tag(8, 0) + b"\x01", b"")]
    assert split_batch(build_batch(pairs), 2) == pairs


@pytest.mark.parametrize("payload", [
    b"\x00\x00\x00",                                            # size cut off
    b"\x00\x00\x00\x04\x18\x03",                                # metadata cut off
    b"\x00\x00\x00\x02\x18\x03" + b"ab",                        # payload cut off
    b"\x00\x00\x00\x02\x40\x01",                                # no payload_size
    b"\x00\x00\x00\x00",                                        # empty metadata
    OBSERVED + b"\x00",                                         # trailing byte
    OBSERVED[:-1],                                              # last payload cut off
])
def test_split_rejects_truncated_or_inconsistent_batches(payload):
    with pytest.raises(BatchFormatError):
        split_batch(payload)
    with pytest.raises(ref.BatchFormatError):
        ref.split_batch(payload)


@pytest.mark.parametrize("count", [0, 4, 6, 100])
def test_split_checks_the_announced_count(count):
    with pytest.raises(BatchFormatError, match="announced"):
        split_batch(OBSERVED, count)


def test_split_rejects_negative_count():
    with pytest.raises(BatchFormatError):
        split_batch(OBSERVED, -1)
    with pytest.raises(BatchFormatError):
        split_batch(b"", -5)


METADATA_ERRORS = {
    "missing": tag(8, 0) + b"\x01",
    "negative": payload_size_field(-1),
    "varint cut off": tag(3, 0) + b"\x80",
    "varint too long": tag(3, 0) + b"\x81" * 10 + b"\x01",
    "tag cut off": b"\x98",
    "length-delimited payload_size": tag(3, 2) + b"\x01\x05",
    "fixed32 payload_size": tag(3, 5) + b"\x05\x00\x00\x00",
    "group not closed": tag(9, 3) + payload_size_field(1),
    "group closed as another": tag(9, 3) + tag(10, 4) + payload_size_field(1),
    "end group": tag(9, 4) + payload_size_field(1),
    "wire type 6": tag(9, 6) + payload_size_field(1),
    "wire type 7": tag(9, 7) + payload_size_field(1),
    "field 0": tag(0, 0) + b"\x01" + payload_size_field(1),
    "tag beyond 32 bits": varint(1 << 35) + b"\x01" + payload_size_field(1),
    "string overruns": tag(2, 2) + b"\x05abc" + payload_size_field(1),
    "huge length": tag(2, 2) + varint(2**63) + payload_size_field(1),
    "fixed64 cut off": tag(9, 1) + b"\x00" * 7,
    "fixed32 cut off": tag(9, 5) + b"\x00" * 3,
}


@pytest.mark.parametrize("metadata", METADATA_ERRORS.values(), ids=METADATA_ERRORS.keys())
def test_malformed_single_metadata(metadata):
    with pytest.raises(BatchFormatError):
        single_payload_size(metadata)
    with pytest.raises(ref.BatchFormatError):
        ref.single_payload_size(metadata)
    batch = struct.pack(">I", len(metadata)) + metadata + b"x"
    with pytest.raises(BatchFormatError):
        split_batch(batch)


def test_payload_size_keeps_the_low_32_bits_like_protobuf():
    metadata = tag(3, 0) + varint(2**32 + 5)
    assert single_payload_size(metadata) == 5 == ref.single_payload_size(metadata)
    assert SingleMessageMetadata.FromString(metadata).payload_size == 5
    ten_byte = tag(3, 0) + b"\x85\x80\x80\x80\x80\x80\x80\x80\x80\x7f"   # bits past 64 dropped
    assert single_payload_size(ten_byte) == 5 == ref.single_payload_size(ten_byte)


def test_build_rejects_payload_size_mismatch():
    with pytest.raises(ValueError, match="payload_size"):
        build_batch([(payload_size_field(3), b"ab")])
    with pytest.raises(BatchFormatError):
        build_batch([(tag(8, 0) + b"\x01", b"")])


def test_build_accepts_bytes_likes_and_iterables():
    pairs = split_batch(OBSERVED)
    converted = ((bytearray(meta), memoryview(payload)) for meta, payload in pairs)
    assert build_batch(converted) == OBSERVED
    assert split_batch(bytearray(OBSERVED)) == pairs
    assert split_batch(memoryview(b"!" + OBSERVED)[1:], 5) == pairs
    assert single_payload_size(memoryview(b"\x18\x03")) == 3


@pytest.mark.parametrize("messages", [
    None,
    [b"not a pair"],
    [(b"\x18\x00",)],
    [("\x18\x00", b"")],
    [(b"\x18\x00", None)],
    [(b"\x18\x00", b"", b"")],
])
def test_build_rejects_malformed_arguments(messages):
    with pytest.raises((TypeError, ValueError)):
        build_batch(messages)


@pytest.mark.parametrize("function", [single_payload_size, split_batch])
def test_scanners_reject_non_bytes(function):
    for bad in ("\x18\x03", None, 3):
        with pytest.raises(TypeError):
            function(bad)


def test_split_rejects_non_int_count():
    with pytest.raises(TypeError):
        split_batch(OBSERVED, "5")


def test_batch_format_error_is_a_value_error():
    assert issubclass(BatchFormatError, ValueError)


# --- decode_batch: what a consumer reads of each message, against the protobuf runtime -------

def protobuf_decoding(payload, count=None):
    """decode_batch's oracle: split_batch, then the real SingleMessageMetadata of each message."""
    decoded = []
    for metadata, body in split_batch(payload, count):
        try:
            single = pb.SingleMessageMetadata.FromString(metadata)
        except Exception:                                # protobuf's DecodeError
            raise BatchFormatError("metadata does not parse") from None
        decoded.append((body, {kv.key: kv.value for kv in single.properties},
                        single.partition_key if single.HasField("partition_key") else None,
                        single.ordering_key if single.HasField("ordering_key") else None,
                        single.event_time, single.sequence_id if single.HasField("sequence_id") else None))
    return decoded


@given(messages(), st.booleans())
@PROPERTY
def test_decode_matches_protobuf(pairs, announce):
    batch = build_batch(pairs)
    count = len(pairs) if announce else None
    assert decode_batch(batch, count) == protobuf_decoding(batch, count)


@given(messages(), st.data())
@PROPERTY
def test_decode_of_mutated_batches_matches_protobuf(pairs, data):
    batch = mutated(build_batch(pairs), data)
    assert outcome(decode_batch, batch) == outcome(protobuf_decoding, batch)


def _one(metadata: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I", len(metadata)) + metadata + body


def test_decode_fields_of_the_wrong_wire_type_are_skipped_like_protobuf():
    # partition_key as a varint, sequence_id as a length-delimited blob: unknown fields to protobuf.
    metadata = payload_size_field(0) + tag(2, 0) + varint(5) + tag(8, 2) + varint(1) + b"x" + tag(5, 0) + varint(7)
    assert decode_batch(_one(metadata)) == protobuf_decoding(_one(metadata)) == [(b"", {}, None, None, 7, None)]


def test_decode_strings_that_are_not_utf8_come_back_as_bytes_like_protobuf():
    kv = tag(1, 2) + varint(2) + b"\xff\xfe" + tag(2, 2) + varint(1) + b"v"
    metadata = payload_size_field(0) + tag(1, 2) + varint(len(kv)) + kv + tag(2, 2) + varint(1) + b"\x80"
    assert decode_batch(_one(metadata)) == protobuf_decoding(_one(metadata)) == [
        (b"", {b"\xff\xfe": "v"}, b"\x80", None, 0, None)]


def _groups(field: int, depth: int) -> bytes:
    return tag(field, 3) * depth + tag(field, 4) * depth


def _property(kv: bytes) -> bytes:
    return tag(1, 2) + varint(len(kv)) + kv


@pytest.mark.parametrize("metadata", [
    payload_size_field(0) + _groups(14, 1),                                    # an empty group
    payload_size_field(0) + tag(14, 3) + tag(5, 0) + varint(9) + tag(14, 4),    # event_time inside: not the message's
    payload_size_field(0) + tag(14, 3) + tag(15, 3) + tag(2, 2) + varint(1) + b"x" + tag(15, 4) + tag(14, 4),
    payload_size_field(0) + _groups(5, 1) + tag(5, 0) + varint(3),             # a group on a known field's number
    payload_size_field(0) + _groups(14, 100),                                  # protobuf's deepest nesting
    payload_size_field(0) + _property(tag(1, 2) + varint(1) + b"k" + _groups(14, 99)),
    # Found by the mutation property: '0' is an unknown varint field, 's'/'t' open and close group 14.
    b"\n\x05\n\x010\x12\x00\n\x0e\n\x02\x12\n00000000st\x18\x00",
])
def test_decode_skips_unknown_groups_like_protobuf(metadata):
    expected = protobuf_decoding(_one(metadata))
    assert decode_batch(_one(metadata)) == expected
    assert split_batch(_one(metadata)) == ref.split_batch(_one(metadata))


def test_split_rejects_malformed_groups_like_the_reference():
    for metadata in (payload_size_field(0) + tag(14, 4), payload_size_field(0) + _groups(14, 101),
                     tag(14, 3) + payload_size_field(0)):
        with pytest.raises(BatchFormatError):
            split_batch(_one(metadata))
        with pytest.raises(ref.BatchFormatError):
            ref.split_batch(_one(metadata))


def test_decode_a_property_without_its_value_is_empty_like_protobuf():
    kv = tag(1, 2) + varint(1) + b"k"
    metadata = payload_size_field(0) + tag(1, 2) + varint(len(kv)) + kv
    assert decode_batch(_one(metadata)) == [(b"", {"k": ""}, None, None, 0, None)]


@pytest.mark.parametrize("metadata", [
    payload_size_field(0) + tag(1, 2) + varint(3) + tag(1, 2) + varint(9),      # a key overrunning its property
    payload_size_field(0) + tag(1, 2) + varint(2) + tag(1, 0) + b"\x80",          # a varint cut off inside it
    payload_size_field(0) + tag(1, 2) + varint(1) + b"\x00",                     # field number 0 inside it
    payload_size_field(0) + tag(2, 2) + varint(4) + b"ab",                       # a partition key cut off
    payload_size_field(0) + tag(1, 2) + varint(2) + tag(9, 3),                   # a group inside a property
    # malformed groups:
    payload_size_field(0) + tag(14, 4),                                        # an end without a start
    payload_size_field(0) + tag(14, 3),                                        # a start without an end
    payload_size_field(0) + tag(14, 3) + tag(15, 4),                           # closed as another group
    payload_size_field(0) + tag(14, 3) + tag(1, 7) + tag(14, 4),               # a bad wire type inside
    payload_size_field(0) + tag(14, 3) + tag(1, 2) + varint(5) + tag(14, 4),   # a field overrunning it
    payload_size_field(0) + _property(tag(14, 4)),                             # an end inside a property
    payload_size_field(0) + _groups(14, 101),                                  # nested too deep
    payload_size_field(0) + _property(_groups(14, 100)),                       # too deep inside a property
])
def test_decode_rejects_malformed_metadata_like_protobuf(metadata):
    with pytest.raises(BatchFormatError):
        decode_batch(_one(metadata))
    with pytest.raises(BatchFormatError):
        protobuf_decoding(_one(metadata))


def test_decode_checks_the_count_and_its_argument_like_split():
    assert decode_batch(OBSERVED, 5) == protobuf_decoding(OBSERVED, 5)
    assert [sequence for *_, sequence in decode_batch(OBSERVED)] == [0, 1, 2, 3, 4]
    with pytest.raises(BatchFormatError, match="announced"):
        decode_batch(OBSERVED, 4)
    with pytest.raises(BatchFormatError, match="negative"):
        decode_batch(OBSERVED, -1)
    with pytest.raises(TypeError):
        decode_batch("not bytes")
    assert decode_batch(b"") == []
