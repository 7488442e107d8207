"""pyengine.protocol.commands: observed bytes, round trips, malformed input, transaction markers."""

import struct
import time
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import given, settings
from hypothesis import strategies as st

from pyengine.protocol import (
    ProtocolError,
    base_command,
    command_body,
    marker_metadata,
    message_metadata,
    parse_command,
    parse_message_metadata,
    pb,
    serialize_command,
)
from pyengine.protocol.commands import BODY_FIELD, MARKER_PRODUCER_NAME

# --- observed on the wire (brief, sections 1.1 and 1.3) -------------------------------------------

PING_FRAME = bytes.fromhex("00000009 00000005 08 12 92 01 00")
CONNECT_FRAME = (
    bytes.fromhex("00000029 00000025 0802 1221 0a11")
    + b"Pulsar-CPP-v4.2.0"
    + bytes.fromhex("2014 2a04")
    + b"none"
    + bytes.fromhex("5204 0801 1001")
)


def _command_bytes(frame: bytes) -> bytes:
    """Unwrap a simple command frame: totalSize, commandSize, command."""
    total, size = struct.unpack_from(">II", frame)
    assert total == len(frame) - 4 == size + 4
    return frame[8:]


def test_observed_ping_decodes_and_reencodes() -> None:
    data = _command_bytes(PING_FRAME)
    assert data == bytes.fromhex("0812920100")
    cmd = parse_command(data)
    assert cmd.type == pb.BaseCommand.PING == 18
    assert cmd.HasField("ping")
    assert cmd.ping.ByteSize() == 0
    assert cmd.ListFields()[1][0].number == 18
    assert serialize_command(cmd) == data
    assert serialize_command(base_command(pb.BaseCommand.PING)) == data
    assert serialize_command(base_command("PING")) == data


def test_observed_connect_decodes_and_reencodes() -> None:
    data = _command_bytes(CONNECT_FRAME)
    # "41 bytes" in the brief is the frame's totalSize field (everything after the first 4 bytes)
    assert struct.unpack_from(">I", CONNECT_FRAME)[0] == 41 and len(data) == 0x25 == 37
    cmd = parse_command(data)
    assert cmd.type == pb.BaseCommand.CONNECT == 2
    body = command_body(cmd)
    assert isinstance(body, pb.CommandConnect)
    assert body.client_version == "Pulsar-CPP-v4.2.0"
    assert body.protocol_version == 20
    assert body.auth_method_name == "none"
    assert body.feature_flags.supports_auth_refresh
    assert body.feature_flags.supports_broker_entry_metadata
    assert not body.feature_flags.HasField("supports_partial_producer")
    assert not body.feature_flags.HasField("supports_topic_watchers")
    assert [f.name for f, _ in body.ListFields()] == [
        "client_version", "protocol_version", "auth_method_name", "feature_flags",
    ]
    assert not body.HasField("auth_data") and not body.HasField("auth_method")
    assert serialize_command(cmd) == data
    rebuilt = base_command(
        pb.BaseCommand.CONNECT,
        client_version="Pulsar-CPP-v4.2.0",
        protocol_version=20,
        auth_method_name="none",
        feature_flags={"supports_auth_refresh": True, "supports_broker_entry_metadata": True},
    )
    assert serialize_command(rebuilt) == data


def test_observed_batch_single_message_metadata() -> None:
    # "00000004 1803 4000 "b-0"": payload_size=3 (field 3), sequence_id=0 (field 8)
    record = bytes.fromhex("00000004 1803 4000") + b"b-0"
    (size,) = struct.unpack_from(">I", record)
    single = pb.SingleMessageMetadata.FromString(record[4:4 + size])
    assert single.payload_size == 3
    assert single.HasField("sequence_id") and single.sequence_id == 0
    assert record[4 + size:4 + size + single.payload_size] == b"b-0"
    assert single.SerializeToString() == record[4:4 + size]


# --- a strategy for complete commands, derived from the descriptors -------------------------------

_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=20)
_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FieldDescriptor.TYPE_UINT64: st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_STRING: _TEXT,
    FieldDescriptor.TYPE_BYTES: st.binary(max_size=20),
    FieldDescriptor.TYPE_DOUBLE: st.floats(allow_nan=False),
}


def _value(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.message_type is not None:
        return _fields(field.message_type, depth + 1)
    if field.enum_type is not None:
        return st.sampled_from([value.number for value in field.enum_type.values])
    return _SCALARS[field.type]


def _body_descriptor(type_: int) -> Descriptor:
    descriptor = pb.BaseCommand.DESCRIPTOR.fields_by_number[type_].message_type
    assert descriptor is not None
    return descriptor


def _fields(message: Descriptor, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments for `message`: every required field, and some optional/repeated ones
    (only required ones below depth 2, which bounds the recursive MessageIdData)."""
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for field in message.fields:
        if field.is_required:
            required[field.name] = _value(field, depth)
        elif depth < 2:
            value = _value(field, depth)
            optional[field.name] = st.lists(value, max_size=3) if field.is_repeated else value
    return st.fixed_dictionaries(required, optional=optional)


COMMAND_TYPES = sorted(BODY_FIELD)


@st.composite
def commands(draw: st.DrawFn, types: list[int] = COMMAND_TYPES) -> pb.BaseCommand:
    type_ = draw(st.sampled_from(types))
    return base_command(type_, **draw(_fields(_body_descriptor(type_))))


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7


def test_strategy_covers_every_command_type() -> None:
    assert len(COMMAND_TYPES) == 60          # 54 + the scalable-topic commands 70-75
    assert COMMAND_TYPES == sorted(pb.BaseCommand.Type.values())


@settings(max_examples=400)
@given(commands())
def test_every_command_type_round_trips(cmd: pb.BaseCommand) -> None:
    data = serialize_command(cmd)
    parsed = parse_command(data)
    assert parsed == cmd
    assert serialize_command(parsed) == data
    body = command_body(parsed)
    assert body == getattr(cmd, BODY_FIELD[cmd.type])
    # On the wire: field 1 (varint) = type, then field <type> (length-delimited) = the body.
    tag, pos = _varint(data, 0)
    assert tag == (1 << 3) | 0
    type_value, pos = _varint(data, pos)
    assert type_value == cmd.type
    tag, pos = _varint(data, pos)
    assert tag == (cmd.type << 3) | 2
    length, pos = _varint(data, pos)
    assert data[pos:] == body.SerializeToString() and len(data) - pos == length


@pytest.mark.parametrize("type_", COMMAND_TYPES, ids=pb.BaseCommand.Type.Name)
def test_base_command_accepts_the_type_by_name(type_: int) -> None:
    by_name = base_command(pb.BaseCommand.Type.Name(type_))
    assert by_name == base_command(type_)
    assert by_name.type == type_
    assert by_name.WhichOneof("body") == BODY_FIELD[type_]
    assert command_body(by_name).DESCRIPTOR is pb.BaseCommand.DESCRIPTOR.fields_by_number[type_].message_type


@pytest.mark.parametrize("type_", [0, 1, 41, 64, 67, 69, 76, "WATCH_TOPIC_LIST", "ping"])
def test_base_command_rejects_unknown_types(type_: int | str) -> None:
    with pytest.raises(ProtocolError, match="unknown command type"):
        base_command(type_)


def test_serialize_refuses_incomplete_commands() -> None:
    with pytest.raises(ProtocolError, match=r"SEND command missing required field\(s\): send.sequence_id"):
        serialize_command(base_command(pb.BaseCommand.SEND, producer_id=1))
    with pytest.raises(ProtocolError, match="PONG command without its 'pong' body"):
        serialize_command(pb.BaseCommand(type=pb.BaseCommand.PONG))
    with pytest.raises(ProtocolError, match="no type"):
        serialize_command(pb.BaseCommand(ping={}))


# --- malformed input: ProtocolError and nothing else ------------------------------------------------

def _parse_or_protocol_error(data: bytes) -> None:
    try:
        cmd = parse_command(data)
    except ProtocolError:
        return
    # whatever decodes must be a complete, consistent command
    assert cmd.IsInitialized()
    assert cmd.WhichOneof("body") == BODY_FIELD[cmd.type]


@settings(max_examples=500)
@given(st.binary(max_size=64))
def test_random_bytes_raise_protocol_error_or_parse_cleanly(data: bytes) -> None:
    _parse_or_protocol_error(data)


@settings(max_examples=300)
@given(commands(), st.data())
def test_mutated_commands_raise_protocol_error_or_parse_cleanly(cmd: pb.BaseCommand, data: st.DataObject) -> None:
    raw = bytearray(serialize_command(cmd))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        match data.draw(st.sampled_from(["flip", "insert", "delete"])):
            case "flip":
                raw[pos] ^= data.draw(st.integers(1, 255))
            case "insert":
                raw.insert(pos, data.draw(st.integers(0, 255)))
            case "delete" if len(raw) > 1:
                del raw[pos]
    _parse_or_protocol_error(bytes(raw))


@settings(max_examples=200)
@given(commands())
def test_every_truncation_raises_protocol_error(cmd: pb.BaseCommand) -> None:
    data = serialize_command(cmd)
    for cut in range(len(data)):
        with pytest.raises(ProtocolError):
            parse_command(data[:cut])


_WITH_REQUIRED = [t for t in COMMAND_TYPES if any(f.is_required for f in _body_descriptor(t).fields)]


@settings(max_examples=300)
@given(st.data())
def test_missing_required_body_field_raises_protocol_error(data: st.DataObject) -> None:
    cmd = data.draw(commands(_WITH_REQUIRED))
    body = command_body(cmd)
    field = data.draw(st.sampled_from([f.name for f in body.DESCRIPTOR.fields if f.is_required]))
    body.ClearField(field)
    raw = cmd.SerializePartialToString()
    with pytest.raises(ProtocolError, match=rf"missing required field\(s\): .*{BODY_FIELD[cmd.type]}\.{field}"):
        parse_command(raw)


def test_missing_nested_required_field_raises_protocol_error() -> None:
    cmd = base_command(pb.BaseCommand.MESSAGE, consumer_id=1, message_id={"ledgerId": 7})
    with pytest.raises(ProtocolError, match=r"message.message_id.entryId"):
        parse_command(cmd.SerializePartialToString())


@pytest.mark.parametrize("type_", COMMAND_TYPES, ids=pb.BaseCommand.Type.Name)
def test_type_without_its_body_raises_protocol_error(type_: int) -> None:
    name = pb.BaseCommand.Type.Name(type_)
    bare = pb.BaseCommand(type=name).SerializePartialToString()
    with pytest.raises(ProtocolError, match=f"without its '{BODY_FIELD[type_]}' body"):
        parse_command(bare)
    other = pb.BaseCommand.PONG if type_ == pb.BaseCommand.PING else pb.BaseCommand.PING
    wrong = base_command(other)
    wrong.type = type_  # type: ignore[assignment]
    with pytest.raises(ProtocolError, match=f"carries '{BODY_FIELD[other]}' instead"):
        parse_command(wrong.SerializePartialToString())
    with pytest.raises(ProtocolError):
        command_body(pb.BaseCommand(type=name))


@pytest.mark.parametrize("number", [0, 1, 41, 64, 69, 76, 127, 300])
def test_unknown_type_number_raises_protocol_error(number: int) -> None:
    raw = b"\x08" + bytes(_encode_varint(number)) + b"\x92\x01\x00"
    with pytest.raises(ProtocolError, match=f"unsupported command type {number}"):
        parse_command(raw)


def _encode_varint(value: int) -> bytearray:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return out


def test_no_type_at_all_raises_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="no type"):
        parse_command(b"")
    with pytest.raises(ProtocolError, match="no type"):
        parse_command(bytes.fromhex("92 01 00"))  # a ping body without a type


def test_parse_accepts_buffers() -> None:
    data = _command_bytes(CONNECT_FRAME)
    expected = parse_command(data)
    assert parse_command(bytearray(data)) == expected
    assert parse_command(memoryview(CONNECT_FRAME)[8:]) == expected


# --- metadata and transaction markers ------------------------------------------------------------

def test_message_metadata_round_trip() -> None:
    meta = message_metadata(
        "prod-a", 5, 1_700_000_000_000,
        properties=[{"key": "k", "value": "v"}], partition_key="pk", num_messages_in_batch=3,
    )
    parsed = parse_message_metadata(meta.SerializeToString())
    assert parsed == meta
    assert (parsed.producer_name, parsed.sequence_id, parsed.publish_time) == ("prod-a", 5, 1_700_000_000_000)
    assert parsed.properties[0].key == "k" and parsed.num_messages_in_batch == 3


def test_parse_message_metadata_rejects_bad_input() -> None:
    with pytest.raises(ProtocolError, match="missing required field.*publish_time"):
        parse_message_metadata(pb.MessageMetadata(producer_name="p", sequence_id=1).SerializePartialToString())
    with pytest.raises(ProtocolError, match="undecodable"):
        parse_message_metadata(b"\x0a\x05ab")  # producer_name claims 5 bytes, has 2
    with pytest.raises(ProtocolError, match="missing required field"):
        parse_message_metadata(b"")


@settings(max_examples=300)
@given(st.binary(max_size=48))
def test_parse_message_metadata_random_bytes(data: bytes) -> None:
    try:
        meta = parse_message_metadata(data)
    except ProtocolError:
        return
    assert meta.IsInitialized()


@given(
    st.sampled_from([pb.TXN_COMMITTING, pb.TXN_COMMIT, pb.TXN_ABORT]),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
)
def test_marker_metadata_reads_back(marker: int, most: int, least: int) -> None:
    before = time.time_ns() // 1_000_000
    data = marker_metadata(marker, most, least).SerializeToString()
    after = time.time_ns() // 1_000_000
    meta = parse_message_metadata(data)
    assert meta.HasField("marker_type") and meta.marker_type == marker
    assert meta.HasField("txnid_most_bits") and meta.txnid_most_bits == most
    assert meta.HasField("txnid_least_bits") and meta.txnid_least_bits == least
    assert meta.producer_name == MARKER_PRODUCER_NAME == "pulsar.txn.marker"
    assert meta.sequence_id == 2**64 - 1
    assert before <= meta.publish_time <= after
    assert not meta.HasField("num_messages_in_batch")
    # field 20 (marker_type), varint: tag bytes a0 01, then the marker number
    assert bytes([0xA0, 0x01, marker]) in data


def test_marker_metadata_explicit_fields() -> None:
    meta = marker_metadata(pb.TXN_ABORT, 1, 2, producer_name="broker-1", sequence_id=9, publish_time=123)
    parsed = parse_message_metadata(meta.SerializeToString())
    assert (parsed.producer_name, parsed.sequence_id, parsed.publish_time) == ("broker-1", 9, 123)
    assert parsed.marker_type == 22 and (parsed.txnid_most_bits, parsed.txnid_least_bits) == (1, 2)


@pytest.mark.parametrize("marker", [0, 10, 13, 19, 23])
def test_marker_metadata_only_builds_transaction_markers(marker: int) -> None:
    with pytest.raises(ValueError, match="not a transaction marker"):
        marker_metadata(marker, 0, 0)
