"""Pure-Python reference of ``core_ext.batch``, the oracle of the differential tests."""

from __future__ import annotations

import struct

PAYLOAD_SIZE_FIELD = 3
MAX_VARINT_BYTES = 10
MAX_NESTING = 100           # protobuf's (upb's) limit on nested groups and messages


class BatchFormatError(ValueError):
    pass


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """Return (value, position after the varint), keeping the low 64 bits like protobuf."""
    value = 0
    for i in range(MAX_VARINT_BYTES):
        if pos + i >= len(data):
            raise BatchFormatError("varint cut off")
        byte = data[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return value & 0xFFFF_FFFF_FFFF_FFFF, pos + i + 1
    raise BatchFormatError("varint longer than 10 bytes")


def _skip_group(data: bytes, pos: int, group: int, nesting_left: int) -> int:
    """Skip an unknown proto2 group, as protobuf does, up to its nesting limit."""
    if nesting_left <= 0:
        raise BatchFormatError("groups nested too deep")
    while pos < len(data):
        tag, pos = read_varint(data, pos)
        field, wire_type = tag >> 3, tag & 7
        if field == 0 or tag > 0xFFFF_FFFF:
            raise BatchFormatError("invalid tag")
        if wire_type == 4:
            if field != group:
                raise BatchFormatError("mismatched end of group")
            return pos
        pos = _skip_value(data, pos, field, wire_type, nesting_left - 1)
    raise BatchFormatError("group cut off")


def _skip_value(data: bytes, pos: int, field: int, wire_type: int, nesting_left: int) -> int:
    if wire_type == 0:
        return read_varint(data, pos)[1]
    if wire_type == 3:
        return _skip_group(data, pos, field, nesting_left)
    if wire_type == 1:
        length = 8
    elif wire_type == 2:
        length, pos = read_varint(data, pos)
    elif wire_type == 5:
        length = 4
    else:
        raise BatchFormatError("unsupported wire type")
    if length > len(data) - pos:
        raise BatchFormatError("field overruns the metadata")
    return pos + length


def single_payload_size(metadata) -> int:
    data = bytes(metadata)
    pos = 0
    payload_size = None
    while pos < len(data):
        tag, pos = read_varint(data, pos)
        field, wire_type = tag >> 3, tag & 7
        if field == 0 or tag > 0xFFFF_FFFF:
            raise BatchFormatError("invalid tag")
        if field == PAYLOAD_SIZE_FIELD:
            if wire_type != 0:
                raise BatchFormatError("payload_size is not a varint")
            value, pos = read_varint(data, pos)
            low = value & 0xFFFF_FFFF
            payload_size = low - (1 << 32) if low >= 1 << 31 else low
            continue
        pos = _skip_value(data, pos, field, wire_type, MAX_NESTING)
    if payload_size is None:
        raise BatchFormatError("no payload_size")
    if payload_size < 0:
        raise BatchFormatError("negative payload_size")
    return payload_size


def split_batch(payload, num_messages: int | None = None) -> list[tuple[bytes, bytes]]:
    if num_messages is not None and num_messages < 0:
        raise BatchFormatError("negative num_messages")
    data = bytes(payload)
    messages = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < 4:
            raise BatchFormatError("metadata size cut off")
        (metadata_size,) = struct.unpack_from(">I", data, pos)
        pos += 4
        if metadata_size > len(data) - pos:
            raise BatchFormatError("metadata overruns the batch")
        metadata = data[pos:pos + metadata_size]
        payload_size = single_payload_size(metadata)
        pos += metadata_size
        if payload_size > len(data) - pos:
            raise BatchFormatError("payload overruns the batch")
        messages.append((metadata, data[pos:pos + payload_size]))
        pos += payload_size
    if num_messages is not None and len(messages) != num_messages:
        raise BatchFormatError("message count differs from num_messages")
    return messages


def build_batch(messages) -> bytes:
    parts = []
    for metadata, payload in messages:
        metadata, payload = bytes(metadata), bytes(payload)
        if single_payload_size(metadata) != len(payload):
            raise BatchFormatError("payload_size differs from the payload length")
        parts += [struct.pack(">I", len(metadata)), metadata, payload]
    return b"".join(parts)
