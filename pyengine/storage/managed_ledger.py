"""Managed ledger: a topic's append-only log of entries, addressed by Position(ledger, entry).

As in Pulsar, a managed ledger is a sequence of ledgers. Appends go to the current ledger, which
rolls over after `max_entries_per_ledger` entries or `max_ledger_bytes`; every (re)open starts a
new ledger (and deletes those earlier opens left empty), and a ledger that was open when the
process died is closed at its last durable entry. Whole ledgers are trimmed once every durable
cursor has consumed them and retention allows; their entries are removed in bounded writes
after the one that deletes the ledgers (PURGE_MARK), so that a full map can be freed.

All state changes are group-committed through the `StorageEnvironment`; an append's future
resolves with its position only once the entry is durable, and only then does the
last-add-confirmed position (LAC) move, so readers never see an entry that could still be lost.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from core_ext.poskeys import pack_i64, pack_position, unpack_position
from pyengine.concurrency import single_flight
from pyengine.storage.compacted import DEFAULT_DELETE_CHUNK
from pyengine.storage.entry import MARKER_NONE, NO_TXN, Entry, encode_entry, publish_time_of, read_entry_range
from pyengine.storage.environment import StorageEnvironment, WriteFn, delete_prefix
from pyengine.storage.errors import (
    CorruptRecordError, LedgerClosedError, StorageError, StorageFullError, TopicTerminatedError,
)
from pyengine.storage.records_pb2 import CursorRecord, LedgerRecord, PositionRecord, TopicRecord
from pyengine_kernels import Position

if TYPE_CHECKING:
    from pyengine.storage.cursor import ManagedCursor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ManagedLedgerConfig:
    max_entries_per_ledger: int = 50_000          # Pulsar's managedLedgerMaxEntriesPerLedger
    max_ledger_bytes: int = 2048 << 20            # Pulsar's managedLedgerMaxSizePerLedgerMbytes
    # Retention of consumed ledgers. -1 keeps them forever (our default: nothing is deleted
    # unless asked); 0 deletes a ledger as soon as every durable cursor has consumed it
    # (Pulsar's default); otherwise ledgers are kept until older / larger than the limit.
    retention_ms: int = -1
    retention_bytes: int = -1

    @property
    def retains_everything(self) -> bool:
        return self.retention_ms < 0 and self.retention_bytes < 0


@dataclass(slots=True)
class _AppendBatch:
    """Appends that go into one group commit: LMDB items, their positions, who to tell."""

    items: list[tuple[bytes, bytes]] = field(default_factory=list)
    positions: list[Position] = field(default_factory=list)
    completions: list[tuple[asyncio.Future, object]] = field(default_factory=list)
    condition: asyncio.Future | None = None     # the last write the batch was made to depend on
    failed: bool = False                        # failed (and reported) before its commit settled


@dataclass(slots=True)
class LedgerInfo:
    ledger_id: int
    last_entry_id: int = -1
    entries: int = 0
    size: int = 0
    created_ms: int = 0
    closed: bool = False
    closed_ms: int = 0

    def record(self) -> bytes:
        return LedgerRecord(ledger_id=self.ledger_id, last_entry_id=self.last_entry_id, entries=self.entries,
                            size=self.size, created_ms=self.created_ms, closed=self.closed,
                            closed_ms=self.closed_ms).SerializeToString()

    def close(self) -> None:
        self.closed = True
        self.closed_ms = _now_ms()


def _retrieve(future: asyncio.Future) -> None:
    """Mark a future's outcome as seen (nobody else waits for it)."""
    if not future.cancelled():
        future.exception()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _delete_key(key: bytes, db: Any, txn) -> None:
    txn.delete(key, db=db)


# Entries are deleted in two steps. One small write deletes what reaches them (the records of
# trimmed ledgers, or a deleted topic's records) and notes, under PURGE_MARK + the topic's key
# prefix in the "meta" database, the key before which the topic's entries are deleted: no read
# reaches them from then on (ManagedLedger._floor). Bounded writes then remove the entries,
# DEFAULT_DELETE_CHUNK at a time, the last one the note too. In LMDB a delete takes new pages to
# record the pages it frees, so one write deleting a topic's or a trim's worth of entries failed
# in a full map (MDB_MAP_FULL), and nothing could free space again, not even after a restart. A
# crash (or a failed write) between them leaves the note: the next open of a managed ledger of
# the data dir, or the topic's next trim, resumes the removal.
PURGE_MARK = b"purge/"


# A removal write also stops after this many bytes of entries: the pages it frees are listed in
# LMDB's free-page database at its commit, and a list of more than about a page's worth of page
# numbers takes contiguous pages, which a full map may not have (a chunk of 55 entries of 300 KB,
# ~4,000 pages, could not be committed there).
PURGE_CHUNK_BYTES = 512 << 10


def _purge_write(env: StorageEnvironment, prefix: bytes, limit: int = DEFAULT_DELETE_CHUNK,
                 limit_bytes: int = PURGE_CHUNK_BYTES) -> WriteFn:
    """A write removing up to `limit` (and about `limit_bytes`) of the entries noted as deleted
    under `prefix`; it returns True once none is left (and the note is removed)."""
    entries, meta, mark = env.db("entries"), env.db("meta"), PURGE_MARK + prefix

    def write(txn) -> bool:
        end = txn.get(mark, db=meta)
        if end is None:
            return True
        cursor = txn.cursor(db=entries)
        removed = size = 0
        found = cursor.set_range(prefix)
        while found and removed < limit and size < limit_bytes:
            key = cursor.key()
            if not key or key >= end:
                break
            size += len(cursor.value())
            found = cursor.delete()
            removed += 1
        if removed < limit and size < limit_bytes:
            txn.delete(mark, db=meta)
            return True
        return False
    return write


PURGE_RETRIES = 7        # after a failed write, tried again after 10 ms, 20 ms, ... 0.64 s


async def _remove_noted(env: StorageEnvironment, prefix: bytes) -> None:
    """Remove the entries noted as deleted under `prefix`, one bounded write at a time, until
    none is left. A failed write (its group commit failed: an append in a full map, which the
    removal is there to make room for) is tried again a few times, then raises StorageError."""
    write, retries = _purge_write(env, prefix), 0
    while True:
        try:
            if await env.submit(write):
                return
            retries = 0
        except StorageError:
            if env.closed or retries == PURGE_RETRIES:
                raise
            await asyncio.sleep(0.01 * 2 ** retries)
            retries += 1


def _noted_prefixes(env: StorageEnvironment) -> list[bytes]:
    """The key prefixes of the topics whose deleted entries are to be removed (PURGE_MARK)."""
    prefixes = []
    with env.read() as txn:
        cursor = txn.cursor(db=env.db("meta"))
        if cursor.set_range(PURGE_MARK):
            for key in cursor.iternext(values=False):
                if not key.startswith(PURGE_MARK):
                    break
                prefixes.append(bytes(key[len(PURGE_MARK):]))
    return prefixes


def _noted_deletions(env: StorageEnvironment, prefix: bytes) -> tuple[Position | None, bool]:
    """(the position before which the entries under `prefix` are noted as deleted, or None;
    whether any deletion is noted in the environment)."""
    meta = env.db("meta")
    with env.read() as txn:
        end = txn.get(PURGE_MARK + prefix, db=meta)
        cursor = txn.cursor(db=meta)
        noted = cursor.set_range(PURGE_MARK) and cursor.key().startswith(PURGE_MARK)
    if end is None or len(end) != len(prefix) + 16 or not end.startswith(prefix):
        return None, noted
    return Position(*unpack_position(end[len(prefix):])), noted


class _Purger:
    """Removes every deleted entry noted in a storage environment (PURGE_MARK), one bounded
    write at a time, in the background: one per environment (`_purger_of`)."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def start(self, env: StorageEnvironment) -> asyncio.Task[None]:
        """Start (or, if under way, go on with another round); the task ends when no note is left,
        or after a failed write (logged: the next start resumes)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(env), name="remove-deleted-entries")
        else:
            self._again = True
        return self._task

    async def _run(self, env: StorageEnvironment) -> None:
        try:
            while True:
                self._again = False
                await env.barrier()         # (a deletion submitted before the start is written)
                for prefix in _noted_prefixes(env):
                    await _remove_noted(env, prefix)
                if not self._again:
                    return
        except StorageError as exc:
            if not env.closed:
                log.warning("removing deleted entries failed (the next trim or open resumes it): %s", exc)
        finally:
            self._task = None


_PURGERS: weakref.WeakKeyDictionary[StorageEnvironment, _Purger] = weakref.WeakKeyDictionary()


def _purger_of(env: StorageEnvironment) -> _Purger:
    purger = _PURGERS.get(env)
    if purger is None:
        purger = _PURGERS[env] = _Purger()
    return purger


def is_utf8(text: str) -> bool:
    """Whether `text` encodes as UTF-8 (a lone surrogate, which JSON's \\ud800 spells, does not:
    the topic record, a protobuf, could not be saved with it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class ManagedLedger:
    """One topic's log. Create with `await ManagedLedger.open(env, name)`."""

    def __init__(self, env: StorageEnvironment, record: TopicRecord, ledgers: list[LedgerInfo],
                 config: ManagedLedgerConfig) -> None:
        self.env = env
        self.name = record.name
        self.topic_id = record.topic_id
        # The key of its queued appends in a group commit: one per batch, so that a batch never
        # coalesces with (and inherits the conditions of) one that failed and was dropped.
        self._append_key: tuple[str, int, int] = ("append", record.topic_id, 0)
        self.config = config
        self.created_ms = record.created_ms
        self.properties: dict[str, str] = dict(record.properties)
        self._record = record
        self._prefix = pack_i64(record.topic_id)
        self._entries_db = env.db("entries")
        self.ledgers: dict[int, LedgerInfo] = {info.ledger_id: info for info in ledgers}
        self.terminated_at: Position | None = (
            Position(record.terminated_at.ledger_id, record.terminated_at.entry_id)
            if record.HasField("terminated_at") else None)
        self._terminate_saved = True       # False while terminated_at is not durable yet
        # The last position retention deleted (see TopicRecord.trimmed_through); None: none yet.
        self.trimmed_through: Position | None = (
            Position(record.trimmed_through.ledger_id, record.trimmed_through.entry_id)
            if record.HasField("trimmed_through") else None)
        self._unsaved_properties: set[str] = set()    # set in memory, their save not done
        # The write of a trim in flight: a save of the topic record meanwhile carries its
        # trimmed_through, so it is made conditional on it (never durable without the trim).
        self._trim_written: asyncio.Future[Any] | None = None
        # Entries before this position were deleted (by a trim: their ledgers are gone) but may
        # not be removed yet (see PURGE_MARK): reads never reach them. None: none deleted so.
        self._floor: Position | None = None
        last = self._last_entry_position()
        self.lac: Position = last if last is not None else Position(self._last_ledger_id(), -1)
        self._current: LedgerInfo | None = None
        self._next_entry = 0
        self._queued: _AppendBatch | None = None
        # The group-commit future of the last batch of appends until `_appended` has handled
        # it: the next batch is written only if that one was (no gap behind a failed batch).
        self._unsettled: asyncio.Future | None = None
        self._in_flight = 0
        self._listeners: list[Callable[[], None]] = []
        self._trim_listeners: list[Callable[[Position], None]] = []
        self._trim_writers: list[Callable[[Position], WriteFn | None]] = []
        self._trim_bounds: list[Callable[[], Position]] = []
        self._trim_lock = asyncio.Lock()
        self._trimming: asyncio.Task[None] | None = None
        self._trim_again = False
        self._failure_listeners: list[Callable[[Position], None]] = []
        self.cursors: dict[str, ManagedCursor] = {}
        self._opening_cursors: dict[str, asyncio.Future[ManagedCursor]] = {}
        self._closed = False

    # --- opening --------------------------------------------------------------------------

    @classmethod
    async def open(cls, env: StorageEnvironment, name: str,
                   config: ManagedLedgerConfig | None = None) -> ManagedLedger:
        """Open the managed ledger `name`, creating it if needed, recovering ledgers left open."""
        config = config or ManagedLedgerConfig()
        env.check_key(name.encode(), f"the managed ledger name {name[:64]!r}")
        topics = env.db("topics")
        with env.read() as txn:
            raw = txn.get(name.encode(), db=topics)
        if raw is None:
            record = TopicRecord(topic_id=env.next_id("topic"), name=name, created_ms=_now_ms())
            key, value = name.encode(), record.SerializeToString()
            await env.submit(lambda txn: txn.put(key, value, db=topics))
            ledgers: list[LedgerInfo] = []
        else:
            try:
                record = TopicRecord.FromString(raw)
            except Exception as exc:        # protobuf's DecodeError, as the ledger records'
                raise CorruptRecordError(f"topic record of {name!r}: {exc}") from exc
            ledgers = cls._load_ledgers(env, record.topic_id)
        ledger = cls(env, record, ledgers, config)
        ledger._floor, noted = _noted_deletions(env, ledger._prefix)
        await ledger._recover_open_ledgers()
        ledger._drop_empty_ledgers()
        if ledger.terminated_at is None:
            ledger._start_ledger()
        await env.barrier()
        if noted:       # deleted entries not removed yet (a crash, a failed write): resumed
            _purger_of(env).start(env)
        return ledger

    @staticmethod
    def _load_ledgers(env: StorageEnvironment, topic_id: int) -> list[LedgerInfo]:
        prefix = pack_i64(topic_id)
        ledgers = []
        with env.read() as txn:
            cursor = txn.cursor(db=env.db("ledgers"))
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    try:
                        rec = LedgerRecord.FromString(value)
                    except Exception as exc:
                        raise CorruptRecordError(f"ledger record of topic {topic_id}: {exc}") from exc
                    ledgers.append(LedgerInfo(rec.ledger_id, rec.last_entry_id, rec.entries, rec.size,
                                              rec.created_ms, rec.closed, rec.closed_ms))
        return ledgers

    async def _recover_open_ledgers(self) -> None:
        """Close every ledger left open by a previous process at its last durable entry."""
        for info in self.ledgers.values():
            if info.closed:
                continue
            start = self._key(Position(info.ledger_id, 0))
            end = self._key(Position(info.ledger_id + 1, -1))
            last, count, size = -1, 0, 0
            with self.env.read() as txn:
                cursor = txn.cursor(db=self._entries_db)
                if cursor.set_range(start):
                    for key, value in cursor:
                        if key >= end:
                            break
                        last = unpack_position(key[8:])[1]
                        count += 1
                        size += len(value)
            info.last_entry_id, info.entries, info.size = last, count, size
            info.close()
            self._put_ledger_record(info)
        last_pos = self._last_entry_position()
        if last_pos is not None:
            self.lac = last_pos

    def _drop_empty_ledgers(self) -> None:
        """Delete the closed ledgers that hold no entry, as Pulsar's ManagedLedgerImpl does when
        it opens a managed ledger: each open starts a ledger, and a topic loaded and unloaded
        without appends (retention keeping everything) gained one more each time, for good.

        A position in a ledger that goes (a cursor's mark-delete at (L, -1)) keeps its meaning:
        positions order as before and no entry lies between, so next_position & co. give the
        same answers. Kept: the ledger of the terminated position (and any after it: the LAC
        after a restart must still be that position), and the first ledger of a topic nothing
        was ever trimmed from: where its ledger ids begin is how a stream's failOnDataLoss
        (spark_udfs.stream) tells a topic deleted and created again from this one, and an
        offset taken in that ledger would otherwise look like such a loss."""
        sealed = self.terminated_at.ledger_id if self.terminated_at is not None else None
        first = next(iter(self.ledgers), None) if self.trimmed_through is None else None
        empty = [info.ledger_id for info in self.ledgers.values()
                 if info.closed and info.entries == 0 and info.last_entry_id < 0 and info.ledger_id != first
                 and (sealed is None or info.ledger_id < sealed)]
        if not empty:
            return
        db = self.env.db("ledgers")
        for ledger_id in empty:
            del self.ledgers[ledger_id]
            key = self._prefix + pack_i64(ledger_id)
            # (under the key of its record: replaces a record of its close queued by the recovery)
            self.env.submit(partial(_delete_key, key, db), key=("ledger", key)).add_done_callback(_retrieve)
        last = self._last_entry_position()
        self.lac = last if last is not None else Position(self._last_ledger_id(), -1)

    def _start_ledger(self) -> None:
        info = LedgerInfo(self.env.next_id("ledger"), created_ms=_now_ms())
        self.ledgers[info.ledger_id] = info
        self._current = info
        self._next_entry = 0
        self._put_ledger_record(info)
        if self.lac.entry_id < 0 and self._last_entry_position() is None:
            self.lac = Position(info.ledger_id, -1)

    def _close_current_ledger(self, last_entry_id: int) -> None:
        info = self._current
        if info is None:
            return
        info.close()
        info.last_entry_id = last_entry_id
        self._current = None
        # Its last entries may still be in flight: the record is never durable without them
        # (if they fail, it is refused, and the ledger is closed again at its last durable entry).
        self._put_ledger_record(info, after=self._unsettled)
        self.trim_soon()

    def _put_ledger_record(self, info: LedgerInfo, after: asyncio.Future[Any] | None = None) -> None:
        key = self._prefix + pack_i64(info.ledger_id)
        value = info.record()
        db = self.env.db("ledgers")
        # Nobody waits for it: if it fails, a restart finds the ledger open and closes it at
        # its last durable entry, as after a crash.
        self.env.submit(lambda txn: txn.put(key, value, db=db), key=("ledger", key),
                        after=after).add_done_callback(_retrieve)

    # --- appends --------------------------------------------------------------------------

    def append(self, data: bytes, *, txn_most: int = NO_TXN, txn_least: int = NO_TXN,
               marker_type: int = MARKER_NONE, num_messages: int = 1,
               publish_time: int = 0) -> asyncio.Future[Position]:
        """Append one entry; the future resolves with its position once it is durable."""
        return self.append_entry(data, txn_most=txn_most, txn_least=txn_least, marker_type=marker_type,
                                 num_messages=num_messages, publish_time=publish_time)[1]

    def append_entry(self, data: bytes, *, txn_most: int = NO_TXN, txn_least: int = NO_TXN,
                     marker_type: int = MARKER_NONE, num_messages: int = 1, publish_time: int = 0,
                     after: asyncio.Future[Any] | None = None) -> tuple[Position | None, asyncio.Future[Position]]:
        """Append one entry and say at once where it will be: the position is assigned now,
        and the entry becomes readable there when the future resolves (a transaction buffer
        registers the position before any reader can reach it). The position is None when
        the append failed at once (the future then holds the error).

        `after` (a commit marker's coordinator decision): the entry is durable only with or
        after that write, and fails if it failed - and with it the appends that share its
        group commit, as after any failed write (StorageEnvironment.depend)."""
        # Encoded (and so checked: a str, a header field out of range) before a position is
        # taken or a batch queued: a TypeError after that left an empty batch behind, whose
        # commit then failed in `_appended`.
        value = encode_entry(data, txn_most, txn_least, marker_type, num_messages, publish_time)
        if after is not None and not isinstance(after, asyncio.Future):
            raise TypeError(f"after must be the asyncio.Future of an earlier submit, not {type(after).__name__}")
        future: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        batch = self._batch_for_append(future)
        if batch is None:
            return None, future
        if after is not None and after is not batch.condition:
            # (a transaction's first sends all depend on one registration: once per batch)
            self.env.depend(self._append_key, after)
            batch.condition = after
        position = self._add(batch, value)
        batch.completions.append((future, position))
        return position, future

    def append_batch(self, entries: list[bytes], *, publish_time: int = 0) -> asyncio.Future[list[Position]]:
        """Append several plain entries in order; one future resolves with all their positions
        once they are durable (for a producer that has many entries at hand, e.g. everything
        one socket read brought). No entries: [] at once (after the same checks)."""
        header = encode_entry(b"", NO_TXN, NO_TXN, MARKER_NONE, 1, publish_time)   # the same for all
        # Every entry is encoded (so checked: one that is not bytes-like raises TypeError here)
        # before any position is taken: one failing half-way left the entries before it in the
        # queued batch, written though the caller was told the call failed, and the ledger's
        # counters behind them, so that the next append overwrote one.
        values = [header + entry for entry in entries]
        future: asyncio.Future[list[Position]] = asyncio.get_running_loop().create_future()
        if not values:
            if self._appendable(future):
                future.set_result([])
            return future
        batch = self._batch_for_append(future)
        if batch is None:
            return future
        positions: list[Position] = []
        index, count = 0, len(values)
        while index < count:
            # The first entry may roll the ledger over; the rest of what fits goes in a tight loop.
            positions.append(self._add(batch, values[index]))
            index = self._add_run(batch, values, index + 1, positions)
        batch.completions.append((future, positions))
        return future

    def _add_run(self, batch: _AppendBatch, values: list[bytes], index: int, positions: list[Position]) -> int:
        """`_add` for values[index:] (encoded entries) while the current ledger takes them (the
        hot loop of a producer's burst: no call per entry); returns the index of the first one
        not added."""
        current = self._current
        if current is None:             # the last `_add` filled (and closed) the ledger
            return index
        ledger_id, prefix, items, added = current.ledger_id, self._prefix, batch.items, batch.positions
        entry_id, size, count = self._next_entry, current.size, len(values)
        max_entries, max_bytes = self.config.max_entries_per_ledger, self.config.max_ledger_bytes
        start = index
        while index < count and entry_id < max_entries and size < max_bytes:
            value = values[index]
            items.append((prefix + pack_position(ledger_id, entry_id), value))
            position = Position(ledger_id, entry_id)
            added.append(position)
            positions.append(position)
            size += len(value)
            entry_id += 1
            index += 1
        current.entries += index - start
        current.size = size
        self._next_entry = entry_id
        self._close_if_full(current)
        return index

    def queued_write_of(self, appended: asyncio.Future) -> tuple[object, asyncio.Future] | None:
        """The group-commit write that will carry the entry `appended` stands for (the future
        an append just returned), as (its submission key, its future), while that entry's
        batch is still queued; None once it is sealed, or if the entry is not in it (appended
        later by a transaction buffer). A write made conditional on it (`submit(after=...)`)
        is durable with the entry or not at all."""
        batch = self._queued
        if appended.done() or batch is None or not batch.completions or batch.completions[-1][0] is not appended:
            return None
        assert self._unsettled is not None        # the queued batch's write
        return self._append_key, self._unsettled

    def _batch_for_append(self, future: asyncio.Future) -> _AppendBatch | None:
        """The batch of appends the next group commit writes (None: the ledger refuses appends,
        and `future` holds why)."""
        if not self._appendable(future):
            return None
        batch = self._queued
        if batch is None:
            batch = self._queued = _AppendBatch()
            self._append_key = ("append", self.topic_id, self._append_key[2] + 1)
            written = self.env.submit(partial(self._write, batch), key=self._append_key, on_seal=self._seal)
            if self._unsettled is not None:
                # The previous batch may still fail (its commit is in flight, or its failure
                # not handled yet): these entries follow it, so they are never durable without it.
                self.env.depend(self._append_key, self._unsettled)
            self._unsettled = written
            written.add_done_callback(partial(self._appended, batch))
            self._in_flight += 1
        return batch

    def _appendable(self, future: asyncio.Future) -> bool:
        """False (with the reason in `future`) when the ledger refuses appends."""
        self._check_open()
        if self.terminated_at is not None:
            future.set_exception(TopicTerminatedError(f"topic {self.name} is terminated at {self.terminated_at}"))
            return False
        if self.env.nearly_full:
            # Refused before the map is full, as a bookie turns read-only: the writes that free
            # space (trims, topic deletions, cursor moves) still find pages to write to.
            future.set_exception(StorageFullError(
                f"storage is nearly full: appends to {self.name} are refused until space is freed "
                "(trim consumed ledgers, delete topics) or the broker restarts with a larger map_size"))
            return False
        return True

    def _add(self, batch: _AppendBatch, value: bytes) -> Position:
        current = self._current
        if current is None:
            self._start_ledger()
            current = self._current
            assert current is not None
        entry_id = self._next_entry
        self._next_entry = entry_id + 1
        current.entries += 1
        current.size += len(value)
        position = Position(current.ledger_id, entry_id)
        batch.items.append((self._prefix + pack_position(current.ledger_id, entry_id), value))
        batch.positions.append(position)
        self._close_if_full(current)
        return position

    def _close_if_full(self, current: LedgerInfo) -> None:
        """Close the current ledger with the append that fills it (Pulsar's closeWhenDone), not
        with the next one: a full ledger left open until then was never trimmed while the topic
        got no append, however long ago every cursor consumed it. The next append starts a
        new ledger."""
        if (self._next_entry >= self.config.max_entries_per_ledger
                or current.size >= self.config.max_ledger_bytes):
            self._close_current_ledger(self._next_entry - 1)

    def _seal(self) -> None:
        self._queued = None

    def _write(self, batch: _AppendBatch, txn) -> None:
        """Writer thread: put this batch's entries. Their keys increase, and follow every key
        of this topic already stored; when they also follow every key of the database (the
        newest topic, or the only one) LMDB appends them to full pages (MDB_APPEND) instead
        of splitting pages in half, halving what the commit writes."""
        cursor = txn.cursor(db=self._entries_db)
        added = cursor.putmulti(batch.items, append=True)[1]
        if added != len(batch.items):
            cursor.putmulti(batch.items[added:])

    def _appended(self, batch: _AppendBatch, done: asyncio.Future) -> None:
        self._in_flight -= 1
        if done is self._unsettled:
            self._unsettled = None
        error = done.exception()
        if batch.failed:        # failed with an earlier batch: its (dropped) write wrote nothing
            return
        if error is None:
            if batch.positions:     # (none: every append of the batch failed before taking one)
                self.lac = batch.positions[-1]
                if self._current is not None and self._current.ledger_id == self.lac.ledger_id:
                    self._current.last_entry_id = self.lac.entry_id
            for future, result in batch.completions:
                if not future.done():
                    future.set_result(result)
            for listener in list(self._listeners):
                listener()
            return
        self._fail_appends(batch, error)

    def _fail_appends(self, batch: _AppendBatch, error: BaseException) -> None:
        """A batch failed: nothing in it is durable. Appends already queued behind it would leave
        a gap, so they fail too, and every ledger they touched is closed at its last durable
        entry (a later append starts a new ledger), as BookKeeper closes a ledger after a
        write error."""
        failed = [batch]
        if self._queued is batch:         # never sealed: the environment was closed under it
            self._queued = None
        elif self._queued is not None:
            failed.append(self._queued)
            if not self.env.closed:
                # Drop the unsealed write (it depends on the failed one: it would be refused anyway).
                self.env.submit(None, key=self._append_key).add_done_callback(_retrieve)
            self._queued = None
        for b in failed:
            b.failed = True
        lost = [(position, len(value)) for b in failed for position, (_key, value) in zip(b.positions, b.items)]
        for ledger_id in sorted({position.ledger_id for position, _size in lost}):
            info = self.ledgers[ledger_id]
            sizes = [size for position, size in lost if position.ledger_id == ledger_id]
            info.entries -= len(sizes)
            info.size -= sum(sizes)
            info.last_entry_id = self.lac.entry_id if self.lac.ledger_id == ledger_id else -1
            info.close()
            if info is self._current:
                self._current = None
            if not self.env.closed:     # (else a restart closes it at its last durable entry)
                self._put_ledger_record(info)
        first_failed = min(position for position, _size in lost)
        for listener in list(self._failure_listeners):
            listener(first_failed)
        for b in failed:
            for future, _result in b.completions:
                if not future.done():
                    future.set_exception(error)

    async def terminate(self) -> Position:
        """Seal the ledger: wait for appends in flight, then refuse every later append.
        Returns the last position it will ever hold (idempotent)."""
        self._check_open()
        if self.terminated_at is None:
            # Sealed between trims (they take turns on this lock): a trim under way chose its
            # ledgers before the seal, and would delete the ledger of the position sealed at
            # after it (the LAC after a restart was then another position). Appends that come
            # meanwhile are waited for too.
            async with self._trim_lock:
                await self.env.barrier()
                while self._in_flight:
                    await self.env.barrier()
                # Closed (deleted) meanwhile: sealing now would write its records back.
                self._check_open()
                if self.terminated_at is None:
                    self._terminate_at_lac()
        if not self._terminate_saved:
            # Sealed in memory at once (no append may follow); a save that failed is repeated by
            # the next call, or a restart would find the topic open again.
            await self._put_topic_record()
            self._terminate_saved = True
        return self.terminated_at

    def _terminate_at_lac(self) -> None:
        """Seal at the LAC (appends drained, no trim under way)."""
        if self.lac.ledger_id not in self.ledgers:
            # The LAC's ledger was trimmed (every entry consumed): a restart finds the LAC in the
            # ledgers left, (last ledger, -1) as none of them holds an entry. Sealed there, and
            # that ledger is kept (a terminated ledger keeps the ledger of its last position),
            # the LAC after a restart is still the terminated position. Nothing lies between.
            if not self.ledgers:
                self._start_ledger()
            self.lac = Position(self._last_ledger_id(), -1)
        self.terminated_at = self.lac
        self._record.terminated_at.CopyFrom(_position_record(self.lac))
        self._close_current_ledger(self.lac.entry_id if self.lac.ledger_id == self._current_id() else -1)
        self._terminate_saved = False

    async def set_property(self, key: str, value: str) -> None:
        """Set a durable property of the managed ledger (e.g. that it holds transactional
        entries, which lets a topic that never had any skip transaction-buffer recovery)."""
        await self.update_properties({key: value})

    async def update_properties(self, changes: Mapping[str, str | None]) -> None:
        """Set (None: delete) several durable properties in one save of the topic record: all
        of them are stored, or none (a failed save is repeated by the next call)."""
        self._check_open()
        # Checked before `properties` takes any: the record refused one only after, and the
        # topic reported properties that were never stored.
        for key, value in changes.items():
            if not isinstance(key, str) or not (value is None or isinstance(value, str)):
                raise TypeError(f"a property's key and value must be str, not {type(key).__name__} "
                                f"and {type(value).__name__}")
            for text in (key, value):
                if text is not None and not is_utf8(text):
                    raise ValueError(f"a property's key and value must be UTF-8 text: {text[:40]!r} is not")
        changed = {key: value for key, value in changes.items()
                   if self.properties.get(key) != value or key in self._unsaved_properties}
        if not changed:
            return
        for key, value in changed.items():
            if value is None:
                self.properties.pop(key, None)
                self._record.properties.pop(key, None)
            else:
                self.properties[key] = value
                self._record.properties[key] = value
            self._unsaved_properties.add(key)
        await self._put_topic_record()      # a failed save is repeated by the next call
        for key, value in changed.items():
            if self.properties.get(key) == value:
                self._unsaved_properties.discard(key)

    def _current_id(self) -> int:
        return self._current.ledger_id if self._current is not None else -1

    async def _put_topic_record(self) -> None:
        key, value, db = self.name.encode(), self._record.SerializeToString(), self.env.db("topics")
        trim = self._trim_written
        await self.env.submit(lambda txn: txn.put(key, value, db=db), key=("topic", key),
                              after=trim if trim is not None and not trim.done() else None)

    # --- reads ----------------------------------------------------------------------------

    def read_entries(self, start: Position, max_entries: int, last: Position | None = None) -> list[Entry]:
        """Up to `max_entries` entries from `start` (inclusive) to `last` (inclusive, default the
        LAC; never beyond it)."""
        self._check_open()
        limit = self.lac if last is None or last > self.lac else last
        floor = self._floor
        if floor is not None and start < floor:
            start = floor           # (before it: deleted entries not removed yet)
        if max_entries <= 0 or start > limit:
            return []
        with self.env.read() as txn:
            return read_entry_range(txn, self._entries_db, self._prefix, self._key(start), self._key(limit),
                                    max_entries)

    def read_entries_reverse(self, last: Position, max_entries: int) -> list[Entry]:
        """Up to `max_entries` entries at or before `last` (never beyond the LAC), newest first."""
        self._check_open()
        limit = self.lac if last > self.lac else last
        if max_entries <= 0:
            return []
        prefix = self._prefix
        # (before the floor: deleted entries not removed yet; keys of other topics sort below it too)
        floor = self._key(self._floor) if self._floor is not None else prefix
        entries: list[Entry] = []
        with self.env.read() as txn:
            cursor = txn.cursor(db=self._entries_db)
            start = self._key(limit)
            # Stand on the last key <= start.
            if cursor.set_range(start):
                if cursor.key() != start and not cursor.prev():
                    return entries
            elif not cursor.last():
                return entries
            while len(entries) < max_entries:
                key = cursor.key()
                if key < floor or not key.startswith(prefix):
                    break
                ledger_id, entry_id = unpack_position(key[8:])
                entries.append(Entry.decode(Position(ledger_id, entry_id), cursor.value()))
                if not cursor.prev():
                    break
        return entries

    def find_by_publish_time(self, timestamp_ms: int) -> Position:
        """The first entry published at or after `timestamp_ms` (the LAC's next position if none).

        A binary search over the stored entries, as Pulsar's broker searches (OpFindNewest):
        publish times are taken as non-decreasing along the log, and the search reads about
        log2(entries) of them, not every one (a scan held the event loop ~1.6 us per entry: ~16 s
        for a seek on a topic of 10M)."""
        self._check_open()
        lac = self.lac
        spans: list[tuple[int, int]] = []       # (ledger id, entries) of what may be read
        for ledger_id, info in self.ledgers.items():
            if ledger_id > lac.ledger_id:
                break
            last = min(info.last_entry_id, lac.entry_id) if ledger_id == lac.ledger_id else info.last_entry_id
            if last >= 0:
                spans.append((ledger_id, last + 1))
        starts = list(itertools.accumulate((count for _, count in spans), initial=0))

        def position_at(index: int) -> Position:
            span = bisect.bisect_right(starts, index) - 1
            return Position(spans[span][0], index - starts[span])

        low, high = 0, starts[-1]
        with self.env.read() as txn:
            while low < high:
                middle = (low + high) // 2
                value = txn.get(self._key(position_at(middle)), db=self._entries_db)
                # A missing entry (none should be) counts as published before: the search goes on after it.
                if value is not None and publish_time_of(value) >= timestamp_ms:
                    high = middle
                else:
                    low = middle + 1
        return position_at(low) if low < starts[-1] else lac.next()

    def read_entry(self, position: Position) -> Entry | None:
        if self._floor is not None and position < self._floor:
            return None             # deleted (maybe not removed yet)
        with self.env.read() as txn:
            value = txn.get(self._key(position), db=self._entries_db)
        return Entry.decode(position, value) if value is not None and position <= self.lac else None

    # --- positions ------------------------------------------------------------------------

    def is_last_entry(self, position: Position) -> bool:
        """`position` is the last entry of a closed ledger."""
        info = self.ledgers.get(position.ledger_id)
        return info is not None and info.closed and position.entry_id >= info.last_entry_id

    def first_position(self) -> Position:
        """The first entry still stored, or where the next append will go when there is none."""
        for info in self.ledgers.values():
            if info.entries > 0 and info.last_entry_id >= 0:
                return Position(info.ledger_id, 0)
        return self.lac.next()

    def next_position(self, position: Position) -> Position:
        """The position after `position` that holds (or will hold) the next entry."""
        info = self.ledgers.get(position.ledger_id)
        if info is not None and position.entry_id < info.last_entry_id:
            return Position(position.ledger_id, position.entry_id + 1)
        if position >= self.lac:
            return self.lac.next()
        for ledger_id, info in self.ledgers.items():
            if ledger_id > position.ledger_id and info.last_entry_id >= 0:
                return Position(ledger_id, 0)
        return self.lac.next()

    def previous_position(self, position: Position) -> Position:
        """The position before `position` (Pulsar's getPreviousPosition): the entry before in the
        same ledger, else the last entry of the previous non-empty ledger, else (ledger, -1)."""
        if position.entry_id > 0:
            return Position(position.ledger_id, position.entry_id - 1)
        previous = None
        for ledger_id, info in self.ledgers.items():
            if ledger_id >= position.ledger_id:
                break
            if info.last_entry_id >= 0:
                previous = Position(ledger_id, info.last_entry_id)
        return previous if previous is not None else position.prev()

    def entries_between(self, after: Position, upto: Position) -> int:
        """How many entries lie in (after, upto]."""
        count = 0
        for ledger_id, info in self.ledgers.items():
            if info.last_entry_id < 0 or ledger_id < after.ledger_id or ledger_id > upto.ledger_id:
                continue
            first = after.entry_id + 1 if ledger_id == after.ledger_id else 0
            last = min(info.last_entry_id, upto.entry_id) if ledger_id == upto.ledger_id else info.last_entry_id
            if ledger_id == self._current_id():
                last = min(last, self.lac.entry_id) if self.lac.ledger_id == ledger_id else -1
            count += max(0, last - first + 1)
        return count

    def position_after(self, after: Position, count: int) -> Position | None:
        """The `count`-th entry (1-based) after `after`, up to the LAC; None when fewer entries
        follow. Counted over the ledgers' spans (as Pulsar's getPositionAfterN), reading none."""
        if count <= 0:
            raise ValueError(f"count must be > 0, not {count}")
        lac = self.lac
        for ledger_id, info in self.ledgers.items():
            if ledger_id < after.ledger_id or ledger_id > lac.ledger_id or info.last_entry_id < 0:
                continue
            first = after.entry_id + 1 if ledger_id == after.ledger_id else 0
            last = min(info.last_entry_id, lac.entry_id) if ledger_id == lac.ledger_id else info.last_entry_id
            floor = self._floor                 # (before it: deleted, maybe not removed yet)
            if floor is not None and ledger_id <= floor.ledger_id:
                first = max(first, floor.entry_id) if ledger_id == floor.ledger_id else last + 1
            available = last - first + 1
            if available <= 0:
                continue
            if count <= available:
                return Position(ledger_id, first + count - 1)
            count -= available
        return None

    @property
    def number_of_entries(self) -> int:
        return self.entries_between(Position(-1, -1), self.lac)

    @property
    def total_size(self) -> int:
        return sum(info.size for info in self.ledgers.values())

    def _last_entry_position(self) -> Position | None:
        for info in reversed(self.ledgers.values()):
            if info.last_entry_id >= 0:
                return Position(info.ledger_id, info.last_entry_id)
        return None

    def _last_ledger_id(self) -> int:
        return next(reversed(self.ledgers)) if self.ledgers else -1

    def _key(self, position: Position) -> bytes:
        return self._prefix + pack_position(position.ledger_id, position.entry_id)

    # --- notification ---------------------------------------------------------------------

    def add_listener(self, listener: Callable[[], None]) -> None:
        """`listener()` runs on the event loop each time the LAC moves."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def add_trim_listener(self, listener: Callable[[Position], None]) -> None:
        """`listener(first_position)` runs after ledgers are trimmed; everything before
        `first_position` is gone."""
        self._trim_listeners.append(listener)

    def add_trim_writer(self, writer: Callable[[Position], WriteFn | None]) -> None:
        """`writer(first_position)` runs just before a trim deletes ledgers, `first_position`
        being the first entry left after it. The LMDB write it returns (None: nothing to add)
        goes into the very transaction that deletes them (their records: from then on no read
        reaches their entries, which bounded writes then remove, see PURGE_MARK), so what it
        records in place of the deleted entries is durable exactly when they are gone, also
        across a crash. Raising StorageError refuses the trim (nothing is deleted; a later trim
        tries again)."""
        self._trim_writers.append(writer)

    def add_trim_bound(self, bound: Callable[[], Position]) -> None:
        """Trims keep every ledger holding an entry after `bound()`, as they keep what a durable
        cursor has not consumed (a transaction buffer's read horizon: an open transaction's
        entries are not trimmed, or its commit would leave it torn and a restart forget it)."""
        self._trim_bounds.append(bound)

    def add_failure_listener(self, listener: Callable[[Position], None]) -> None:
        """`listener(first_failed)` runs when appends fail: no entry assigned a position at or
        after `first_failed` so far is durable (later appends go to a new ledger)."""
        self._failure_listeners.append(listener)

    # --- trimming -------------------------------------------------------------------------

    @property
    def retains_everything(self) -> bool:
        return self.config.retains_everything

    def set_retention(self, retention_ms: int, retention_bytes: int) -> None:
        """Change the retention of consumed ledgers (topic / namespace policies); -1: no limit."""
        for name, value in (("retention_ms", retention_ms), ("retention_bytes", retention_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                raise ValueError(f"{name} must be an int >= -1, not {value!r}")
        if (retention_ms, retention_bytes) != (self.config.retention_ms, self.config.retention_bytes):
            self.config = replace(self.config, retention_ms=retention_ms, retention_bytes=retention_bytes)

    async def trim(self, now_ms: int | None = None) -> list[int]:
        """Delete closed ledgers that every durable cursor has consumed (every closed ledger
        when there is none) and that retention no longer keeps: oldest first, each one whose
        close is older than the retention time or while the topic is over the retention size,
        up to the first that is neither (Pulsar's ManagedLedgerImpl trimming). Returns the
        deleted ledger ids.

        One small write deletes the ledgers (their records: their entries are unreachable from
        then on); their entries are then removed in bounded writes (see PURGE_MARK), which this
        call waits for, with those of earlier trims not finished (a failure there is logged,
        and the next trim or open resumes it), so that trimming frees space in a full map too."""
        trimmed = await self._trim_once(now_ms)
        await self._remove_deleted_entries()
        self._resume_removals()
        return trimmed

    async def _trim_once(self, now_ms: int | None = None) -> list[int]:
        self._check_open()
        async with self._trim_lock:          # one at a time: each works on the ledgers left
            # Closed (deleted) while this one waited: its writes would land after the deletion.
            self._check_open()
            if self.retains_everything:
                return []
            return await self._trim(_now_ms() if now_ms is None else now_ms)

    def _resume_removals(self) -> None:
        """Start the removal of deleted entries in the background if any is noted (this
        topic's, another's: left by a failed write)."""
        if not self._closed and not self.env.closed and _noted_deletions(self.env, self._prefix)[1]:
            _purger_of(self.env).start(self.env)

    async def _remove_deleted_entries(self) -> None:
        """Remove this topic's entries that trims deleted, in bounded writes (_purge_write)."""
        if self.env.closed:
            return
        meta, mark = self.env.db("meta"), PURGE_MARK + self._prefix
        with self.env.read() as txn:
            if txn.get(mark, db=meta) is None:
                return
        try:
            await _remove_noted(self.env, self._prefix)
        except StorageError as exc:
            if not self.env.closed:
                log.warning("removing the entries trimmed from %s failed (the next trim or open resumes it): %s",
                            self.name, exc)

    async def _trim(self, now_ms: int) -> list[int]:
        retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
        # Every durable cursor counts, also one stored but not opened yet (a topic being loaded
        # opens its cursors after its ledger): what it has not consumed is never trimmed.
        mark_deletes = [c.trim_bound() for c in self.cursors.values() if c.durable]
        mark_deletes += self._stored_mark_deletes(exclude=self.cursors)
        slowest = min(mark_deletes, default=self.lac)
        for bound in self._trim_bounds:
            slowest = min(slowest, bound())
        # A terminated ledger keeps the ledger of its last entry (and any after it), as Pulsar
        # never trims its current ledger: its LAC must still be the terminated position after
        # a restart, which recomputes the LAC from the ledgers left.
        sealed = self.terminated_at.ledger_id if self.terminated_at is not None else None
        candidates = [info for info in self.ledgers.values()
                      if info.closed and info is not self._current
                      and (sealed is None or info.ledger_id < sealed)
                      and (info.last_entry_id < 0 or Position(info.ledger_id, info.last_entry_id) <= slowest)]
        kept_bytes = self.total_size
        doomed = []
        for info in candidates:      # oldest first
            closed_ms = info.closed_ms or info.created_ms       # (records written before closed_ms)
            expired = retention_ms >= 0 and now_ms - closed_ms > retention_ms
            over_quota = retention_bytes >= 0 and kept_bytes > retention_bytes
            if info.last_entry_id < 0 or expired or over_quota:
                doomed.append(info)
                kept_bytes -= info.size
            else:
                break     # ledgers are trimmed in order, as in Pulsar
        if not doomed:
            return []
        ledgers_db, meta_db, prefix = self.env.db("ledgers"), self.env.db("meta"), self._prefix
        ledger_keys = [prefix + pack_i64(info.ledger_id) for info in doomed]
        # Doomed ledgers holding entries are the first ones that hold any (trims go oldest
        # first): every entry before `floor` is theirs (or an earlier trim's, not removed yet).
        # Not after the last doomed ledger: an empty one is doomed wherever it is, also after
        # ledgers not consumed, whose entries the floor would then delete.
        with_entries = [info for info in doomed if info.last_entry_id >= 0 or info.entries > 0]
        has_entries = bool(with_entries)
        floor = Position(with_entries[-1].ledger_id + 1, -1) if has_entries else None
        mark, mark_end = PURGE_MARK + prefix, self._key(floor) if floor is not None else None
        extra: list[WriteFn] = []
        if self._trim_writers:
            gone = {info.ledger_id for info in doomed}
            first_left = next((Position(info.ledger_id, 0) for info in self.ledgers.values()
                               if info.ledger_id not in gone and info.entries > 0 and info.last_entry_id >= 0),
                              self.lac.next())
            for writer in list(self._trim_writers):
                write = writer(first_left)
                if write is not None:
                    extra.append(write)

        # The topic record says, in the write that deletes them, how far entries are gone (the
        # last entry deleted: an empty ledger deletes none, and a reader whose next position
        # is past a ledger's last entry lost nothing); set in memory at once, so that a topic
        # record saved meanwhile (a property, the termination) and written after this one does
        # not take it back.
        previous = self.trimmed_through
        self.trimmed_through = max([Position(info.ledger_id, info.last_entry_id) for info in doomed
                                    if info.last_entry_id >= 0] + ([previous] if previous is not None else []),
                                   default=None)
        if self.trimmed_through is not None:
            self._record.trimmed_through.CopyFrom(_position_record(self.trimmed_through))
        topic_key, topic_value = self.name.encode(), self._record.SerializeToString()
        topics_db = self.env.db("topics")

        def delete(txn) -> None:
            # The ledgers go, and their entries with them: no read reaches them from now on,
            # and bounded writes remove them (one write deleting them all could not be written
            # in a full map: see PURGE_MARK).
            for ledger_key in ledger_keys:
                txn.delete(ledger_key, db=ledgers_db)
            if has_entries:
                noted = txn.get(mark, db=meta_db)
                if noted is None or noted < mark_end:
                    txn.put(mark, mark_end, db=meta_db)
            txn.put(topic_key, topic_value, db=topics_db)
            for write in extra:
                write(txn)

        self._trim_written = written = self.env.submit(delete)
        try:
            await written
        except StorageError:        # not written (trims take turns: none moved it meanwhile)
            self.trimmed_through = previous
            if previous is None:
                self._record.ClearField("trimmed_through")
            else:
                self._record.trimmed_through.CopyFrom(_position_record(previous))
            raise
        for info in doomed:
            del self.ledgers[info.ledger_id]
        if floor is not None and (self._floor is None or self._floor < floor):
            self._floor = floor
        first = self.first_position()
        for listener in list(self._trim_listeners):
            listener(first)
        return [info.ledger_id for info in doomed]

    def _stored_mark_deletes(self, exclude: dict[str, ManagedCursor]) -> list[Position]:
        prefix, found = self._prefix, []
        with self.env.read() as txn:
            cursor = txn.cursor(db=self.env.db("cursors"))
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    if key[len(prefix):].decode() in exclude:
                        continue
                    try:
                        md = CursorRecord.FromString(value).mark_delete
                    except Exception as exc:
                        raise CorruptRecordError(f"cursor record on {self.name}: {exc}") from exc
                    found.append(Position(md.ledger_id, md.entry_id))
        return found

    def trim_soon(self) -> None:
        """Trim in the background, as Pulsar does when a ledger is closed or the slowest cursor
        moves on: nothing to wait for, and a failure is logged (the next trim retries)."""
        if self._closed or self.retains_everything:
            return
        if self._trimming is not None:
            self._trim_again = True
            return
        self._trimming = asyncio.get_running_loop().create_task(self._trim_in_background(),
                                                                 name=f"trim-{self.name}")

    async def _trim_in_background(self) -> None:
        try:
            while not self._closed:
                self._trim_again = False
                try:
                    await self._trim_once()
                    # Their entries are removed in the background (close does not wait), and any
                    # removal a failed write left is resumed.
                    self._resume_removals()
                except StorageError as exc:          # (a closed ledger's LedgerClosedError too)
                    log.warning("trimming %s failed (retried by the next trim): %s", self.name, exc)
                    return
                if not self._trim_again:
                    return
        finally:
            self._trimming = None

    # --- cursors --------------------------------------------------------------------------

    async def open_cursor(self, name: str, initial_position: str = "latest",
                          cursor_properties: dict[str, str] | None = None) -> ManagedCursor:
        """Open the durable cursor `name`, creating it at the earliest or latest position with
        `cursor_properties` (an existing cursor keeps its own, as Pulsar's)."""
        self._check_open()
        cursor = self.cursors.get(name)
        if cursor is not None:
            return cursor
        # One cursor object per name: two made by concurrent opens would each hold their own
        # acknowledgements, and the one left over would write over the other's at close.
        return await single_flight(self._opening_cursors, name,
                                   lambda: self._create_cursor(name, initial_position, cursor_properties))

    async def _create_cursor(self, name: str, initial_position: str,
                             cursor_properties: dict[str, str] | None) -> ManagedCursor:
        from pyengine.storage.cursor import ManagedCursor
        # (this task starts a turn after open_cursor: the ledger may have been deleted since,
        # and the new cursor's record would outlive it)
        self._check_open()
        cursor = await ManagedCursor.open(self, name, initial_position, cursor_properties)
        self.cursors[name] = cursor
        return cursor

    def new_non_durable_cursor(self, start: Position) -> ManagedCursor:
        """A reader's cursor, positioned so that the first entry read is at or after `start`;
        its acknowledgements are never persisted."""
        from pyengine.storage.cursor import ManagedCursor
        self._check_open()
        return ManagedCursor.non_durable(self, self.previous_position(start) if start.entry_id >= 0 else start)

    async def delete_cursor(self, name: str, also: Sequence[WriteFn] = ()) -> None:
        """Delete the cursor `name`; `also`: writes to do in the same LMDB transaction."""
        cursor = self.cursors.pop(name, None)
        if cursor is None:
            from pyengine.storage.errors import CursorNotFoundError
            raise CursorNotFoundError(f"no cursor {name!r} on {self.name}")
        await cursor.delete(also)
        if cursor.durable:          # it may have been the slowest: what it held may go now
            self.trim_soon()

    # --- lifecycle ------------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        while True:
            while self._in_flight:
                await self.env.barrier()
            for cursor in list(self.cursors.values()):
                await cursor.flush()
            # Appends taken while the cursors were saved are waited for too: one still in flight
            # when the ledger is closed (and deleted) would be acknowledged after it, or, failing,
            # write its ledger's record back under a deleted topic.
            if not self._in_flight:
                break
        self._closed = True
        if self._trimming is not None:
            await asyncio.wait([self._trimming])     # its deletion lands or fails as a whole

    async def delete(self) -> None:
        """Delete the managed ledger with all its entries, ledgers and cursors; returns once
        its entries are removed too (see `delete_write`; a failure there is logged)."""
        await self.close()
        await self.env.submit(self.delete_write())
        await _purger_of(self.env).start(self.env)

    def delete_write(self) -> WriteFn:
        """The write that deletes the closed ledger's entries, ledgers, cursors and topic record
        (for a caller that deletes more in the same LMDB transaction). Its entries go as a
        trim's do: the write deletes everything else and notes them (PURGE_MARK), so that no
        read reaches them, and bounded writes after it remove them, in the background (started
        here: the write is to be submitted in the same event-loop turn; else the next trim or
        open of a managed ledger of the environment starts it). One write removing them all
        could not be written in a full map, which no deletion could then free."""
        if not self._closed:
            raise LedgerClosedError(f"managed ledger {self.name} must be closed before it is deleted")
        for cursor in self.cursors.values():
            # A late ack (a consumer's, a transaction's commit) would write its record back,
            # left forever under a topic id nothing uses any more (see ManagedCursor.persist).
            cursor._deleted = True
        prefix, name = self._prefix, self.name.encode()
        dbs = [self.env.db(n) for n in ("ledgers", "cursors", "dedup", "tb_snapshots")]
        topics, meta = self.env.db("topics"), self.env.db("meta")
        mark, end = PURGE_MARK + prefix, pack_i64(self.topic_id + 1)      # every entry of the topic

        def delete(txn) -> None:
            for db in dbs:
                delete_prefix(txn, db, prefix)
            txn.delete(name, db=topics)
            txn.put(mark, end, db=meta)
        try:
            _purger_of(self.env).start(self.env)
        except RuntimeError:        # no event loop running: the next trim or open starts it
            pass
        return delete

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerClosedError(f"managed ledger {self.name} is closed")

    def __repr__(self) -> str:
        return f"ManagedLedger({self.name!r}, lac={self.lac}, ledgers={list(self.ledgers)})"


def _position_record(position: Position) -> PositionRecord:
    return PositionRecord(ledger_id=position.ledger_id, entry_id=position.entry_id)


__all__ = ["ManagedLedger", "ManagedLedgerConfig", "LedgerInfo", "StorageError"]

