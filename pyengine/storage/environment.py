"""The LMDB environment of a data dir and its single writer (group commit).

One environment per data dir, owned by one `StorageEnvironment`: LMDB forbids opening the same
environment twice in a process. Every component keeps its state in a named database here, so
one LMDB write transaction can change entries, cursors and transaction records atomically.

Writes: components `submit` small write functions. Everything submitted while the previous
commit is in flight (at least everything submitted in one event-loop turn) is written in one
LMDB write transaction on a dedicated writer thread, then committed with one fsync; only then
do the submitters' futures resolve. The event loop never blocks on the disk.

Reads: `read()` opens a read-only transaction on the calling (event-loop) thread; LMDB readers
never block the writer and see the last committed state.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb

from pyengine.storage.errors import (
    DataDirInUseError, DataDirNotFoundError, LedgerClosedError, StorageError, StorageFullError,
)

# Named databases, one per kind of record.
DATABASES = (
    "meta",            # id counters and format version
    "topics",          # topic name -> TopicRecord
    "ledgers",         # topic id + ledger id -> LedgerRecord
    "entries",         # topic id + position -> stored entry
    "cursors",         # topic id + cursor name -> CursorRecord
    "dedup",           # topic id + producer name -> last sequence id
    "txn_log",         # coordinator id + log sequence -> coordinator log record
    "pending_ack",     # subscription id + log sequence -> pending-ack log record
    "tb_snapshots",    # topic id -> transaction-buffer snapshot
    "metadata",        # metadata-store keys (PIP-468 / PIP-473)
)
# Added after the first data format: created when a data dir is opened for writing, absent
# (and then not opened) in an older data dir opened read-only.
OPTIONAL_DATABASES = (
    "compacted",       # topic id + position -> entry of the topic's compacted view
)

FORMAT_VERSION = 1
DEFAULT_MAP_SIZE = 64 << 30     # address space only: the file grows as data is written

WriteFn = Callable[[lmdb.Transaction], Any]


def delete_prefix(txn: lmdb.Transaction, db: Any, prefix: bytes) -> None:
    """Delete every key of `db` that starts with `prefix`, inside the write transaction `txn`."""
    cursor = txn.cursor(db=db)
    if cursor.set_range(prefix):
        while cursor.key().startswith(prefix):
            if not cursor.delete():         # the last key went: the cursor is past the end
                break


# Keys counted per read transaction by StorageEnvironment.prefix_usage before the event loop
# runs other work: ~2-5 ms of it.
PREFIX_USAGE_CHUNK = 20_000


def _prefix_usage_chunk(txn: lmdb.Transaction, db: Any, prefix: bytes, start: bytes,
                        limit: int) -> tuple[int, int, bytes | None]:
    """Up to `limit` keys of `db` under `prefix` from `start` on: their count, the bytes of their
    values, and the key to go on from (None: no more)."""
    count = size = 0
    cursor = txn.cursor(db=db)
    if cursor.set_range(start):
        for key, value in cursor.iternext():
            if not key.startswith(prefix):
                break
            if count == limit:
                return count, size, bytes(key)
            count += 1
            size += len(value)
    return count, size, None


def all_of(writes: list[WriteFn]) -> WriteFn:
    """One write doing `writes` in order, so that they land in one LMDB transaction."""
    def write(txn: lmdb.Transaction) -> None:
        for each in writes:
            each(txn)
    return write


@dataclass(slots=True)
class _QueuedWrite:
    """A write waiting for the next group commit (one per key: later submissions coalesce)."""

    write: WriteFn | None
    futures: list[asyncio.Future[Any]]
    on_seal: Callable[[], None] | None
    conditions: list[asyncio.Future[Any]] = field(default_factory=list)    # see `depend`
    eager: bool = True                   # asks for a commit (False: lazy, joins the next one)


LAZY_WRITE_DELAY_S = 0.01      # a lazy write waits at most this long for a commit to join
# Appends are refused (`nearly_full`) once more than FULL_SHARE of the map is used, until use is
# below NOT_FULL_SHARE again (BookKeeper's diskUsageThreshold and diskUsageLwmThreshold), and
# while fewer than RESERVE_PAGES (twice as many to end it) are free: so the writes that free
# space (trims, topic deletions, the cursor moves that allow them) find pages to write to. In
# LMDB even a deletion needs new pages, and a map filled to its last page by appends could then
# not be written again, not even after a restart with the same map size. (Use is the pages of
# the databases: LMDB's own, a dozen or so, are what RESERVE_PAGES is also there for.) It is
# measured after every USAGE_CHECK_COMMITS commits, after each one when the map is close.
FULL_SHARE, NOT_FULL_SHARE, RESERVE_PAGES = 0.95, 0.90, 64
USAGE_CHECK_COMMITS = 32
_COUNTER = struct.Struct(">q")


def _observed(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class StorageEnvironment:
    """Owns the LMDB environment of a data dir: named databases, reads, and group commit."""

    def __init__(self, path: str | Path, *, map_size: int = DEFAULT_MAP_SIZE, sync: bool = True,
                 readonly: bool = False) -> None:
        """Open (creating unless `readonly`) the environment under ``path/lmdb``.

        `sync=False` skips the fsync of each commit: a crash of the machine (not of the process)
        may then lose the last commits. The default keeps every acknowledged write durable.
        """
        self.path = Path(path)
        self.readonly = readonly
        env_dir = self.path / "lmdb"
        self._lock_fd: int | None = None
        if not readonly:
            if self.path.exists() and not self.path.is_dir():
                raise StorageError(f"the data dir {self.path} is not a directory")
            env_dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = _lock_data_dir(env_dir)
        try:
            self._env = lmdb.open(str(env_dir), map_size=map_size, max_dbs=len(DATABASES) + len(OPTIONAL_DATABASES) + 4,
                                  sync=sync, metasync=sync, readonly=readonly, lock=True,
                                  max_readers=512, create=not readonly)
        except lmdb.Error as exc:
            self._unlock()
            raise StorageError(f"cannot open the LMDB environment in {env_dir}: {exc}") from exc
        try:
            self._dbs = {name: self._env.open_db(name.encode(), create=not readonly) for name in DATABASES}
            for name in OPTIONAL_DATABASES:
                try:
                    self._dbs[name] = self._env.open_db(name.encode(), create=not readonly)
                except lmdb.NotFoundError:
                    pass
        except lmdb.NotFoundError:          # read-only, and a database is missing
            self._env.close()
            self._unlock()
            raise DataDirNotFoundError(f"{self.path} is not a pyengine data dir: its LMDB environment lacks "
                                       f"pyengine's databases") from None
        except lmdb.Error as exc:           # (else the lock stays taken and the environment open)
            self._env.close()
            self._unlock()
            if isinstance(exc, lmdb.IncompatibleError):     # a record named like a database
                raise DataDirNotFoundError(f"{self.path} is not a pyengine data dir: its LMDB environment is "
                                           f"another program's ({exc})") from None
            raise _storage_error(exc) from exc
        try:
            self._check_format()
        except BaseException:
            self._env.close()
            self._unlock()
            raise
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pyengine-lmdb-writer")
        self._loop: asyncio.AbstractEventLoop | None = None
        # key -> its queued write; insertion order is write order.
        self._pending: dict[object, _QueuedWrite] = {}
        self._flush_scheduled = False
        self._flushing = False
        self._linger = False
        self._lazy_timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._counters: dict[bytes, int] = {}
        # Counters whose high-water mark waits for the next batch (`_queued_counters`), or
        # whose write failed with a batch and goes again with the next one (`_unsaved_counters`).
        self._queued_counters: set[bytes] = set()
        self._unsaved_counters: set[bytes] = set()
        # The map is nearly full: appends are to be refused (StorageFullError), so that the
        # writes that free space can still be written (see FULL_SHARE). Read on each append.
        self.nearly_full = False
        self._commits_to_usage_check = 0        # (counted down by commits, not by writes)
        if not readonly:
            self._check_usage()

    # --- databases and reads --------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Closed: every later `submit` raises LedgerClosedError."""
        return self._closed

    def db(self, name: str) -> Any:
        return self._dbs[name]

    def check_key(self, key: bytes, what: str) -> None:
        """Refuse (ValueError) a key LMDB cannot store, empty or over its maximum key size,
        before a write of it is queued: found by the group commit (MDB_BAD_VALSIZE), it failed
        the whole batch, and so the writes of others that shared it."""
        if not 0 < len(key) <= self._env.max_key_size():
            raise ValueError(f"{what} makes an LMDB key of {len(key)} bytes: it must be 1 to "
                             f"{self._env.max_key_size()}")

    def read(self) -> lmdb.Transaction:
        """A read-only transaction (use as a context manager) on the last committed state."""
        self._check_open()
        return self._env.begin(write=False)

    async def prefix_usage(self, db: Any, prefix: bytes, start: bytes | None = None) -> tuple[int, int]:
        """How many keys of `db` start with `prefix` (from `start` on, if given: a key under the
        prefix), and the bytes of their values: durable records, counted PREFIX_USAGE_CHUNK at a
        time, each chunk in a read transaction of its own with the event loop free between them
        (a log of millions of records would hold it for seconds). So the figure is of no single
        moment: records written or deleted while it counts may count or not, as with a scan of
        a live store; admin statistics ask nothing more."""
        count = size = 0
        key: bytes | None = start if start is not None else prefix
        while key is not None:
            with self.read() as txn:
                counted, bytes_, key = _prefix_usage_chunk(txn, db, prefix, key, PREFIX_USAGE_CHUNK)
            count += counted
            size += bytes_
            if key is not None:
                await asyncio.sleep(0)
        return count, size

    def _check_usage(self) -> None:
        """Measure how much of the map the databases use (their pages: those LMDB holds free for
        reuse do not count), set `nearly_full`, and when to measure again (~20 us)."""
        try:
            with self._env.begin() as txn:
                used = 0
                for db in self._dbs.values():
                    stat = txn.stat(db)
                    used += stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
            info, page = self._env.info(), self._env.stat()["psize"]
        except lmdb.Error:
            return
        pages = info["map_size"] // page
        free, reserve = pages - used, max((1 - FULL_SHARE) * pages, RESERVE_PAGES)
        if self.nearly_full:
            self.nearly_full = free < max((1 - NOT_FULL_SHARE) * pages, 2 * RESERVE_PAGES)
        else:
            self.nearly_full = free < reserve
        self._commits_to_usage_check = 1 if free < 4 * reserve else USAGE_CHECK_COMMITS

    def stat(self) -> dict[str, Any]:
        info = self._env.info()
        return {"map_size": info["map_size"], "last_page": info["last_pgno"],
                "page_size": self._env.stat()["psize"]}

    # --- writes ---------------------------------------------------------------------------

    def submit(self, write: WriteFn | None, *, key: object = None,
               on_seal: Callable[[], None] | None = None,
               after: asyncio.Future[Any] | None = None, linger: bool = False,
               lazy: bool = False) -> asyncio.Future[Any]:
        """Queue `write` for the next group commit; the future resolves with its return value
        once the commit is durable, or fails with a StorageError (the whole batch then failed).

        Submissions with the same `key` coalesce: the latest write replaces an earlier one that
        has not been sealed yet (used for "latest state" records such as cursors). `on_seal`
        runs on the event loop when the batch is handed to the writer, so the submitter knows
        that later changes need a new submission. `write=None` is a barrier: its future
        resolves when everything submitted before it is durable. `after`: see `depend`.
        `linger`: the batch is sealed one event-loop turn later than it would be, so that the
        writes of tasks this one starts (a decision's commit markers) can join its commit.
        `lazy`: the write asks for no commit of its own: it joins the next one, or is written
        after LAZY_WRITE_DELAY_S (records nobody waits for, which would otherwise take a
        commit cycle that the next awaited write has to queue behind).
        """
        self._check_open()
        if after is not None:
            _check_condition(after)
        loop = self._bind_loop()
        future = loop.create_future()
        queued = self._pending.pop(key, None) if key is not None else None
        if queued is None:
            queued = _QueuedWrite(write, [future], on_seal, eager=not lazy)
        else:
            queued.write = write
            queued.futures.append(future)
            queued.on_seal = on_seal
            queued.eager = queued.eager or not lazy
        if after is not None:
            queued.conditions.append(after)
        if linger:
            self._linger = True
        self._pending[key if key is not None else object()] = queued
        if not self._flush_scheduled and not self._flushing:
            if not lazy:
                self._flush_scheduled = True
                loop.call_soon(self._flush)
            elif self._lazy_timer is None:
                self._lazy_timer = loop.call_later(LAZY_WRITE_DELAY_S, self._flush_lazy)
        return future

    def depend(self, key: object, after: asyncio.Future[Any]) -> None:
        """Make the queued write under `key` conditional on `after`, the future of an earlier
        `submit`: it is written only in the same LMDB transaction as `after`'s write or in a
        later one, and fails instead (with a StorageError) if `after`'s write failed. So a
        write that presupposes another (a commit marker, its coordinator's decision) is never
        durable without it, yet need not wait for it before being queued: both usually land
        in one group commit. Batches are written one at a time in submission order, so `after`
        is always settled or in the same batch when this write's batch is sealed."""
        _check_condition(after)
        queued = self._pending.get(key)
        if queued is None:
            raise StorageError(f"no queued write under {key!r} to make conditional")
        queued.conditions.append(after)     # (a ledger adds a repeated condition once per batch)

    async def barrier(self) -> None:
        """Wait until everything submitted so far is durable."""
        await self.submit(None)

    def write_now(self, write: WriteFn) -> Any:
        """Run one write transaction synchronously (start-up and recovery, before serving)."""
        self._check_open()
        if self._flushing or self._pending:
            raise StorageError("write_now() while group-committed writes are in flight")
        try:
            with self._env.begin(write=True) as txn:
                return write(txn)
        except lmdb.Error as exc:       # a full map or disk is StorageFullError, as for group commits
            raise _storage_error(exc) from exc

    def next_id(self, name: str) -> int:
        """Allocate the next value of a persistent counter (ledger ids, topic ids, ...).

        The new high-water mark is written with the next group commit; an id whose commit
        fails is simply never used again in this process, and ids stay unique after a restart
        because anything that uses an id is written in the same or a later commit.
        """
        key = b"counter/" + name.encode()
        value = self._counters.get(key)
        if value is None:
            with self.read() as txn:
                raw = txn.get(key, db=self._dbs["meta"])
            value = _COUNTER.unpack(raw)[0] if raw else 0
        value += 1
        self._counters[key] = value
        future = self.submit(self._counter_write(key), key=("counter", key))
        future.add_done_callback(_observed)     # a failure is the batch's, told to its writers
        self._queued_counters.add(key)
        return value

    def _counter_write(self, key: bytes) -> WriteFn:
        packed = _COUNTER.pack(self._counters[key])
        meta = self._dbs["meta"]
        return lambda txn: txn.put(key, packed, db=meta)

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise StorageError("the storage environment is bound to another event loop")
        return loop

    def _flush(self) -> None:
        if self._linger and not self._flushing and not self._closed:
            self._linger = False                    # one more turn for the writes to come
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)
            return
        self._flush_scheduled = False
        if self._flushing or not self._pending or self._closed:
            return
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        counters = self._seal_counters()
        batch = list(self._pending.values())
        self._pending = {}
        for queued in batch:
            if queued.on_seal is not None:
                queued.on_seal()
        if any(queued.conditions for queued in batch):
            batch = self._without_refused(batch)
            if not batch:
                return
        self._flushing = True
        loop = self._loop
        assert loop is not None
        done = self._executor.submit(self._write_batch, [queued.write for queued in batch])
        done.add_done_callback(lambda f: loop.call_soon_threadsafe(self._flushed, batch, f, counters))

    def _seal_counters(self) -> set[bytes]:
        """The counters written by the batch being sealed: those queued since the last one,
        and those whose write failed with an earlier batch (added to it now). A write using an
        id allocated since a failed batch (a ledger's record) is then never durable without
        the id's high-water mark, and a restart cannot give the id again."""
        counters, self._queued_counters = self._queued_counters, set()
        if self._unsaved_counters:
            for key in self._unsaved_counters - counters:
                self._pending[("counter", key)] = _QueuedWrite(self._counter_write(key), [], None)
            counters |= self._unsaved_counters
            self._unsaved_counters = set()
        return counters

    @staticmethod
    def _without_refused(batch: list[_QueuedWrite]) -> list[_QueuedWrite]:
        """The batch less its conditional writes whose condition failed (see `depend`), whose
        futures fail. A condition still unsettled must be in this very batch. Refusals are
        followed to the end: a write queued before the one it presupposes (a marker joining an
        append batch queued earlier than its decision) goes when that one is refused."""
        while True:
            in_batch = {id(future) for queued in batch for future in queued.futures}
            kept = []
            for queued in batch:
                reason = None
                for after in queued.conditions:
                    if after.done():
                        if after.cancelled() or after.exception() is not None:
                            reason = "was cancelled" if after.cancelled() else f"failed: {after.exception()}"
                            break
                    elif id(after) not in in_batch:
                        reason = "was never queued in this storage environment"
                        break
                if reason is None:
                    kept.append(queued)
                    continue
                failure = StorageError(f"not written: the write it presupposes {reason}")
                for future in queued.futures:
                    if not future.done():
                        future.set_exception(failure)
            if len(kept) == len(batch):
                return kept
            batch = kept          # its refusals may refuse writes already kept

    def _write_batch(self, writes: list[WriteFn | None]) -> list[Any]:
        """Writer thread: one LMDB write transaction for the whole batch."""
        with self._env.begin(write=True) as txn:
            return [write(txn) if write is not None else None for write in writes]

    def _flushed(self, batch: list[_QueuedWrite], done: concurrent.futures.Future, counters: set[bytes]) -> None:
        self._flushing = False
        if done.cancelled():
            error: BaseException | None = LedgerClosedError("the storage environment was closed")
        else:
            error = done.exception()
        if error is not None:
            self._unsaved_counters |= counters
            failure = _storage_error(error)
            for queued in batch:
                for future in queued.futures:
                    if not future.done():
                        future.set_exception(failure)
        else:
            for queued, result in zip(batch, done.result()):
                for future in queued.futures:
                    if not future.done():
                        future.set_result(result)
        if self._pending and not self._flush_scheduled:
            if any(queued.eager for queued in self._pending.values()):
                self._flush()
            elif self._lazy_timer is None and self._loop is not None:
                self._lazy_timer = self._loop.call_later(LAZY_WRITE_DELAY_S, self._flush_lazy)
        # (after the next batch went to the writer; before the callbacks of this one, which
        # run later, may append again)
        self._commits_to_usage_check -= 1
        if self._commits_to_usage_check <= 0 and not self._closed:
            self._check_usage()

    def _flush_lazy(self) -> None:
        self._lazy_timer = None
        if not self._flush_scheduled and not self._flushing:
            self._flush()

    # --- lifecycle ------------------------------------------------------------------------

    async def drain(self) -> None:
        """Wait for every queued write (used before close)."""
        while self._pending or self._flushing:
            await self.barrier()

    def close(self) -> None:
        """Close the environment. A commit in flight completes first; writes still queued are
        not written: their futures fail with LedgerClosedError (call `drain()` first to keep them)."""
        if self._closed:
            return
        self._closed = True
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        self._executor.shutdown(wait=True)
        pending, self._pending = self._pending, {}
        for queued in pending.values():
            for future in queued.futures:
                if not future.done():
                    future.set_exception(LedgerClosedError("the storage environment was closed before this write"))
        self._env.close()
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)         # releases the lock
            self._lock_fd = None

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerClosedError("the storage environment is closed")

    def _check_format(self) -> None:
        """Refuse a data dir of another data format (read-only opens too: a reader would
        misread it); a new one is stamped with this format."""
        meta = self._dbs["meta"]
        with self._env.begin(write=not self.readonly) as txn:
            raw = txn.get(b"format", db=meta)
            if raw is None:
                if not self.readonly:
                    txn.put(b"format", _COUNTER.pack(FORMAT_VERSION), db=meta)
                return
            version = _COUNTER.unpack(raw)[0] if len(raw) == _COUNTER.size else raw
            if version != FORMAT_VERSION:
                raise StorageError(f"{self.path} holds data format {version!r}, "
                                   f"this pyengine reads format {FORMAT_VERSION}")


LOCK_FILE = "writer.lock"


def _lock_data_dir(env_dir: Path) -> int:
    """Take the data dir for this process's writes: an exclusive lock the kernel releases when
    the process ends (a restart after a crash takes it again). LMDB alone lets a second
    process open the environment read-write, and two brokers on one data dir would hand out
    the same ids. Readers (read-only opens) take no lock."""
    fd = os.open(env_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        by = f" (pid {holder})" if holder.isdigit() else ""
        raise DataDirInUseError(f"the data dir {env_dir.parent} is in use by another process{by}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _check_condition(after: object) -> None:
    if not isinstance(after, asyncio.Future):
        raise TypeError(f"after must be the asyncio.Future of an earlier submit, not {type(after).__name__}")


def _storage_error(error: BaseException) -> StorageError:
    if isinstance(error, StorageError):
        return error
    if isinstance(error, lmdb.MapFullError):
        return StorageFullError(f"storage is full: {error}")
    if isinstance(error, lmdb.DiskError) or (isinstance(error, OSError) and error.errno == 28):
        return StorageFullError(f"disk full or failing: {error}")
    return StorageError(f"write failed: {error!r}")
