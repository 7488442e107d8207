"""Pure-Python reference of ``core_ext.frames``: the oracle of the differential tests and the
baseline of the frame-splitting benchmark. Plain ``struct`` code, written to be obviously right.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import google_crc32c

DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024 + 10 * 1024
MAGIC_CRC32C = 0x0E01
MAGIC_BROKER_ENTRY_METADATA = 0x0E02

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_MAGIC_AND_U32 = struct.Struct(">HI")


class FrameError(ValueError):
    pass


class FrameTooLarge(FrameError):
    pass


class ChecksumMismatch(FrameError):
    pass


class MalformedFrame(FrameError):
    pass


class PyFrame(NamedTuple):
    command: bytes
    broker_entry_metadata: bytes | None = None
    metadata: bytes | None = None
    payload: bytes | None = None
    checksum: int | None = None

    @property
    def is_payload(self) -> bool:
        return self.metadata is not None


def crc32c(data, value: int = 0) -> int:
    return google_crc32c.extend(value, bytes(data))


def _decode_body(body: bytes, verify: bool) -> PyFrame:
    """Decode a frame without its leading totalSize field."""
    size = len(body)
    if size < 4:
        raise MalformedFrame("no room for the command size")
    (command_size,) = _U32.unpack_from(body, 0)
    if command_size > size - 4:
        raise MalformedFrame("command overruns the frame")
    pos = 4 + command_size
    command = body[4:pos]
    if pos == size:
        return PyFrame(command)

    broker_entry_metadata = None
    if size - pos >= 2 and _U16.unpack_from(body, pos)[0] == MAGIC_BROKER_ENTRY_METADATA:
        if size - pos < 6:
            raise MalformedFrame("broker entry metadata size cut off")
        _, block_size = _MAGIC_AND_U32.unpack_from(body, pos)
        pos += 6
        if block_size > size - pos:
            raise MalformedFrame("broker entry metadata overruns the frame")
        broker_entry_metadata = body[pos:pos + block_size]
        pos += block_size

    checksum = None
    if size - pos >= 2 and _U16.unpack_from(body, pos)[0] == MAGIC_CRC32C:
        if size - pos < 6:
            raise MalformedFrame("checksum cut off")
        _, checksum = _MAGIC_AND_U32.unpack_from(body, pos)
        pos += 6
    checked_from = pos

    if size - pos < 4:
        raise MalformedFrame("metadata size cut off")
    (metadata_size,) = _U32.unpack_from(body, pos)
    pos += 4
    if metadata_size > size - pos:
        raise MalformedFrame("metadata overruns the frame")
    # Structure first, then the checksum: the order in which core_ext.frames reports errors.
    if verify and checksum is not None and google_crc32c.value(body[checked_from:]) != checksum:
        raise ChecksumMismatch("CRC32C mismatch")
    metadata = body[pos:pos + metadata_size]
    payload = body[pos + metadata_size:]
    return PyFrame(command, broker_entry_metadata, metadata, payload, checksum)


class PyFrameDecoder:
    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, verify_checksum: bool = True):
        if max_frame_size < 4:
            raise ValueError("max_frame_size must be at least 4")
        self._max_frame_size = max_frame_size
        self._verify = verify_checksum
        self._buffer = bytearray()
        self._failed = False

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data) -> list[PyFrame]:
        if self._failed:
            raise FrameError("decoder failed earlier")
        buffer = self._buffer
        buffer += data
        frames = []
        pos = 0
        try:
            while len(buffer) - pos >= 4:
                (body_size,) = _U32.unpack_from(buffer, pos)
                if body_size > self._max_frame_size:
                    raise FrameTooLarge("frame too large")
                end = pos + 4 + body_size
                if end > len(buffer):
                    break
                frames.append(_decode_body(bytes(buffer[pos + 4:end]), self._verify))
                pos = end
        except FrameError as exc:
            self._failed = True
            exc.frames = frames
            raise
        del buffer[:pos]
        return frames


def decode_frame(buf) -> PyFrame:
    buf = bytes(buf)
    if len(buf) < 4:
        raise MalformedFrame("no room for the total size")
    (body_size,) = _U32.unpack_from(buf, 0)
    if body_size != len(buf) - 4:
        raise MalformedFrame("total size does not match the buffer")
    return _decode_body(buf[4:], verify=True)


def encode_command(command) -> bytes:
    command = bytes(command)
    return struct.pack(">II", 4 + len(command), len(command)) + command


def encode_payload_frame(command, metadata, payload, broker_entry_metadata=None) -> bytes:
    command, metadata, payload = bytes(command), bytes(metadata), bytes(payload)
    checked = _U32.pack(len(metadata)) + metadata + payload
    block = b""
    if broker_entry_metadata is not None:
        broker_entry_metadata = bytes(broker_entry_metadata)
        block = _MAGIC_AND_U32.pack(MAGIC_BROKER_ENTRY_METADATA, len(broker_entry_metadata))
        block += broker_entry_metadata
    checksum = _MAGIC_AND_U32.pack(MAGIC_CRC32C, google_crc32c.value(checked))
    body = _U32.pack(len(command)) + command + block + checksum + checked
    return _U32.pack(len(body)) + body
