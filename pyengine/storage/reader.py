"""Read-only access to a data dir's stored topics, for tools that run beside the broker.

`ManagedLedger.open` is the broker's way in: it recovers and starts a new ledger, so it writes.
A `StoreReader` only reads. It opens the LMDB environment read-only (no second writer, safe
while a broker serves the same data dir from another process: LMDB readers never block the
writer and always see a committed state), and each `view()` is one LMDB read transaction, so
everything read through one view is a consistent snapshot.

Ledger ranges come from the entries database itself rather than from the ledger records: the
record of a ledger the broker still writes to says nothing of its entries until it is closed,
and entries in LMDB are durable the moment they are there.

One environment per process: LMDB forbids opening the same environment twice in a process,
so a `StoreReader` must not be opened where a broker or another reader of the same data dir
is open. Open it, read, close it (it is a context manager).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

from core_ext.poskeys import pack_i64, pack_position, unpack_position
from pyengine.storage.entry import HEADER, HEADER_VERSION, Entry
from pyengine.storage.environment import StorageEnvironment
from pyengine.storage.errors import CorruptRecordError, DataDirNotFoundError, StorageError
from pyengine.storage.records_pb2 import LedgerRecord, TopicRecord
from pyengine_kernels import Position

_KEY_SIZE = 24          # 8-byte topic prefix + 16-byte position
_COUNTER = struct.Struct(">q")


class TopicNotStoredError(StorageError, KeyError):
    """No topic of that name is stored in the data dir."""

    def __str__(self) -> str:          # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True, slots=True)
class LedgerRange:
    """One ledger of a topic and the entries it holds now: `first_entry..last_entry` inclusive
    (`entries == 0` and both -1 when it holds none)."""

    ledger_id: int
    first_entry: int
    last_entry: int
    entries: int
    closed: bool

    @property
    def first(self) -> Position:
        return Position(self.ledger_id, self.first_entry)

    @property
    def last(self) -> Position:
        return Position(self.ledger_id, self.last_entry)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A stored topic: its id (the key prefix of everything it stores), properties, ledgers."""

    name: str
    topic_id: int
    properties: dict[str, str] = field(default_factory=dict)
    ledgers: tuple[LedgerRange, ...] = ()
    terminated_at: Position | None = None
    # The last position retention deleted (None: none, or trimmed before it was recorded).
    trimmed_through: Position | None = None

    @property
    def prefix(self) -> bytes:
        return pack_i64(self.topic_id)

    @property
    def first_position(self) -> Position | None:
        """The first entry still stored (None when the topic holds none)."""
        return next((ledger.first for ledger in self.ledgers if ledger.entries), None)

    @property
    def last_position(self) -> Position:
        """The last entry stored (the broker's last-add-confirmed as durable in LMDB), or
        `(last ledger, -1)` when the topic holds no entry."""
        for ledger in reversed(self.ledgers):
            if ledger.entries:
                return ledger.last
        return Position(self.ledgers[-1].ledger_id, -1) if self.ledgers else Position.EARLIEST

    @property
    def entries(self) -> int:
        return sum(ledger.entries for ledger in self.ledgers)

    def previous_position(self, position: Position) -> Position:
        """The last entry before `position` (as `ManagedLedger.previous_position`): the entry
        before it in its ledger, else the last entry of the previous non-empty ledger, else
        `(ledger, -1)`."""
        if position.entry_id > 0:
            return Position(position.ledger_id, position.entry_id - 1)
        previous = None
        for ledger in self.ledgers:
            if ledger.ledger_id >= position.ledger_id:
                break
            if ledger.entries:
                previous = ledger.last
        return previous if previous is not None else position.prev()


class ReadView:
    """Everything read through one view comes from one LMDB read transaction."""

    def __init__(self, reader: StoreReader, txn: lmdb.Transaction) -> None:
        self._reader = reader
        self._txn = txn

    # --- topics ---------------------------------------------------------------------------

    def topic_names(self) -> list[str]:
        """Every stored topic, in name order."""
        cursor = self._txn.cursor(db=self._reader.env.db("topics"))
        return [bytes(key).decode() for key in cursor.iternext(values=False)]

    def topic(self, name: str) -> TopicInfo:
        raw = self._txn.get(name.encode(), db=self._reader.env.db("topics"))
        if raw is None:
            raise TopicNotStoredError(f"no topic {name!r} is stored in {self._reader.path}")
        try:
            record = TopicRecord.FromString(bytes(raw))
        except Exception as exc:  # protobuf's DecodeError
            raise CorruptRecordError(f"topic record of {name!r}: {exc}") from exc
        terminated = (Position(record.terminated_at.ledger_id, record.terminated_at.entry_id)
                      if record.HasField("terminated_at") else None)
        trimmed = (Position(record.trimmed_through.ledger_id, record.trimmed_through.entry_id)
                   if record.HasField("trimmed_through") else None)
        return TopicInfo(record.name, record.topic_id, dict(record.properties),
                         tuple(self._ledgers(record.topic_id)), terminated, trimmed)

    def _ledgers(self, topic_id: int) -> Iterator[LedgerRange]:
        prefix = pack_i64(topic_id)
        records = self._txn.cursor(db=self._reader.env.db("ledgers"))
        entries = self._txn.cursor(db=self._reader.env.db("entries"))
        if not records.set_range(prefix):
            return
        for key, value in records:
            if not key.startswith(prefix):
                break
            try:
                record = LedgerRecord.FromString(value)
            except Exception as exc:  # protobuf's DecodeError
                raise CorruptRecordError(f"ledger record of topic {topic_id}: {exc}") from exc
            first, last, count = _entry_range(entries, prefix, record.ledger_id)
            yield LedgerRange(record.ledger_id, first, last, count, record.closed)

    # --- entries --------------------------------------------------------------------------

    def iter_raw(self, topic_id: int, start: Position, end: Position, chunk_entries: int = 1024,
                 chunk_bytes: int | None = None) -> Iterator[tuple[list[int], list[int], list[bytes]]]:
        """The stored entries of `topic_id` from `start` to `end` (both inclusive), in chunks
        of up to `chunk_entries` (and, with `chunk_bytes`, ending with the entry that reaches
        that many bytes): (ledger ids, entry ids, stored values). A value is the 32-byte
        entry header followed by the message as the producer sent it."""
        if chunk_entries < 1:
            raise ValueError("chunk_entries must be >= 1")
        prefix = pack_i64(topic_id)
        end_key = prefix + pack_position(end.ledger_id, end.entry_id)
        cursor = self._txn.cursor(db=self._reader.env.db("entries"))
        if start > end or not cursor.set_range(prefix + pack_position(start.ledger_id, start.entry_id)):
            return
        yield from _in_chunks(topic_id, cursor, lambda key: key > end_key, chunk_entries, chunk_bytes)

    def iter_raw_before(self, topic_id: int, before: Position, floor: Position, chunk_entries: int = 1024,
                        chunk_bytes: int | None = None) -> Iterator[tuple[list[int], list[int], list[bytes]]]:
        """`iter_raw` backwards: the stored entries of `topic_id` before `before` (exclusive)
        down to `floor` (inclusive), newest first, in chunks as `iter_raw`'s (each chunk
        newest first too)."""
        if chunk_entries < 1:
            raise ValueError("chunk_entries must be >= 1")
        prefix = pack_i64(topic_id)
        floor_key = prefix + pack_position(floor.ledger_id, floor.entry_id)
        cursor = self._txn.cursor(db=self._reader.env.db("entries"))
        at_or_after = cursor.set_range(prefix + pack_position(before.ledger_id, before.entry_id))
        if not (cursor.prev() if at_or_after else cursor.last()):
            return
        # (keys of other topics sort below the floor, or above `before`)
        yield from _in_chunks(topic_id, cursor.iterprev(), lambda key: key < floor_key, chunk_entries, chunk_bytes)

    def iter_entries(self, topic_id: int, start: Position, end: Position,
                     chunk_entries: int = 1024) -> Iterator[list[Entry]]:
        """`iter_raw` decoded into `Entry` objects (header fields and the message bytes)."""
        for ledgers, entry_ids, values in self.iter_raw(topic_id, start, end, chunk_entries):
            yield [Entry.decode(Position(ledger, entry), value)
                   for ledger, entry, value in zip(ledgers, entry_ids, values)]

    def iter_headers(self, topic_id: int, start: Position, end: Position,
                     chunk_entries: int = 4096) -> Iterator[list[tuple[int, int, int, int, int, int]]]:
        """Only the header fields the transaction state needs, without copying messages:
        chunks of (ledger id, entry id, marker type, txn most, txn least, messages)."""
        unpack = HEADER.unpack_from
        for ledgers, entry_ids, values in self.iter_raw(topic_id, start, end, chunk_entries):
            chunk = []
            for ledger, entry, value in zip(ledgers, entry_ids, values):
                if len(value) < HEADER.size:
                    raise CorruptRecordError(f"entry {ledger}:{entry} is shorter than its header")
                version, _flags, marker, most, least, count, _publish = unpack(value)
                if version != HEADER_VERSION:
                    raise CorruptRecordError(f"entry {ledger}:{entry} has header version {version}")
                chunk.append((ledger, entry, marker, most, least, count))
            yield chunk

    # --- other records --------------------------------------------------------------------

    def counter(self, name: str) -> int:
        """The last value the data dir allocated from the persistent counter `name` (e.g.
        "ledger", "topic"); -1 if it never allocated one."""
        raw = self._txn.get(b"counter/" + name.encode(), db=self._reader.env.db("meta"))
        return _COUNTER.unpack(raw)[0] if raw is not None else -1

    def transaction_buffer_snapshot(self, topic_id: int) -> bytes | None:
        """The raw transaction-buffer snapshot record of the topic (None if it has none)."""
        raw = self._txn.get(pack_i64(topic_id), db=self._reader.env.db("tb_snapshots"))
        return bytes(raw) if raw is not None else None

    def transaction_buffer_snapshot_segment(self, topic_id: int, last_marker: Position) -> bytes | None:
        """The raw sealed segment of the topic's snapshot that ends at `last_marker` (None if
        there is none: see pyengine.transaction.buffer.snapshot)."""
        key = pack_i64(topic_id) + pack_position(last_marker.ledger_id, last_marker.entry_id)
        raw = self._txn.get(key, db=self._reader.env.db("tb_snapshots"))
        return bytes(raw) if raw is not None else None


def _in_chunks(topic_id: int, items: Iterator[tuple[bytes, bytes]], past: Callable[[bytes], bool],
               chunk_entries: int, chunk_bytes: int | None = None) -> Iterator[tuple[list[int], list[int], list[bytes]]]:
    """The entries of a cursor's `items` until a key is `past` the range, in chunks of up to
    `chunk_entries` entries (and about `chunk_bytes` bytes): (ledger ids, entry ids, values)."""
    if chunk_bytes is not None and chunk_bytes < 1:
        raise ValueError("chunk_bytes must be >= 1")
    ledgers: list[int] = []
    entry_ids: list[int] = []
    values: list[bytes] = []
    size = 0
    for key, value in items:
        if past(key):
            break
        if len(key) != _KEY_SIZE:
            raise CorruptRecordError(f"entry key of {len(key)} bytes in topic {topic_id}")
        ledger_id, entry_id = unpack_position(key[8:])
        ledgers.append(ledger_id)
        entry_ids.append(entry_id)
        values.append(value)
        size += len(value)
        if len(values) >= chunk_entries or (chunk_bytes is not None and size >= chunk_bytes):
            yield ledgers, entry_ids, values
            ledgers, entry_ids, values = [], [], []
            size = 0
    if values:
        yield ledgers, entry_ids, values


def _entry_range(cursor: lmdb.Cursor, prefix: bytes, ledger_id: int) -> tuple[int, int, int]:
    """(first entry id, last entry id, count) stored in a ledger; (-1, -1, 0) when empty.
    The count assumes no gaps inside the ledger (entries are only ever appended, and only
    whole ledgers are trimmed)."""
    start = prefix + pack_position(ledger_id, 0)
    after = prefix + pack_position(ledger_id + 1, -1)
    if not cursor.set_range(start) or cursor.key() >= after:
        return -1, -1, 0
    first = unpack_position(cursor.key()[8:])[1]
    if cursor.set_range(after):
        moved = cursor.prev()
    else:
        moved = cursor.last()
    if not moved:
        return -1, -1, 0
    last = unpack_position(cursor.key()[8:])[1]
    return first, last, last - first + 1


class StoreReader:
    """A data dir opened read-only. Use as a context manager, or call `close()`."""

    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir)
        if not (self.path / "lmdb" / "data.mdb").is_file():
            raise DataDirNotFoundError(f"{self.path} is not a pyengine data dir (no lmdb/data.mdb inside)")
        self.env = StorageEnvironment(self.path, readonly=True)

    @contextmanager
    def view(self) -> Iterator[ReadView]:
        """A consistent snapshot of the data dir for the duration of the block."""
        with self.env.read() as txn:
            yield ReadView(self, txn)

    def topic_names(self) -> list[str]:
        with self.view() as view:
            return view.topic_names()

    def topic(self, name: str) -> TopicInfo:
        with self.view() as view:
            return view.topic(name)

    def close(self) -> None:
        self.env.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


__all__ = ["DataDirNotFoundError", "LedgerRange", "ReadView", "StoreReader", "TopicInfo", "TopicNotStoredError"]
