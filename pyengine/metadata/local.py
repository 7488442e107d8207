"""The engine shared by the in-process backends (memory and LMDB).

Both keep the same ordered key space and run every write as one function over it, applied
atomically (memory: synchronously on the event loop; LMDB: in a transaction nested in the group
commit's write transaction, rolled back alone if the function raises). A write function checks
all its conditions (and encodes what it writes) before it changes anything and returns an
outcome instead of raising, so a failed condition never spoils an LMDB batch shared with other
components: a failed write changes nothing.

Key space (bytes, ordered):

    r<path>                       record envelope: stat + partition key + index entries + value
    i<index>\\0<key><path>         secondary index entry (key = keys.encode_index_key)
    s<parent>                     sequence counter of the sequential children of <parent>
    x<session id>                 a live session
    e<session id><path>           an ephemeral record of that session
    mrev                          the store revision (one per write that changes records)

Notifications are dispatched on the event loop after the write is applied (LMDB: durable), in
revision order, and kept in a bounded in-memory history so that a watch can resume from a
revision (`since`); a revision older than the history raises `CompactedError`.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import logging
import struct
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

from pyengine.metadata import (
    AlreadyExistsError,
    BadVersionError,
    CompactedError,
    IndexSpec,
    MetadataStore,
    MetadataStoreError,
    NotFoundError,
    Notification,
    NotificationType,
    Page,
    Record,
    Session,
    SessionExpiredError,
    Watch,
    check_guard,
    parent_of,
    SEQUENTIAL_DIGITS,
)
from pyengine.metadata.keys import decode_index_entry, decode_local, encode_local, index_keys_for, prefix_end

log = logging.getLogger(__name__)

_R = b"r"
_I = b"i"
_S = b"s"
_X = b"x"
_E = b"e"
_REV = b"mrev"
_U64 = struct.Struct(">Q")

CREATED = NotificationType.CREATED
MODIFIED = NotificationType.MODIFIED
DELETED = NotificationType.DELETED


class KV(Protocol):
    def get(self, key: bytes) -> bytes | None: ...
    def put(self, key: bytes, value: bytes) -> None: ...
    def delete(self, key: bytes) -> None: ...
    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]: ...


class MemoryKV:
    """An ordered dict of bytes: a dict plus the sorted list of its keys."""

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        if key not in self._data:
            bisect.insort(self._keys, key)
        self._data[key] = value

    def delete(self, key: bytes) -> None:
        if self._data.pop(key, None) is not None:
            del self._keys[bisect.bisect_left(self._keys, key)]

    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        i = bisect.bisect_left(self._keys, start)
        keys = self._keys
        while i < len(keys):
            key = keys[i]
            if end is not None and key >= end:
                return
            yield key, self._data[key]
            i += 1


# --- outcomes of write functions --------------------------------------------------------

class Event(NamedTuple):
    notification: Notification
    entry: bytes | None = None      # encoded index key + path, for range watches


class Outcome(NamedTuple):
    result: Any = None
    events: list[Event] = []
    revision: int = 0
    error: BaseException | None = None


def _err(error: BaseException) -> Outcome:
    return Outcome(error=error)


# --- write functions (pure over a KV; conditions first, then changes) --------------------

def _rkey(path: str) -> bytes:
    return _R + path.encode()


def _sid(session_id: int) -> bytes:
    return _U64.pack(session_id)


def _load(kv: KV, path: str) -> tuple[Record, list[tuple[str, bytes]]] | None:
    raw = kv.get(_rkey(path))
    if raw is None:
        return None
    return _decode(path, raw)


def _decode(path: str, raw: bytes) -> tuple[Record, list[tuple[str, bytes]]]:
    version, create_rev, mod_rev, session, pk, entries, value = decode_local(raw)
    return Record(path, value, version, create_rev, mod_rev, session, pk), entries


def _entry_key(name: str, entry: bytes) -> bytes:
    return _I + name.encode() + b"\x00" + entry


def _next_revision(kv: KV) -> int:
    raw = kv.get(_REV)
    revision = (_U64.unpack(raw)[0] if raw else 0) + 1
    kv.put(_REV, _U64.pack(revision))
    return revision


def current_revision(kv: KV) -> int:
    raw = kv.get(_REV)
    return _U64.unpack(raw)[0] if raw else 0


def _index_changes(kv: KV, path: str, revision: int, old: list[tuple[str, bytes]],
                   new: list[tuple[str, bytes]], record: Record | None, session_id: int | None) -> list[Event]:
    """Apply the entry changes of one record (deletions first, then puts) and describe them."""
    events = []
    suffix = path.encode()
    old_keys = dict(old)
    new_keys = dict(new)
    for name, key in old:
        if new_keys.get(name) != key:
            entry = key + suffix
            kv.delete(_entry_key(name, entry))
            events.append(Event(Notification(DELETED, path, revision, None, name, decode_index_entry(entry)[0]), entry))
    for name, key in new:
        entry = key + suffix
        kv.put(_entry_key(name, entry), _U64.pack(session_id or 0))
        kind = MODIFIED if old_keys.get(name) == key else CREATED
        events.append(Event(Notification(kind, path, revision, record, name, decode_index_entry(entry)[0]), entry))
    return events


def _guard_fails(kv: KV, guard: tuple[str, int] | None) -> Outcome | None:
    """The failed outcome of a guarded write whose guard record is not at the guard's mod
    revision; None when the write may go on (or has no guard)."""
    if guard is None:
        return None
    guard_path, guard_revision = guard
    loaded = _load(kv, guard_path)
    try:
        check_guard(guard_path, guard_revision, None if loaded is None else loaded[0].mod_revision)
    except BadVersionError as mismatch:
        return _err(mismatch)
    return None


def txn_put(kv: KV, specs: list[IndexSpec], path: str, value: bytes, expected: int | None,
            session_id: int | None, partition_key: str | None, sequential: bool,
            expected_mod_revision: int | None = None, guard: tuple[str, int] | None = None) -> Outcome:
    refused = _guard_fails(kv, guard)
    if refused is not None:
        return refused
    counter_key = None
    seq = 0
    if sequential:
        counter_key = _S + parent_of(path).encode()
        raw = kv.get(counter_key)
        seq = _U64.unpack(raw)[0] if raw else 0
        while kv.get(_rkey(f"{path}{seq:0{SEQUENTIAL_DIGITS}d}")) is not None:
            seq += 1
        path = f"{path}{seq:0{SEQUENTIAL_DIGITS}d}"
    loaded = _load(kv, path)
    old, old_entries = loaded if loaded is not None else (None, [])
    if expected == -1 and old is not None:
        return _err(AlreadyExistsError(f"{path} already exists"))
    if expected is not None and expected >= 0 and (old is None or old.version != expected):
        found = "does not exist" if old is None else f"is at version {old.version}"
        return _err(BadVersionError(f"{path} {found}, expected version {expected}"))
    if expected_mod_revision is not None and (old is None or old.mod_revision != expected_mod_revision):
        found = "does not exist" if old is None else f"was last written at revision {old.mod_revision}"
        return _err(BadVersionError(f"{path} {found}, expected revision {expected_mod_revision}"))
    if session_id is not None and kv.get(_X + _sid(session_id)) is None:
        return _err(SessionExpiredError(f"session {session_id:x} has expired"))
    version = old.version + 1 if old is not None else 0
    try:
        entries = index_keys_for(specs, Record(path, value, version, 0, 0, session_id, partition_key))
    except MetadataStoreError as exc:
        return _err(exc)
    revision = current_revision(kv) + 1
    record = Record(path, value, version, old.create_revision if old is not None else revision, revision,
                    session_id, partition_key)
    try:
        envelope = encode_local(version, record.create_revision, revision, session_id, partition_key,
                                entries, value)
    except (struct.error, ValueError) as exc:
        return _err(MetadataStoreError(f"cannot store {path}: {exc}"))
    # -- changes
    if counter_key is not None:
        kv.put(counter_key, _U64.pack(seq + 1))
    kv.put(_REV, _U64.pack(revision))
    kv.put(_rkey(path), envelope)
    old_session = old.session_id if old is not None else None
    if old_session is not None and old_session != session_id:
        kv.delete(_E + _sid(old_session) + path.encode())
    if session_id is not None and old_session != session_id:
        kv.put(_E + _sid(session_id) + path.encode(), b"")
    events = [Event(Notification(CREATED if old is None else MODIFIED, path, revision, record))]
    events += _index_changes(kv, path, revision, old_entries, entries, record, session_id)
    return Outcome(record, events, revision)


def _remove(kv: KV, record: Record, entries: list[tuple[str, bytes]], revision: int) -> list[Event]:
    kv.delete(_rkey(record.path))
    if record.session_id is not None:
        kv.delete(_E + _sid(record.session_id) + record.path.encode())
    events = [Event(Notification(DELETED, record.path, revision))]
    return events + _index_changes(kv, record.path, revision, entries, [], None, None)


def txn_delete(kv: KV, path: str, expected: int | None, expected_mod_revision: int | None = None,
               guard: tuple[str, int] | None = None) -> Outcome:
    refused = _guard_fails(kv, guard)
    if refused is not None:
        return refused
    loaded = _load(kv, path)
    if loaded is None:
        return _err(NotFoundError(f"{path} does not exist"))
    old, entries = loaded
    if expected is not None and old.version != expected:
        return _err(BadVersionError(f"{path} is at version {old.version}, expected version {expected}"))
    if expected_mod_revision is not None and old.mod_revision != expected_mod_revision:
        return _err(BadVersionError(f"{path} was last written at revision {old.mod_revision}, "
                                    f"expected revision {expected_mod_revision}"))
    revision = _next_revision(kv)
    return Outcome(None, _remove(kv, old, entries, revision), revision)


def txn_delete_recursive(kv: KV, path: str, guard: tuple[str, int] | None = None) -> Outcome:
    refused = _guard_fails(kv, guard)
    if refused is not None:
        return refused
    victims = []
    loaded = _load(kv, path)
    if loaded is not None:
        victims.append(loaded)
    start = _rkey(path + "/")
    victims += [_decode(key[1:].decode(), raw) for key, raw in kv.scan(start, prefix_end(start))]
    counters = [key for key, _ in kv.scan(_S + (path + "/").encode(), prefix_end(_S + (path + "/").encode()))]
    if kv.get(_S + path.encode()) is not None:
        counters.append(_S + path.encode())
    for key in counters:
        kv.delete(key)
    if not victims:
        return Outcome(None, [], 0)
    revision = _next_revision(kv)
    events = []
    for record, entries in victims:
        events += _remove(kv, record, entries, revision)
    return Outcome(None, events, revision)


def txn_open_session(kv: KV, session_id: int) -> Outcome:
    kv.put(_X + _sid(session_id), b"")
    return Outcome(True)


def txn_end_session(kv: KV, session_id: int) -> Outcome:
    """Delete a session and its ephemeral records (one revision)."""
    marker = _X + _sid(session_id)
    if kv.get(marker) is None:
        return Outcome(False)
    kv.delete(marker)
    prefix = _E + _sid(session_id)
    paths = [key[len(prefix):].decode() for key, _ in kv.scan(prefix, prefix_end(prefix))]
    victims = [loaded for loaded in (_load(kv, path) for path in paths) if loaded is not None]
    for path in paths:
        kv.delete(prefix + path.encode())
    if not victims:
        return Outcome(True)
    revision = _next_revision(kv)
    events = []
    for record, entries in victims:
        events += _remove(kv, record, entries, revision)
    return Outcome(True, events, revision)


def txn_end_all_sessions(kv: KV) -> Outcome:
    """At start-up: every session of an earlier process is gone."""
    sessions = [_U64.unpack(key[1:9])[0] for key, _ in kv.scan(_X, prefix_end(_X))]
    events: list[Event] = []
    revision = 0
    for session_id in sessions:
        outcome = txn_end_session(kv, session_id)
        events += outcome.events
        revision = max(revision, outcome.revision)
    return Outcome(len(sessions), events, revision)


# --- reads ----------------------------------------------------------------------------------

def read_children(kv: KV, path: str) -> list[str]:
    base = (path if path == "/" else path + "/").encode()
    start = _R + base
    end = prefix_end(start)
    children: set[str] = set()
    while True:
        found = next(kv.scan(start, end), None)
        if found is None:
            return sorted(children, key=str.encode)
        rest = found[0][len(_R) + len(base):]
        child, slash, _ = rest.partition(b"/")
        children.add(child.decode())
        # below `child/` every key starts with it: jump past them ('0' follows '/')
        start = _R + base + child + b"0" if slash else found[0] + b"\x00"


def read_page(kv: KV, prefix: str, after: str | None, limit: int | None) -> Page:
    start = _R + prefix.encode()
    end = prefix_end(start)
    if after is not None:
        start = max(start, _R + after.encode() + b"\x00")
    records = []
    more = False
    for key, raw in kv.scan(start, end):
        if limit is not None and len(records) >= limit:
            more = True
            break
        records.append(_decode(key[1:].decode(), raw)[0])
    return Page(records, current_revision(kv), more)


def read_index(kv: KV, name: str, bounds: tuple[bytes, bytes | None]) -> list[Record]:
    base = _I + name.encode() + b"\x00"
    low, high = bounds
    end = base + high if high is not None else prefix_end(base)
    records = []
    for key, _ in kv.scan(base + low, end):
        _key, path = decode_index_entry(key[len(base):])
        loaded = _load(kv, path)
        if loaded is None:
            raise MetadataStoreError(f"index {name!r} names a missing record {path}")
        records.append(loaded[0])
    return records


def read_record(kv: KV, path: str) -> Record | None:
    loaded = _load(kv, path)
    return loaded[0] if loaded is not None else None


# --- the store ----------------------------------------------------------------------------------

class _Watcher:
    __slots__ = ("watch", "since", "path", "prefix", "index", "low", "high")

    def __init__(self, watch: Watch, since: int, path: str | None = None, prefix: bool = False,
                 index: str | None = None, low: bytes = b"", high: bytes | None = None) -> None:
        self.watch = watch
        self.since = since
        self.path = path
        self.prefix = prefix
        self.index = index
        self.low = low
        self.high = high

    def offer(self, revision: int, events: list[Event]) -> None:
        if revision <= self.since:
            return
        push = self.watch._push
        if self.index is None:
            for event in events:
                n = event.notification
                if n.index is None and (n.path == self.path or (self.prefix and n.path.startswith(self.path))):
                    push(n)
        else:
            for event in events:
                n = event.notification
                if n.index == self.index and event.entry >= self.low and (self.high is None or event.entry < self.high):
                    push(n)


class LocalMetadataStore(MetadataStore):
    """Base of the memory and LMDB stores: subclasses provide reads (`_reader`), the atomic
    application of a write function (`_apply`) and session ids."""

    history_revisions = 10_000

    def __init__(self) -> None:
        super().__init__()
        self._watchers: list[_Watcher] = []
        self._history: collections.deque[tuple[int, list[Event]]] = collections.deque()
        self._floor = 0          # every revision > floor is in the history
        self._delivered = 0      # the last revision dispatched to watchers
        self._expiry: dict[int, asyncio.TimerHandle] = {}
        self._session_ttl: dict[int, float] = {}
        self._background: set[asyncio.Task] = set()

    # subclass hooks
    def _reader(self) -> AbstractContextManager[KV]:
        raise NotImplementedError

    async def _apply(self, fn: Callable[[KV], Outcome]) -> Outcome:
        """Apply `fn` atomically; dispatch its events (in order) once applied."""
        raise NotImplementedError

    async def _new_session_id(self) -> int:
        raise NotImplementedError

    def _set_floor(self, revision: int) -> None:
        self._floor = self._delivered = revision

    # dispatch
    def _dispatch(self, outcome: Outcome) -> None:
        if outcome.error is not None or not outcome.events:
            return
        revision = outcome.revision
        self._history.append((revision, outcome.events))
        while len(self._history) > self.history_revisions:
            self._floor = self._history.popleft()[0]
        self._delivered = max(self._delivered, revision)
        for watcher in list(self._watchers):
            watcher.offer(revision, outcome.events)

    async def _run(self, fn: Callable[[KV], Outcome]) -> Any:
        outcome = await self._apply(fn)
        if outcome.error is not None:
            raise outcome.error
        return outcome.result

    # records
    async def _get(self, path: str) -> Record | None:
        with self._reader() as kv:
            return read_record(kv, path)

    async def _put(self, path: str, value: bytes, expected_version: int | None, session: Session | None,
                   sequential: bool, partition_key: str | None, expected_mod_revision: int | None = None,
                   guard: tuple[str, int] | None = None) -> Record:
        specs = list(self._indexes.values())
        session_id = session.id if session is not None else None
        return await self._run(lambda kv: txn_put(kv, specs, path, value, expected_version, session_id,
                                                  partition_key, sequential, expected_mod_revision, guard))

    async def _delete(self, path: str, expected_version: int | None, expected_mod_revision: int | None = None,
                      guard: tuple[str, int] | None = None) -> None:
        await self._run(lambda kv: txn_delete(kv, path, expected_version, expected_mod_revision, guard))

    async def _delete_recursive(self, path: str, guard: tuple[str, int] | None) -> None:
        await self._run(lambda kv: txn_delete_recursive(kv, path, guard))

    async def _get_children(self, path: str) -> list[str]:
        with self._reader() as kv:
            return read_children(kv, path)

    async def _list_prefix(self, prefix: str, after: str | None, limit: int | None) -> Page:
        with self._reader() as kv:
            return read_page(kv, prefix, after, limit)

    async def _range_query(self, spec: IndexSpec, bounds: tuple[bytes, bytes | None]) -> list[Record]:
        with self._reader() as kv:
            return read_index(kv, spec.name, bounds)

    # watches
    def _register(self, watcher_args: dict[str, Any], since: int | None) -> Watch:
        if since is not None and since < self._floor:
            raise CompactedError(f"revision {since} is older than the notification history "
                                 f"(kept after revision {self._floor}): re-read and watch again")
        start = since if since is not None else self._delivered
        watcher: _Watcher

        def on_close(_watch: Watch) -> None:
            self._watches.discard(_watch)
            if watcher in self._watchers:
                self._watchers.remove(watcher)

        watch = Watch(start, on_close)
        watcher = _Watcher(watch, start, **watcher_args)
        for revision, events in self._history:
            if revision > start:
                watcher.offer(revision, events)
        self._watchers.append(watcher)
        self._watches.add(watch)
        return watch

    async def _watch(self, path: str, prefix: bool, since: int | None) -> Watch:
        return self._register({"path": path, "prefix": prefix}, since)

    async def _range_watch(self, spec: IndexSpec, bounds: tuple[bytes, bytes | None], since: int | None) -> Watch:
        return self._register({"index": spec.name, "low": bounds[0], "high": bounds[1]}, since)

    # sessions: the store is the "server" that expires them
    async def _create_session(self, ttl: float) -> Session:
        session_id = await self._new_session_id()
        await self._run(lambda kv: txn_open_session(kv, session_id))
        if self._closed:
            # close() ran while the session was written: it ended the sessions it knew, not
            # this one, which nothing would end now (no expiry runs on a closed store)
            try:
                await self._run(lambda kv: txn_end_session(kv, session_id))
            except MetadataStoreError as exc:      # (LMDB: the next start-up ends it)
                log.warning("ending metadata session %x of a closed store: %s", session_id, exc)
            raise MetadataStoreError("create a session: the metadata store is closed")
        self._session_ttl[session_id] = ttl
        self._arm(session_id)
        return Session(self, session_id, ttl)

    def _arm(self, session_id: int) -> None:
        loop = asyncio.get_running_loop()
        timer = self._expiry.pop(session_id, None)
        if timer is not None:
            timer.cancel()
        self._expiry[session_id] = loop.call_later(self._session_ttl[session_id], self._expire, session_id)

    def _expire(self, session_id: int) -> None:
        self._expiry.pop(session_id, None)
        task = asyncio.get_running_loop().create_task(self._expire_session(session_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _expire_session(self, session_id: int) -> None:
        try:
            await self._end_session(session_id, expired=True)
        except MetadataStoreError as exc:
            log.warning("expiring metadata session %x failed (retrying): %s", session_id, exc)

    async def _end_session(self, session_id: int, expired: bool) -> None:
        timer = self._expiry.pop(session_id, None)
        if timer is not None:
            timer.cancel()
        ttl = self._session_ttl.pop(session_id, None)
        try:
            await self._run(lambda kv: txn_end_session(kv, session_id))
        except MetadataStoreError:
            # not written: its ephemeral records stay until the end is written, so expire it
            # again after its TTL (as etcd expires a lease it could not revoke)
            if ttl is not None and not self._closed:
                self._session_ttl[session_id] = ttl
                self._arm(session_id)
            raise
        finally:
            session = self._sessions.get(session_id)
            if expired and session is not None:
                session._expired()

    async def _refresh_session(self, session: Session) -> bool:
        if self._closed or session.id not in self._expiry:
            return False            # (a closed store expires no session: it ends them all)
        self._arm(session.id)
        return True

    async def _revoke_session(self, session: Session) -> None:
        await self._end_session(session.id, expired=False)

    async def _close(self) -> None:
        for timer in self._expiry.values():
            timer.cancel()
        self._expiry.clear()
        for task in list(self._background):
            try:
                await task
            except Exception:
                pass
