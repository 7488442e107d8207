"""The metadata store: versioned records under paths, watches, sessions with ephemeral records,
leader election, and the PIP-473 extensions (partition keys, sequential keys, secondary indexes
with range query and range watch).

Modelled on Pulsar's `MetadataStore` / `MetadataStoreExtended` (module `pulsar-metadata`):

* Paths look like `/a/b/c`. A record holds a value (bytes) and a `version` that is 0 when the
  record is created and grows by one with every modification (Pulsar's `Stat.version`).
* `put(path, value, expected_version)` is the compare-and-set: `None` writes whatever the
  current state, `-1` requires that the record does not exist, `n >= 0` requires version `n`.
  A failed condition raises `BadVersionError` (`AlreadyExistsError`, a subclass, for `-1`), as
  in Pulsar. `delete(path, expected_version)` raises `NotFoundError` or `BadVersionError`.
  A version starts at 0 again when a record is deleted and created again (as Pulsar's, and
  etcd's per-key version), so a holder of an old version could overwrite the new record;
  `put(..., expected_mod_revision=r)` also requires the record's `mod_revision` to be `r`,
  which is never reused (etcd's compare on mod_revision).
* A guard (`guard_path=`, `guard_mod_revision=` on `put`, `create`, `delete` and
  `delete_recursive`) makes a write conditional on another record: it happens only while the
  record at `guard_path` was last written at that mod revision, checked atomically with the
  write (etcd: a compare in the write's transaction), else `GuardFailedError`. A leader guards
  its writes with its election record: once deposed, it cannot write anything, not even create
  a record (where a compare-and-set has no version to compare).
* The key space is flat with hierarchical names, as in Pulsar's etcd, RocksDB and memory stores:
  `get_children("/a")` lists the distinct next segments of every record below `/a/`, whether or
  not `/a/b` itself holds a record; parents are never created implicitly and a record can be
  deleted while records below it exist.
* Every change gets a store-wide `revision` (increasing; etcd's revision on etcd). A record
  carries the revision that created it and the one that last modified it.
* `watch(path, prefix=...)` delivers `Notification`s in revision order, without gaps, for as
  long as the watch is open (the etcd backend re-establishes its stream after a reconnect and
  resumes after the last revision it delivered). To start from a known state: read (`get`, or
  `list_prefix`, whose `Page.revision` is the revision of the snapshot) and then
  `watch(..., since=revision)`: every change after the read is delivered exactly once. A watch
  opened without `since` delivers every change after its `start_revision`. When the history
  needed to resume is gone (compacted), `watch` raises `CompactedError`: re-read and watch again.
* Sessions (`create_session(ttl)`) are leases: a keep-alive task refreshes them every ttl/3.
  Records written with `session=` are ephemeral: they are deleted when the session is closed or
  expires (its holder stopped refreshing it for `ttl` seconds). `LeaderElection`
  (`pyengine.metadata.election`) builds on them.
* Versions and revisions are signed 64-bit numbers (Pulsar's `long`, etcd's int64): every
  store refuses an expected version, expected or guard mod revision or `since` above
  `MAX_INT64` with `ValueError` (as a negative one), before it reaches the backend. A session
  TTL is at most `MAX_SESSION_TTL` seconds (etcd's maximum lease TTL), on every store.
* Secondary indexes are declared per path prefix with `declare_index(name, prefix, key_fn)`;
  the backend writes index entries in the same atomic write as their record. `range_query`
  and `range_watch` read and watch an index by key range.

Backends with identical semantics: `MemoryMetadataStore` (tests), `LmdbMetadataStore` (the
embedded default, in the data dir's LMDB environment), `EtcdMetadataStore` (several brokers).
`open_metadata_store(url, env=None)` builds one from the CLI's `--metadata-store` value.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import logging
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyengine.errors import MetadataError

if TYPE_CHECKING:
    from pyengine.metadata.election import LeaderElection
    from pyengine.storage import StorageEnvironment

log = logging.getLogger(__name__)

__all__ = [
    "AlreadyExistsError", "BadVersionError", "CompactedError", "GuardFailedError", "IndexKey",
    "InvalidPathError", "LeaderElection", "LeaderState", "MetadataStore", "MetadataStoreError",
    "NotFoundError", "Notification", "NotificationType", "Page", "Record", "Session",
    "SessionExpiredError", "Watch", "open_metadata_store",
]

DEFAULT_SESSION_TTL = 10.0       # seconds
MAX_SESSION_TTL = 9_000_000_000.0    # seconds: etcd's maximum lease TTL (about 285 years)
MAX_INT64 = 2**63 - 1            # the largest version or revision (etcd's and Pulsar's are int64)
SEQUENTIAL_DIGITS = 10           # `%010d`, as ZooKeeper's sequential nodes (Pulsar's ZK store)


# --- errors -------------------------------------------------------------------------------

class MetadataStoreError(MetadataError):
    """A metadata-store operation failed (also: the store is unreachable or closed)."""


class BadVersionError(MetadataStoreError):
    """The expected version did not match (a failed compare-and-set)."""


class AlreadyExistsError(BadVersionError):
    """`put(..., expected_version=-1)` / `create` found an existing record. A `BadVersionError`,
    as in Pulsar, where creating an existing node fails with `BadVersionException`."""


class GuardFailedError(BadVersionError):
    """A guarded write was refused: the guard record is gone, or was written after the guard's
    mod revision. A `BadVersionError`; its own class tells a writer that lost what guards it
    (a deposed leader) from one whose record changed."""


class NotFoundError(MetadataStoreError):
    """The record does not exist."""


class SessionExpiredError(MetadataStoreError):
    """An ephemeral write named a session that is closed or has expired."""


class CompactedError(MetadataStoreError):
    """A watch cannot resume from the requested revision: that history is gone. Re-read the
    state and watch again from the revision of the read."""


class InvalidPathError(MetadataStoreError, ValueError):
    """A malformed path (not absolute, empty or relative segments, a trailing slash, NUL)."""


# --- value types --------------------------------------------------------------------------

IndexKey = Any  # int | str | bytes | a tuple of them; compared in that order (see keys.py)


@dataclass(frozen=True, slots=True)
class Record:
    """A record and its stat (Pulsar's `GetResult` = value + `Stat`)."""

    path: str
    value: bytes
    version: int                # 0 at creation, +1 per modification
    create_revision: int        # store revision of the write that created the record
    mod_revision: int           # store revision of the last write
    session_id: int | None = None      # the owning session of an ephemeral record
    partition_key: str | None = None   # PIP-473 co-location key (stored, returned)

    @property
    def ephemeral(self) -> bool:
        return self.session_id is not None


class NotificationType(enum.Enum):
    CREATED = "created"
    MODIFIED = "modified"
    DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class Notification:
    """One change. `record` is the new state (None for DELETED). Range-watch notifications
    also carry the `index` and the record's `index_key`: CREATED when a record enters the
    range (or gets that key), MODIFIED when a record in the range changes but keeps its key,
    DELETED when it leaves the range (deleted, or its key changed)."""

    type: NotificationType
    path: str
    revision: int
    record: Record | None = None
    index: str | None = None
    index_key: IndexKey = None

    @property
    def value(self) -> bytes | None:
        return self.record.value if self.record is not None else None

    @property
    def version(self) -> int | None:
        return self.record.version if self.record is not None else None


@dataclass(frozen=True, slots=True)
class Page:
    """One page of `list_prefix`: records in path order, the store revision of the snapshot,
    and whether more records follow (continue with `after=page.last_path`)."""

    records: list[Record]
    revision: int
    more: bool

    @property
    def last_path(self) -> str | None:
        return self.records[-1].path if self.records else None

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)


class LeaderState(enum.Enum):
    """Pulsar's `LeaderElectionState`."""

    NO_LEADER = "no_leader"
    LEADING = "leading"
    FOLLOWING = "following"


# --- watches ------------------------------------------------------------------------------

_CLOSED = object()


class Watch:
    """An open watch: an async iterator of `Notification`s in revision order.

    `start_revision`: every change with a greater revision is delivered (and none before it).
    Iteration ends when the watch is closed; it raises if the watch failed (for instance
    `CompactedError` when the etcd backend could not resume after a long disconnection).
    Use as an async context manager, or call `close()`.
    """

    def __init__(self, start_revision: int, on_close: Callable[[Watch], None] | None = None) -> None:
        self.start_revision = start_revision
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._on_close = on_close
        self._closed = False
        self._ended = False

    # backend side
    def _push(self, notification: Notification) -> None:
        if not self._closed:
            self._queue.put_nowait(notification)

    def _fail(self, error: BaseException) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(error)
            # ended as a closed one is: the store forgets it (close() is a no-op from now on)
            if self._on_close is not None:
                on_close, self._on_close = self._on_close, None
                on_close(self)

    # user side
    @property
    def closed(self) -> bool:
        return self._closed

    def pending(self) -> int:
        """Notifications received and not yet consumed."""
        return self._queue.qsize()

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Notification:
        if self._ended:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is _CLOSED:
            self._ended = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        return item

    async def next(self, timeout: float | None = None) -> Notification:
        """The next notification; `TimeoutError` after `timeout` seconds without one."""
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except StopAsyncIteration:
            raise MetadataStoreError("the watch is closed") from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put_nowait(_CLOSED)
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close(self)

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


# --- sessions -----------------------------------------------------------------------------

class Session:
    """A session (an etcd lease): ephemeral records written with it live as long as it does.

    Created by `MetadataStore.create_session(ttl)`. A keep-alive task refreshes it every ttl/3;
    if refreshing keeps failing (store unreachable) the session counts as expired locally once
    `ttl` seconds have passed since the last refresh that succeeded was sent, which is never
    later than the store expires it. The first deadline counts from `started`, when the
    backend sent the request that created the session (default: now), not from when its reply
    arrived. Listeners (`add_listener`) run once when the session ends
    (`closed` or `expired`). `close()` revokes it: its ephemeral records are deleted at once.
    `abandon()` stops the keep-alive without revoking, as a crashed process would: the store
    expires the session after its TTL.
    """

    def __init__(self, store: MetadataStore, session_id: int, ttl: float, *, started: float | None = None) -> None:
        self.store = store
        self.id = session_id
        self.ttl = ttl
        self.state = "active"          # active | closed | expired
        self._listeners: list[Callable[[Session], None]] = []
        self._ended = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._loop = loop
        # from before the request that created the session: the store's TTL runs from when it
        # granted it, which is later (never from the reply, which may arrive late)
        self._deadline = (loop.time() if started is None else min(started, loop.time())) + ttl
        self._timer: asyncio.TimerHandle | None = loop.call_at(self._deadline, self._check_deadline)
        self._keepalive: asyncio.Task | None = loop.create_task(self._keep_alive(), name=f"metadata-session-{session_id}")

    @property
    def alive(self) -> bool:
        return self.state == "active"

    def add_listener(self, listener: Callable[[Session], None]) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[Session], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def wait_ended(self) -> str:
        """Wait until the session is closed or expired; returns the final state."""
        await self._ended.wait()
        return self.state

    async def close(self) -> None:
        """Revoke the session: its ephemeral records are deleted now."""
        if self.state != "active":
            return
        self._stop()
        try:
            await self.store._revoke_session(self)
        finally:
            self._end("closed")

    def abandon(self) -> None:
        """Stop refreshing the session without revoking it (what a crash does): the store
        deletes its ephemeral records once the TTL runs out. The local deadline still applies,
        so the object reports `expired` no later than the store expires it."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # internals
    def _stop(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _end(self, state: str) -> None:
        if self.state != "active":
            return
        self._stop()
        self.state = state
        self._ended.set()
        self.store._sessions.pop(self.id, None)
        for listener in list(self._listeners):
            try:
                listener(self)
            except Exception:
                log.exception("session listener failed")

    def _expired(self) -> None:
        """The store reports that the session is gone."""
        self._end("expired")

    def _check_deadline(self) -> None:
        self._timer = None
        if self.state != "active":
            return
        if self._loop.time() >= self._deadline:
            self._end("expired")
        else:
            self._timer = self._loop.call_at(self._deadline, self._check_deadline)

    async def _keep_alive(self) -> None:
        interval = max(self.ttl / 3, 0.05)
        while self.state == "active":
            await asyncio.sleep(interval)
            sent = self._loop.time()
            try:
                alive = await self.store._refresh_session(self)
            except asyncio.CancelledError:
                raise
            except Exception as exc:        # unreachable store: retry until the deadline
                log.warning("refreshing metadata session %x failed: %s", self.id, exc)
                interval = max(min(interval, self._deadline - self._loop.time()) / 2, 0.05)
                continue
            if not alive:
                self._end("expired")
                return
            interval = max(self.ttl / 3, 0.05)
            self._deadline = sent + self.ttl
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(self._deadline, self._check_deadline)


# --- validation ---------------------------------------------------------------------------

_INDEX_NAME = re.compile(r"^[\w.:\-]+$")


def check_path(path: object, *, sequential: bool = False, allow_root: bool = False) -> str:
    """Validate a record path: absolute, no empty, `.` or `..` segments, no trailing slash
    (a sequential put may end with `/`: the number is the whole child name), no NUL."""
    if not isinstance(path, str):
        raise TypeError(f"a metadata path is a str, not {type(path).__name__}")
    if path == "/" and allow_root:
        return path
    if not path.startswith("/") or path == "/":
        raise InvalidPathError(f"invalid metadata path {path!r}: must be absolute and not the root")
    if "\x00" in path:
        raise InvalidPathError(f"invalid metadata path {path!r}: contains NUL")
    body = path[1:-1] if (sequential and path.endswith("/")) else path[1:]
    for segment in body.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidPathError(f"invalid metadata path {path!r}: empty or relative segment")
    try:
        path.encode()
    except UnicodeEncodeError as exc:
        raise InvalidPathError(f"invalid metadata path {path!r}: {exc}") from None
    return path


def check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"a metadata prefix is a str, not {type(prefix).__name__}")
    if not prefix.startswith("/") or "\x00" in prefix:
        raise InvalidPathError(f"invalid metadata prefix {prefix!r}: must start with '/'")
    try:
        prefix.encode()
    except UnicodeEncodeError as exc:
        raise InvalidPathError(f"invalid metadata prefix {prefix!r}: {exc}") from None
    return prefix


def check_value(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a metadata value is bytes, not {type(value).__name__}")


def check_guard(guard_path: str, guard_revision: int, found_revision: int | None) -> None:
    """GuardFailedError unless the guard record of a guarded write is at `guard_revision`
    (`found_revision`: its mod revision, None when it does not exist)."""
    if found_revision is None:
        raise GuardFailedError(f"guard {guard_path} does not exist, expected its revision {guard_revision}")
    if found_revision != guard_revision:
        raise GuardFailedError(f"guard {guard_path} was last written at revision {found_revision}, "
                               f"expected revision {guard_revision}")


def check_guard_arguments(guard_path: object, guard_mod_revision: object) -> tuple[str, int] | None:
    """The guard of a write, `(path, mod revision)`, or None when neither is given."""
    if (guard_path is None) != (guard_mod_revision is None):
        raise ValueError("a guard is a path and a mod revision: give both or neither")
    if guard_path is None:
        return None
    check_path(guard_path)
    if isinstance(guard_mod_revision, bool) or not isinstance(guard_mod_revision, int):
        raise TypeError(f"guard_mod_revision is an int, not {type(guard_mod_revision).__name__}")
    if guard_mod_revision < 1 or guard_mod_revision > MAX_INT64:
        raise ValueError(f"invalid guard_mod_revision {guard_mod_revision}: revisions are >= 1 and 64-bit")
    return guard_path, guard_mod_revision


def check_mod_revision(revision: object) -> int | None:
    if revision is None:
        return None
    if isinstance(revision, bool) or not isinstance(revision, int):
        raise TypeError(f"an expected mod revision is an int or None, not {type(revision).__name__}")
    if revision < 1 or revision > MAX_INT64:
        raise ValueError(f"invalid expected mod revision {revision}: revisions are >= 1 and 64-bit")
    return revision


def check_version(version: object, *, allow_create: bool = True) -> int | None:
    if version is None:
        return None
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(f"an expected version is an int or None, not {type(version).__name__}")
    if version < -1 or (version == -1 and not allow_create) or version > MAX_INT64:
        raise ValueError(f"invalid expected version {version}: versions are >= 0 and 64-bit (-1: must not exist)")
    return version


def check_partition_key(key: object) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str):
        raise TypeError(f"a partition key is a str, not {type(key).__name__}")
    if len(key.encode()) > 0xFFFE:
        raise ValueError("partition key too long")
    return key


def check_ttl(ttl: object) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise TypeError(f"a session TTL is a number of seconds, not {type(ttl).__name__}")
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"invalid session TTL {ttl!r}")
    if ttl > MAX_SESSION_TTL:
        raise ValueError(f"invalid session TTL {ttl!r}: at most {MAX_SESSION_TTL:.0f} seconds")
    return float(ttl)


def parent_of(path: str) -> str:
    """The parent path (of a sequential put's path: `/a/b-` and `/a/` both have parent `/a`)."""
    return path[:path.rindex("/")] or "/"


# --- the interface ------------------------------------------------------------------------

@dataclass(frozen=True)
class IndexSpec:
    name: str
    prefix: str
    key_fn: Callable[[Record], IndexKey]


class MetadataStore(abc.ABC):
    """The store interface. All operations are coroutines, except `declare_index`.

    Backends implement the underscore methods; the public methods validate their arguments
    (`TypeError` for wrong types, `InvalidPathError`/`ValueError` for malformed values) and
    delegate. A store is started by `start()` (or `async with`) and closed by `close()`, which
    closes its sessions (deleting their ephemeral records) and its watches.
    """

    def __init__(self) -> None:
        self._indexes: dict[str, IndexSpec] = {}
        self._sessions: dict[int, Session] = {}
        self._watches: set[Watch] = set()
        self._started = False
        self._closed = False

    # lifecycle
    async def start(self) -> MetadataStore:
        if not self._started:
            await self._start()
            self._started = True
        return self

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for session in list(self._sessions.values()):
            try:
                await session.close()
            except MetadataStoreError as exc:
                log.warning("closing metadata session %x: %s", session.id, exc)
        for watch in list(self._watches):
            watch.close()
        await self._close()

    async def __aenter__(self) -> MetadataStore:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataStoreError("the metadata store is closed")
        if not self._started:
            raise MetadataStoreError("the metadata store is not started (call start())")

    # records
    async def get(self, path: str) -> Record | None:
        """The record at `path`, or None."""
        check_path(path)
        self._check_open()
        return await self._get(path)

    async def exists(self, path: str) -> bool:
        return await self.get(path) is not None

    async def put(self, path: str, value: bytes, expected_version: int | None = None, *,
                  expected_mod_revision: int | None = None, session: Session | None = None,
                  sequential: bool = False, partition_key: str | None = None,
                  guard_path: str | None = None, guard_mod_revision: int | None = None) -> Record:
        """Write `value` at `path` and return the new record.

        `expected_version`: None (any state), -1 (must not exist: else `AlreadyExistsError`)
        or the current version (else `BadVersionError`, also when the record is missing).
        `expected_mod_revision`: the record must exist and have last been written at that
        store revision (else `BadVersionError`); with `expected_version`, both must hold.
        `session`: the record is ephemeral, deleted with the session (`SessionExpiredError` if
        the session is no longer alive). `sequential`: the store appends a zero-padded number,
        unique and increasing per parent path, to `path` (which may then end with `/`); the
        returned record's `path` is the created path. Index entries of declared indexes are
        written in the same atomic write. `guard_path` and `guard_mod_revision` (both or
        neither): the write happens only while the record at `guard_path` was last written at
        that mod revision (else `GuardFailedError`, checked before the other conditions).
        """
        check_path(path, sequential=bool(sequential))
        value = check_value(value)
        expected_version = check_version(expected_version)
        partition_key = check_partition_key(partition_key)
        if session is not None and not isinstance(session, Session):
            raise TypeError(f"session is a Session, not {type(session).__name__}")
        if not isinstance(sequential, bool):
            raise TypeError("sequential is a bool")
        if sequential and expected_version not in (None, -1):
            raise ValueError("a sequential put creates a new record: expected_version must be None or -1")
        expected_mod_revision = check_mod_revision(expected_mod_revision)
        if expected_mod_revision is not None and (expected_version == -1 or sequential):
            raise ValueError("expected_mod_revision names an existing record: not with expected_version=-1 "
                             "or sequential")
        guard = check_guard_arguments(guard_path, guard_mod_revision)
        self._check_open()
        if session is not None:
            if session.store is not self:
                raise ValueError("the session belongs to another metadata store")
            if not session.alive:
                raise SessionExpiredError(f"session {session.id:x} is {session.state}")
        return await self._put(path, value, expected_version, session, sequential, partition_key,
                               expected_mod_revision, guard)

    async def create(self, path: str, value: bytes, *, session: Session | None = None,
                     sequential: bool = False, partition_key: str | None = None,
                     guard_path: str | None = None, guard_mod_revision: int | None = None) -> Record:
        """Create-if-absent: `put(path, value, -1, ...)`; `AlreadyExistsError` if it exists."""
        return await self.put(path, value, -1, session=session, sequential=sequential,
                              partition_key=partition_key, guard_path=guard_path,
                              guard_mod_revision=guard_mod_revision)

    async def delete(self, path: str, expected_version: int | None = None, *,
                     expected_mod_revision: int | None = None, guard_path: str | None = None,
                     guard_mod_revision: int | None = None) -> None:
        """Delete the record (`NotFoundError` if missing, `BadVersionError` on a version or
        mod revision mismatch), with its index entries. Records below it are not touched.
        A guard as `put`'s (`GuardFailedError`, before `NotFoundError`)."""
        check_path(path)
        expected_version = check_version(expected_version, allow_create=False)
        expected_mod_revision = check_mod_revision(expected_mod_revision)
        guard = check_guard_arguments(guard_path, guard_mod_revision)
        self._check_open()
        await self._delete(path, expected_version, expected_mod_revision, guard)

    async def delete_recursive(self, path: str, *, guard_path: str | None = None,
                               guard_mod_revision: int | None = None) -> None:
        """Delete the record at `path` and every record below `path/` (and the sequence
        counters of those parents). Atomic on the local backends; on etcd one record at a time,
        as Pulsar's `deleteRecursive`, each retried while it changes between its read and its
        delete, and BadVersionError if it changed every time of `etcd_store.DELETE_TRIES`.

        With a guard, each record is deleted only while the record at `guard_path` is the one
        last written at `guard_mod_revision`; `GuardFailedError` once it is not (the local
        backends then delete nothing; on etcd what went while the guard held stays deleted).
        A guard record inside the tree is deleted with it (on etcd, last).
        A mod revision is never reused, so a guard also tells a record deleted and written
        again from the one it read."""
        check_path(path)
        guard = check_guard_arguments(guard_path, guard_mod_revision)
        self._check_open()
        await self._delete_recursive(path, guard)

    async def get_children(self, path: str) -> list[str]:
        """Sorted names of the next path segments of the records below `path/`."""
        check_path(path, allow_root=True)
        self._check_open()
        return await self._get_children(path)

    async def list_prefix(self, prefix: str, *, after: str | None = None, limit: int | None = None) -> Page:
        """Records whose path starts with `prefix` (a string prefix: `/a/b` also matches
        `/a/bc`), in path order, from the first path greater than `after`, at most `limit`
        (any positive int). Without `limit`, every matching record, however many (the etcd
        backend reads them in several requests, all at the page's revision: one snapshot)."""
        check_prefix(prefix)
        if after is not None and not isinstance(after, str):
            raise TypeError("after is a path (str)")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise TypeError("limit is an int")
        if limit is not None and limit <= 0:
            raise ValueError("limit must be positive")
        self._check_open()
        return await self._list_prefix(prefix, after, limit)

    async def watch(self, path: str, *, prefix: bool = False, since: int | None = None) -> Watch:
        """Watch the record at `path`, or with `prefix=True` every record whose path starts with
        `path`. Changes with a revision greater than `since` (default: now) are delivered."""
        if prefix:
            check_prefix(path)
        else:
            check_path(path)
        since = self._check_since(since)
        self._check_open()
        return await self._watch(path, prefix, since)

    # sessions
    async def create_session(self, ttl: float = DEFAULT_SESSION_TTL) -> Session:
        """A new session that lives while its keep-alive task refreshes it (every ttl/3)."""
        ttl = check_ttl(ttl)
        self._check_open()
        session = await self._create_session(ttl)
        self._sessions[session.id] = session
        return session

    def leader_election(self, path: str, candidate_id: str, session: Session) -> LeaderElection:
        from pyengine.metadata.election import LeaderElection

        return LeaderElection(self, path, candidate_id, session=session)

    # secondary indexes
    def declare_index(self, name: str, prefix: str, key_fn: Callable[[Record], IndexKey]) -> None:
        """Declare a secondary index over the records whose path starts with `prefix`.

        `key_fn(record)` returns the record's index key (an int, str or bytes, or a tuple of
        them) or None (not indexed). It sees the record being written: path, value, partition
        key, session and version (revisions are 0: not assigned yet). It must be deterministic.
        Declare every index before writing records under its prefix, in every process that
        writes them (declarations are code, not stored). Re-declaring the same name with the
        same prefix replaces the function.
        """
        if not isinstance(name, str) or not _INDEX_NAME.match(name):
            raise ValueError(f"invalid index name {name!r}")
        check_prefix(prefix)
        if not callable(key_fn):
            raise TypeError("key_fn must be callable")
        existing = self._indexes.get(name)
        if existing is not None and existing.prefix != prefix:
            raise ValueError(f"index {name!r} is already declared on {existing.prefix!r}")
        self._indexes[name] = IndexSpec(name, prefix, key_fn)

    def _index(self, name: object) -> IndexSpec:
        if not isinstance(name, str):
            raise TypeError("an index name is a str")
        spec = self._indexes.get(name)
        if spec is None:
            raise ValueError(f"unknown index {name!r} (declare_index first)")
        return spec

    def _indexed(self, path: str) -> bool:
        return any(path.startswith(spec.prefix) for spec in self._indexes.values())

    async def range_query(self, index: str, start: IndexKey = None, end: IndexKey = None, *,
                          prefix: IndexKey = None) -> list[Record]:
        """Records whose `index` key is in [start, end) (None: unbounded), or, with `prefix`,
        equal to it or extending it (a tuple prefix), ordered by index key then path. One
        consistent snapshot."""
        from pyengine.metadata.keys import index_range

        spec = self._index(index)
        bounds = index_range(start, end, prefix)
        self._check_open()
        return await self._range_query(spec, bounds)

    async def range_watch(self, index: str, start: IndexKey = None, end: IndexKey = None, *,
                          prefix: IndexKey = None, since: int | None = None) -> Watch:
        """Watch the records whose `index` key is in [start, end) (or has `prefix`): entering,
        changing in and leaving the range (see `Notification`)."""
        from pyengine.metadata.keys import index_range

        spec = self._index(index)
        bounds = index_range(start, end, prefix)
        since = self._check_since(since)
        self._check_open()
        return await self._range_watch(spec, bounds, since)

    @staticmethod
    def _check_since(since: object) -> int | None:
        if since is None:
            return None
        if isinstance(since, bool) or not isinstance(since, int):
            raise TypeError("since is a revision (int)")
        if since < 0 or since > MAX_INT64:
            raise ValueError(f"invalid since {since}: revisions are >= 0 and 64-bit")
        return since

    # --- backend interface ------------------------------------------------------------------

    async def _start(self) -> None:
        return None

    async def _close(self) -> None:
        return None

    @abc.abstractmethod
    async def _get(self, path: str) -> Record | None: ...

    @abc.abstractmethod
    async def _put(self, path: str, value: bytes, expected_version: int | None, session: Session | None,
                   sequential: bool, partition_key: str | None, expected_mod_revision: int | None = None,
                   guard: tuple[str, int] | None = None) -> Record: ...

    @abc.abstractmethod
    async def _delete(self, path: str, expected_version: int | None, expected_mod_revision: int | None = None,
                      guard: tuple[str, int] | None = None) -> None: ...

    @abc.abstractmethod
    async def _delete_recursive(self, path: str, guard: tuple[str, int] | None) -> None: ...

    @abc.abstractmethod
    async def _get_children(self, path: str) -> list[str]: ...

    @abc.abstractmethod
    async def _list_prefix(self, prefix: str, after: str | None, limit: int | None) -> Page: ...

    @abc.abstractmethod
    async def _watch(self, path: str, prefix: bool, since: int | None) -> Watch: ...

    @abc.abstractmethod
    async def _range_query(self, spec: IndexSpec, bounds: tuple[bytes, bytes | None]) -> list[Record]: ...

    @abc.abstractmethod
    async def _range_watch(self, spec: IndexSpec, bounds: tuple[bytes, bytes | None], since: int | None) -> Watch: ...

    @abc.abstractmethod
    async def _create_session(self, ttl: float) -> Session: ...

    @abc.abstractmethod
    async def _refresh_session(self, session: Session) -> bool:
        """Refresh the lease; False when the store no longer knows the session."""

    @abc.abstractmethod
    async def _revoke_session(self, session: Session) -> None: ...


async def open_metadata_store(url: str | None = "lmdb", env: StorageEnvironment | None = None, *,
                              etcd_root: str = "/pyengine") -> MetadataStore:
    """Open and start the store named by the CLI's `--metadata-store` value: `lmdb` (default:
    the data dir's environment `env`), `memory`, or `etcd://HOST:PORT`."""
    url = url or "lmdb"
    if url == "lmdb":
        if env is None:
            raise ValueError("the lmdb metadata store needs the data dir's storage environment")
        from pyengine.metadata.lmdb_store import LmdbMetadataStore

        store: MetadataStore = LmdbMetadataStore(env)
    elif url == "memory":
        from pyengine.metadata.memory_store import MemoryMetadataStore

        store = MemoryMetadataStore()
    elif url.startswith("etcd://"):
        from pyengine.metadata.etcd_store import EtcdMetadataStore

        host, sep, port = url[len("etcd://"):].rstrip("/").rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"invalid etcd metadata store URL {url!r}: expected etcd://HOST:PORT")
        store = EtcdMetadataStore(host.strip("[]"), int(port), root=etcd_root)
    else:
        raise ValueError(f"unknown metadata store {url!r}: expected lmdb, memory or etcd://HOST:PORT")
    return await store.start()


from pyengine.metadata.election import LeaderElection  # noqa: E402  (needs the names above)
