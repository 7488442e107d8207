"""Stored entries: what one managed-ledger position holds.

An entry is stored as a fixed 32-byte header followed by the message exactly as a producer sent
it in its payload frame ("headers and payload": magic 0x0e01, CRC32C, metadata size, Pulsar
`MessageMetadata`, payload), so dispatch forwards it with the producer's own checksum. The header
repeats the few metadata fields the read path needs for every entry (transaction id, marker type,
batch size, publish time) so that neither the dispatcher nor the Spark reader parses protobuf
to decide visibility.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from core_ext.frames import crc32c
from core_ext.poskeys import unpack_position
from pyengine.storage.errors import CorruptRecordError
from pyengine_kernels import Position, TxnId

HEADER = struct.Struct(">BBHqqiq")     # version, flags, marker type, txn most, txn least, messages, publish ms
HEADER_VERSION = 1
NO_TXN = -1
CHECKSUM_MAGIC = b"\x0e\x01"
_U32 = struct.Struct(">I")

# MessageMetadata.marker_type values for transaction markers (Apache's PulsarMarkers.MarkerType).
MARKER_NONE = 0
MARKER_TXN_COMMITTING = 20
MARKER_TXN_COMMIT = 21
MARKER_TXN_ABORT = 22


def headers_and_payload(metadata: bytes, payload: bytes) -> bytes:
    """Magic, CRC32C, metadata size, metadata and payload, as in a Pulsar payload frame."""
    covered = _U32.pack(len(metadata)) + metadata + payload
    return CHECKSUM_MAGIC + _U32.pack(crc32c(covered)) + covered


def split_headers_and_payload(data: bytes | memoryview) -> tuple[bytes, bytes]:
    """(metadata, payload) of a stored message; the checksum, if any, is not re-verified."""
    view = memoryview(data)
    offset = 6 if view[:2] == CHECKSUM_MAGIC else 0
    if len(view) < offset + 4:
        raise CorruptRecordError("stored message is shorter than its headers")
    size = _U32.unpack_from(view, offset)[0]
    start = offset + 4
    if start + size > len(view):
        raise CorruptRecordError("stored message metadata overruns the entry")
    return bytes(view[start:start + size]), bytes(view[start + size:])


def encode_entry(data: bytes, txn_most: int = NO_TXN, txn_least: int = NO_TXN, marker_type: int = MARKER_NONE,
                 num_messages: int = 1, publish_time: int = 0) -> bytes:
    """The stored form of an entry: header, then the message bytes."""
    return _pack_header(HEADER_VERSION, 0, marker_type, txn_most, txn_least, num_messages, publish_time) + data


_pack_header = HEADER.pack


@dataclass(slots=True)
class Entry:
    """One entry read from a managed ledger."""

    position: Position
    data: bytes                  # headers and payload, as the producer sent them
    txn_most: int = NO_TXN
    txn_least: int = NO_TXN
    marker_type: int = MARKER_NONE
    num_messages: int = 1
    publish_time: int = 0

    @property
    def txn(self) -> TxnId | None:
        return TxnId(self.txn_most, self.txn_least) if self.txn_most >= 0 else None

    @property
    def is_marker(self) -> bool:
        return self.marker_type != MARKER_NONE

    def encode(self) -> bytes:
        return encode_entry(self.data, self.txn_most, self.txn_least, self.marker_type, self.num_messages,
                            self.publish_time)

    @classmethod
    def decode(cls, position: Position, value: bytes | memoryview) -> Entry:
        if len(value) < HEADER.size:
            raise CorruptRecordError(f"entry {position} is shorter than its header")
        version, _flags, marker, most, least, count, publish = HEADER.unpack_from(value)
        if version != HEADER_VERSION:
            raise CorruptRecordError(f"entry {position} has header version {version}")
        return cls(position, bytes(value[HEADER.size:]), most, least, marker, count, publish)


def publish_time_of(value: bytes | memoryview) -> int:
    """The publish time in a stored entry's header, without decoding the rest."""
    if len(value) < HEADER.size:
        raise CorruptRecordError("stored entry is shorter than its header")
    return HEADER.unpack_from(value)[6]


def read_entry_range(txn, db, prefix: bytes, start_key: bytes, end_key: bytes | None,
                     max_entries: int) -> list[Entry]:
    """Up to `max_entries` entries keyed `prefix` + position, from `start_key` to `end_key`
    (inclusive; None: to the prefix's end), in an LMDB read transaction `txn` (a ledger's
    entries, a compacted view's)."""
    entries: list[Entry] = []
    cursor = txn.cursor(db=db)
    if not cursor.set_range(start_key):
        return entries
    skip = len(prefix)
    for key, value in cursor:
        if not key.startswith(prefix) or (end_key is not None and key > end_key):
            break
        ledger_id, entry_id = unpack_position(key[skip:])
        entries.append(Entry.decode(Position(ledger_id, entry_id), value))
        if len(entries) >= max_entries:
            break
    return entries
