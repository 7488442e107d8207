"""Build, serialize and parse ``BaseCommand`` envelopes and entry metadata.

Every frame carries one :class:`BaseCommand`: a ``type`` plus the body field whose field number
equals that type (the mapping is read from the generated descriptor, see :data:`BODY_FIELD`).
Anything that cannot be a valid command or metadata block -- undecodable bytes, missing required
fields, a type without its body -- raises :class:`ProtocolError` (a ``ValueError``), never a raw
protobuf exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, cast

from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError, Message

from pyengine.protocol import pulsar_api_pb2 as pb

__all__ = [
    "BODY_FIELD",
    "MARKER_PRODUCER_NAME",
    "ProtocolError",
    "base_command",
    "command_body",
    "marker_metadata",
    "message_metadata",
    "parse_command",
    "parse_message_metadata",
    "serialize_command",
]

Bytes = bytes | bytearray | memoryview

# What Apache's broker writes into transaction marker entries (and our default for them).
MARKER_PRODUCER_NAME: Final = "pulsar.txn.marker"
_MARKER_SEQUENCE_ID: Final = 2**64 - 1  # Apache writes sequence id -1 (as uint64) for markers
_TXN_MARKERS: Final = frozenset({pb.TXN_COMMITTING, pb.TXN_COMMIT, pb.TXN_ABORT})


class ProtocolError(ValueError):
    """Bytes or a message that do not form a valid command / metadata block."""


def _body_fields() -> dict[int, str]:
    """BaseCommand.Type value -> name of the body field with the same number (from the descriptor)."""
    descriptor = pb.BaseCommand.DESCRIPTOR
    mapping: dict[int, str] = {}
    for value in descriptor.enum_types_by_name["Type"].values:
        field = descriptor.fields_by_number.get(value.number)
        if field is None or field.message_type is None or field.containing_oneof is None:
            raise RuntimeError(f"pulsar_api.proto: BaseCommand.{value.name} has no body field {value.number}")
        mapping[value.number] = field.name
    return mapping


#: ``BaseCommand.Type`` number -> body field name, e.g. ``BODY_FIELD[pb.BaseCommand.PING] == "ping"``.
BODY_FIELD: Final[Mapping[int, str]] = MappingProxyType(_body_fields())


def _type_name(type_: int) -> str:
    return pb.BaseCommand.Type.Name(type_) if type_ in BODY_FIELD else str(type_)


def _resolve_type(type_: int | str) -> int:
    if isinstance(type_, str):
        if type_ not in pb.BaseCommand.Type.keys():
            raise ProtocolError(f"unknown command type {type_!r}")
        return pb.BaseCommand.Type.Value(type_)
    if type_ not in BODY_FIELD:
        raise ProtocolError(f"unknown command type {type_!r}")
    return int(type_)


def base_command(type_: int | str, /, **fields: Any) -> pb.BaseCommand:
    """A BaseCommand of ``type_`` (number or name) whose body is built from ``fields``.

    ``fields`` go to the body message's constructor (nested messages may be messages or dicts).
    The body is always present, even when empty (PING/PONG). Required fields are checked by
    :func:`serialize_command`, so a command may be completed after construction.
    """
    number = _resolve_type(type_)
    cmd = pb.BaseCommand(type=cast("pb.BaseCommand.Type", number))
    body = getattr(cmd, BODY_FIELD[number])
    body.SetInParent()
    if fields:
        body.MergeFrom(type(body)(**fields))
    return cmd


def _missing_required(msg: Message) -> list[str]:
    """Paths of unset required fields, e.g. ``["connect.client_version"]``."""
    find: Callable[[], list[str]] = getattr(msg, "FindInitializationErrors")  # not in the stubs
    return find()


def _check_command(cmd: pb.BaseCommand) -> None:
    if not cmd.HasField("type"):
        # proto2 enums are closed: an unknown type number is parsed into the unknown-field set
        ufs = unknown_fields.UnknownFieldSet(cmd)
        unknown = [ufs[i].data for i in range(len(ufs)) if ufs[i].field_number == 1]
        if unknown:
            raise ProtocolError(f"unsupported command type {unknown[-1]}")
        raise ProtocolError("command has no type (required field 'type' missing)")
    name = BODY_FIELD[cmd.type]
    present = cmd.WhichOneof("body")
    if present != name:
        found = f"; it carries '{present}' instead" if present else ""
        raise ProtocolError(f"{_type_name(cmd.type)} command without its '{name}' body{found}")
    missing = _missing_required(cmd)
    if missing:
        raise ProtocolError(f"{_type_name(cmd.type)} command missing required field(s): {', '.join(missing)}")


def serialize_command(cmd: pb.BaseCommand) -> bytes:
    """Encode a complete command (ProtocolError if its type, body or a required field is missing)."""
    _check_command(cmd)
    return cmd.SerializeToString()


def parse_command(data: Bytes) -> pb.BaseCommand:
    """Decode one serialized BaseCommand (without the frame's size prefixes) and validate it."""
    cmd = pb.BaseCommand()
    try:
        cmd.ParseFromString(cast(bytes, data))  # the runtime reads any buffer without copying
    except DecodeError as exc:
        raise ProtocolError(f"undecodable command ({len(data)} bytes): {exc}") from exc
    _check_command(cmd)
    return cmd


def command_body(cmd: pb.BaseCommand) -> Message:
    """The body message that ``cmd.type`` selects (ProtocolError if it is not set)."""
    if not cmd.HasField("type"):
        raise ProtocolError("command has no type")
    name = BODY_FIELD[cmd.type]
    if not cmd.HasField(name):
        raise ProtocolError(f"{_type_name(cmd.type)} command without its '{name}' body")
    body: Message = getattr(cmd, name)
    return body


def message_metadata(producer_name: str, sequence_id: int, publish_time: int, **fields: Any) -> pb.MessageMetadata:
    """MessageMetadata with its three required fields (publish_time in ms) plus any others."""
    return pb.MessageMetadata(
        producer_name=producer_name, sequence_id=sequence_id, publish_time=publish_time, **fields
    )


def parse_message_metadata(data: Bytes) -> pb.MessageMetadata:
    """Decode a MessageMetadata block; ProtocolError if undecodable or incomplete."""
    meta = pb.MessageMetadata()
    try:
        meta.ParseFromString(cast(bytes, data))
    except DecodeError as exc:
        raise ProtocolError(f"undecodable message metadata ({len(data)} bytes): {exc}") from exc
    missing = _missing_required(meta)
    if missing:
        raise ProtocolError(f"message metadata missing required field(s): {', '.join(missing)}")
    return meta


def marker_metadata(
    marker_type: int,
    txn_most: int,
    txn_least: int,
    *,
    producer_name: str = MARKER_PRODUCER_NAME,
    sequence_id: int = _MARKER_SEQUENCE_ID,
    publish_time: int | None = None,
) -> pb.MessageMetadata:
    """Metadata of a transaction marker entry (TXN_COMMITTING / TXN_COMMIT / TXN_ABORT).

    As Apache writes them: ``marker_type`` and both txnid halves set, producer "pulsar.txn.marker",
    sequence id 2^64-1, publish time now (ms) unless given. The entry has no payload.
    """
    if marker_type not in _TXN_MARKERS:
        raise ValueError(f"not a transaction marker type: {marker_type!r}")
    if publish_time is None:
        publish_time = time.time_ns() // 1_000_000
    return message_metadata(
        producer_name,
        sequence_id,
        publish_time,
        marker_type=marker_type,
        txnid_most_bits=txn_most,
        txnid_least_bits=txn_least,
    )
