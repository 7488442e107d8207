"""The metadata store on etcd (v3 API, the `aetcd` asyncio client), for several brokers.

Keys, under a root prefix (default `/pyengine`; several clusters or tests can share an etcd):

    <root>/r<path>                    a record: envelope (partition key, index entries) + value
    <root>/i/<index>\\0<key><path>     a secondary index entry (key = keys.encode_index_key)
    <root>/s<parent>                  sequence counter of <parent> (its etcd version is the count)

* Versions, revisions: a record's version is etcd's version - 1 (Pulsar's convention: 0 at
  creation); create/mod revisions and notification revisions are etcd's revisions.
* CAS: one etcd transaction comparing the key's version (`expected_version + 1`), or its
  create revision with 0 for create-if-absent.
* Guarded writes: the write's transaction also compares the guard key's mod revision, and
  its failure branch reads the guard key, to tell a failed guard from a failed condition.
* Records under an indexed prefix are written by read-then-transaction: read the record (its
  envelope names its current index entries), then one transaction that compares the record's
  mod revision with the one read and puts the record, deletes its stale index entries and puts
  the new ones; a concurrent change fails the comparison and the write is retried from the
  read (the caller's expected version is checked again each time). Record and entries share
  one revision, so readers and watchers never see one without the other.
* Sequential keys: a transaction that compares the parent's counter version with the number it
  will use, bumps the counter and creates the record (and its index entries) together: numbers
  are unique, increasing, and in creation order. Concurrent sequential puts of this process on
  one parent are serialized locally (and the next number is remembered), so that they do not
  have to retry against each other.
* Sessions are leases (TTL rounded up to whole seconds, at least etcd's minimum); the session's
  keep-alive task refreshes them (aetcd has no keep-alive of its own). Ephemeral records and
  their index entries are attached to the lease: etcd deletes them all in one revision when
  the lease is revoked or expires.
* Watches are etcd watches from an explicit start revision (the client takes replies of any
  size: etcd sends a catching-up watch many revisions at once). A watch's pump task remembers the
  last revision it delivered; when the stream breaks (etcd restarted, connection lost) it
  re-creates the etcd watch from the next revision, with backoff, so an open watch loses no
  notification. If etcd has compacted that history the watch fails with `CompactedError`.
  Range watches watch the index entries and read each record at the revision of its event.
* Range queries read the index entries and then the records at the same revision (etcd MVCC):
  one consistent snapshot. `list_prefix` reads in pages (bounded replies),
  each at the revision of the first: one snapshot too, however many records it returns.
* Versions and revisions are etcd's int64 (the public methods refuse larger ones); an expected
  version whose etcd version (+1) would not fit compares as never matching, as on the local
  backends.
* An operation in flight when the store closes fails with `MetadataStoreError`: gRPC cancels
  its call when the channel closes, and that `CancelledError` is turned into the store's
  error unless the calling task itself is being cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import aetcd
from aetcd import rpc

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
    MAX_INT64,
    SEQUENTIAL_DIGITS,
)
from pyengine.metadata.keys import decode_index_entry, decode_remote, encode_remote, index_keys_for, prefix_end

log = logging.getLogger(__name__)

MAX_TXN_OPS = 128            # etcd's default --max-txn-ops
LIST_PAGE = 256              # records per range of list_prefix, to start with
LIST_PAGE_MAX = 4096         # ... grown up to this while the responses stay small
LIST_PAGE_BYTES = 1 << 20    # "small": a page under a quarter of this
LIST_RESTARTS = 3            # a list_prefix whose snapshot got compacted meanwhile starts over
DELETE_TRIES = 16            # a delete's read-then-compare, retried while the record changes in between
RECONNECT_MIN = 0.05
RECONNECT_MAX = 2.0


def _cmp(key: bytes, target: str, result: str, value: int) -> Any:
    compare = rpc.Compare(key=key, target=getattr(rpc.Compare, target), result=getattr(rpc.Compare, result))
    setattr(compare, {"VERSION": "version", "CREATE": "create_revision", "MOD": "mod_revision"}[target], value)
    return compare


def _op_put(key: bytes, value: bytes, lease: int = 0, prev_kv: bool = False) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease, prev_kv=prev_kv))


def _op_delete(key: bytes) -> Any:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))


def _op_range(key: bytes, revision: int = 0) -> Any:
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key, revision=revision))


def _version_cmp(key: bytes, expected: int) -> Any:
    """The compare of a record's version with `expected` (etcd's version counts from 1). When
    etcd's number would not fit its int64, no record can have that version: a compare that
    never holds (the caller's failure branch then tells a missing record from a mismatch)."""
    if expected + 1 > MAX_INT64:
        return _cmp(key, "VERSION", "LESS", 0)
    return _cmp(key, "VERSION", "EQUAL", expected + 1)


def _after(revision: int) -> int:
    """The etcd start revision of "every change after `revision`" (kept within int64: a
    watch from the largest revision sees nothing, as any watch from there would)."""
    return min(revision + 1, MAX_INT64)


def _caller_cancelled() -> bool:
    """After a `CancelledError` out of a gRPC call: whether the calling task itself is being
    cancelled (then it must propagate). gRPC also raises `CancelledError` when it cancels the
    call on its own, when the channel is closed under it (the store is closing): not a
    cancellation of the caller, a failed operation."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _too_large(error: MetadataStoreError) -> bool:
    """Whether a failed read's reply exceeded gRPC's message limit (RESOURCE_EXHAUSTED)."""
    cause = error.__cause__
    return isinstance(cause, rpc.AioRpcError) and cause.code() == rpc.StatusCode.RESOURCE_EXHAUSTED


def _error(exc: BaseException, what: str) -> MetadataStoreError:
    if isinstance(exc, MetadataStoreError):
        return exc
    if isinstance(exc, rpc.AioRpcError):
        code, details = exc.code(), exc.details() or ""
        if "lease not found" in details:
            return SessionExpiredError(f"{what}: the session has expired ({details})")
        if "compacted" in details:
            return CompactedError(f"{what}: {details}")
        if code in (rpc.StatusCode.UNAVAILABLE, rpc.StatusCode.DEADLINE_EXCEEDED):
            return MetadataStoreError(f"{what}: etcd is unreachable ({code.name}: {details})")
        return MetadataStoreError(f"{what}: etcd error {code.name}: {details}")
    if isinstance(exc, aetcd.exceptions.RevisionCompactedError):
        return CompactedError(f"{what}: {exc}")
    if isinstance(exc, aetcd.exceptions.ClientError):
        if "lease not found" in str(exc):
            return SessionExpiredError(f"{what}: the session has expired ({exc})")
        return MetadataStoreError(f"{what}: {exc}")
    return MetadataStoreError(f"{what}: {exc!r}")


class _Unreadable(MetadataStoreError):
    """A key or value under the store's root that it cannot read (not written by a pyengine
    store, or corrupt): a watch meeting one fails with it, as a read does; retrying would only
    meet it again."""


@contextlib.contextmanager
def _reading(what: str) -> Iterator[None]:
    try:
        yield
    except MetadataStoreError as exc:
        raise _Unreadable(f"{what}: {exc}") from exc


class _SeqLock:
    """Per-parent lock for sequential puts, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class EtcdMetadataStore(MetadataStore):
    def __init__(self, host: str = "127.0.0.1", port: int = 2379, *, root: str = "/pyengine",
                 timeout: float = 10.0) -> None:
        super().__init__()
        if not isinstance(root, str) or not root.startswith("/") or root.endswith("/") or "\x00" in root:
            raise ValueError(f"invalid etcd root prefix {root!r}: like /pyengine")
        self.host = host
        self.port = port
        self.root = root
        self.timeout = timeout
        self._r = (root + "/r").encode()
        self._i = (root + "/i/").encode()
        self._s = (root + "/s").encode()
        self._client: aetcd.Client | None = None
        self._pumps: set[asyncio.Task] = set()
        self._seq_locks: dict[str, _SeqLock] = {}
        self._seq_next: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"EtcdMetadataStore({self.host}:{self.port}{self.root})"

    # --- plumbing -------------------------------------------------------------------------

    async def _start(self) -> None:
        # no receive limit: a watch catching up gets up to 1000 revisions in one reply, which
        # can exceed gRPC's default 4 MiB; the client would drop the stream every time, and
        # the watch, resuming from the same revision, would never deliver again
        # an IPv6 address goes in brackets: gRPC reads "::1:2379" as a host name
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        self._client = aetcd.Client(host, self.port, timeout=self.timeout,
                                    options={"grpc.max_receive_message_length": -1})
        try:
            await self._client.connect()
            await self._range(rpc.RangeRequest(key=self._r, keys_only=True, limit=1))
        except Exception as exc:
            await self._client.close()
            raise MetadataStoreError(f"cannot reach etcd at {self.host}:{self.port}: {_error(exc, 'connect')}") from exc

    async def _close(self) -> None:
        for task in list(self._pumps):
            task.cancel()
        for task in list(self._pumps):
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self._client is not None:
            await self._client.close()

    @property
    def client(self) -> aetcd.Client:
        assert self._client is not None, "not started"
        return self._client

    def _call_cancelled(self, what: str) -> MetadataStoreError:
        """The error of an operation whose gRPC call was cancelled under it (not by its caller)."""
        if self._closed:
            return MetadataStoreError(f"{what}: the metadata store is closed")
        return MetadataStoreError(f"{what}: the etcd call was cancelled (connection closed)")

    async def _rpc(self, method: Callable[..., Any], request: Any, what: str) -> Any:
        client = self.client
        try:
            return await method(request, timeout=self.timeout, metadata=client.metadata)
        except asyncio.CancelledError:
            if _caller_cancelled():
                raise
            raise self._call_cancelled(what) from None
        except Exception as exc:
            raise _error(exc, what) from exc

    async def _range(self, request: Any) -> Any:
        return await self._rpc(self.client.kvstub.Range, request, "read")

    async def _txn(self, compare: list, success: list, failure: list | None = None) -> Any:
        request = rpc.TxnRequest(compare=compare, success=success, failure=failure or [])
        return await self._rpc(self.client.kvstub.Txn, request, "write")

    def _rkey(self, path: str) -> bytes:
        return self._r + path.encode()

    def _ikey(self, name: str, entry: bytes) -> bytes:
        return self._i + name.encode() + b"\x00" + entry

    def _record(self, kv: Any) -> Record:
        partition_key, _entries, value = decode_remote(kv.value)
        return Record(self._path(kv.key), value, kv.version - 1, kv.create_revision, kv.mod_revision,
                      kv.lease or None, partition_key)

    def _path(self, key: bytes) -> str:
        try:
            return key[len(self._r):].decode()
        except UnicodeDecodeError:
            raise MetadataStoreError(f"not a pyengine metadata record: key {key!r}") from None

    async def _current_revision(self) -> int:
        response = await self._range(rpc.RangeRequest(key=self._r, keys_only=True, limit=1))
        return response.header.revision

    async def _get_kv(self, path: str) -> Any:
        response = await self._range(rpc.RangeRequest(key=self._rkey(path)))
        return response.kvs[0] if response.kvs else None

    async def _get_guarded_kv(self, path: str, guard: tuple[str, int] | None) -> Any:
        """`_get_kv`, and with a guard the guard record in the same snapshot: GuardFailedError
        when it is not at the guard's mod revision (a guard fails a write before its own
        conditions do, as on the local backends)."""
        if guard is None:
            return await self._get_kv(path)
        guard_path, guard_revision = guard
        response = await self._txn([], [_op_range(self._rkey(path)), _op_range(self._rkey(guard_path))])
        kvs, guard_kvs = (item.response_range.kvs for item in response.responses)
        check_guard(guard_path, guard_revision, guard_kvs[0].mod_revision if guard_kvs else None)
        return kvs[0] if kvs else None

    # --- records ------------------------------------------------------------------------------

    async def _get(self, path: str) -> Record | None:
        kv = await self._get_kv(path)
        return self._record(kv) if kv is not None else None

    async def _put(self, path: str, value: bytes, expected_version: int | None, session: Session | None,
                   sequential: bool, partition_key: str | None, expected_mod_revision: int | None = None,
                   guard: tuple[str, int] | None = None) -> Record:
        lease = session.id if session is not None else 0
        if sequential:
            return await self._put_sequential(path, value, lease, partition_key, guard)
        if self._indexed(path):
            return await self._put_indexed(path, value, expected_version, lease, partition_key,
                                           expected_mod_revision, guard)
        key = self._rkey(path)
        put = _op_put(key, encode_remote(partition_key, [], value), lease, prev_kv=True)
        revision_check = [] if expected_mod_revision is None else [_cmp(key, "MOD", "EQUAL", expected_mod_revision)]
        if expected_version is None:
            response = await self._guarded_txn(revision_check, [put], guard)
        elif expected_version == -1:
            response = await self._guarded_txn([_cmp(key, "CREATE", "EQUAL", 0)], [put], guard)
            if not response.succeeded:
                raise AlreadyExistsError(f"{path} already exists")
        else:
            response = await self._guarded_txn([_version_cmp(key, expected_version)] + revision_check, [put], guard)
        if not response.succeeded:
            raise _mismatch(path, expected_version, expected_mod_revision)
        revision = response.header.revision
        prev = response.responses[0].response_put.prev_kv
        if prev.create_revision:
            return Record(path, value, prev.version, prev.create_revision, revision, lease or None, partition_key)
        return Record(path, value, 0, revision, revision, lease or None, partition_key)

    def _entry_ops(self, path: str, old: list[tuple[str, bytes]], new: list[tuple[str, bytes]], lease: int) -> list:
        suffix = path.encode()
        new_keys = dict(new)
        ops = [_op_delete(self._ikey(name, key + suffix)) for name, key in old if new_keys.get(name) != key]
        ops += [_op_put(self._ikey(name, key + suffix), b"", lease) for name, key in new]
        return ops

    async def _put_indexed(self, path: str, value: bytes, expected: int | None, lease: int,
                           partition_key: str | None, expected_mod_revision: int | None = None,
                           guard: tuple[str, int] | None = None) -> Record:
        key = self._rkey(path)
        while True:
            kv = await self._get_guarded_kv(path, guard)
            if expected == -1 and kv is not None:
                raise AlreadyExistsError(f"{path} already exists")
            if expected is not None and expected >= 0 and (kv is None or kv.version - 1 != expected):
                raise BadVersionError(f"{path}: expected version {expected} does not match")
            if expected_mod_revision is not None and (kv is None or kv.mod_revision != expected_mod_revision):
                raise BadVersionError(f"{path}: expected revision {expected_mod_revision} does not match")
            old_entries = decode_remote(kv.value)[1] if kv is not None else []
            version = kv.version if kv is not None else 0
            entries = index_keys_for(self._indexes.values(),
                                     Record(path, value, version, 0, 0, lease or None, partition_key))
            ops = [_op_put(key, encode_remote(partition_key, entries, value), lease)]
            ops += self._entry_ops(path, old_entries, entries, lease)
            check = _cmp(key, "MOD", "EQUAL", kv.mod_revision) if kv is not None else _cmp(key, "CREATE", "EQUAL", 0)
            response = await self._guarded_txn([check], ops, guard)
            if response.succeeded:
                revision = response.header.revision
                create = kv.create_revision if kv is not None else revision
                return Record(path, value, version, create, revision, lease or None, partition_key)

    async def _put_sequential(self, path: str, value: bytes, lease: int, partition_key: str | None,
                              guard: tuple[str, int] | None = None) -> Record:
        parent = parent_of(path)
        counter = self._s + parent.encode()
        slot = self._seq_locks.get(parent)
        if slot is None:
            slot = self._seq_locks[parent] = _SeqLock()
        slot.users += 1
        try:
            async with slot.lock:
                while True:
                    seq = self._seq_next.pop(parent, None)
                    if seq is None:
                        response = await self._range(rpc.RangeRequest(key=counter))
                        seq = response.kvs[0].version if response.kvs else 0
                    full = f"{path}{seq:0{SEQUENTIAL_DIGITS}d}"
                    key = self._rkey(full)
                    entries = index_keys_for(self._indexes.values(),
                                             Record(full, value, 0, 0, 0, lease or None, partition_key))
                    ops = [_op_put(counter, b""), _op_put(key, encode_remote(partition_key, entries, value), lease)]
                    ops += self._entry_ops(full, [], entries, lease)
                    response = await self._guarded_txn(
                        [_cmp(counter, "VERSION", "EQUAL", seq), _cmp(key, "CREATE", "EQUAL", 0)], ops, guard,
                        [_op_range(counter)])
                    if response.succeeded:
                        self._seq_next[parent] = seq + 1
                        if len(self._seq_next) > 4096:
                            self._seq_next.pop(next(iter(self._seq_next)))
                        revision = response.header.revision
                        return Record(full, value, 0, revision, revision, lease or None, partition_key)
                    kvs = response.responses[0].response_range.kvs
                    if (kvs[0].version if kvs else 0) == seq:
                        # that number is taken by a record created by hand: skip it
                        await self._txn([_cmp(counter, "VERSION", "EQUAL", seq)], [_op_put(counter, b"")])
        finally:
            slot.users -= 1
            if slot.users == 0:
                self._seq_locks.pop(parent, None)

    async def _delete(self, path: str, expected_version: int | None, expected_mod_revision: int | None = None,
                      guard: tuple[str, int] | None = None) -> None:
        if self._indexed(path):
            await self._delete_indexed(path, expected_version, expected_mod_revision, guard)
            return
        key = self._rkey(path)
        checks = [_version_cmp(key, expected_version) if expected_version is not None
                  else _cmp(key, "VERSION", "GREATER", 0)]
        if expected_mod_revision is not None:
            checks.append(_cmp(key, "MOD", "EQUAL", expected_mod_revision))
        response = await self._guarded_txn(checks, [_op_delete(key)], guard, [_op_range(key)])
        if not response.succeeded:
            if not response.responses[0].response_range.kvs:
                raise NotFoundError(f"{path} does not exist")
            raise _mismatch(path, expected_version, expected_mod_revision)

    async def _delete_indexed(self, path: str, expected: int | None, expected_mod_revision: int | None = None,
                              guard: tuple[str, int] | None = None) -> None:
        """Delete by read-then-transaction (the record and the index entries its envelope
        names; none for a record outside indexed prefixes), retried from the read while the
        record changes in between."""
        key = self._rkey(path)
        for _ in range(DELETE_TRIES):
            kv = await self._get_guarded_kv(path, guard)
            if kv is None:
                raise NotFoundError(f"{path} does not exist")
            if expected is not None and kv.version - 1 != expected:
                raise BadVersionError(f"{path} is at version {kv.version - 1}, expected version {expected}")
            if expected_mod_revision is not None and kv.mod_revision != expected_mod_revision:
                raise BadVersionError(f"{path} was last written at revision {kv.mod_revision}, "
                                      f"expected revision {expected_mod_revision}")
            entries = decode_remote(kv.value)[1]
            ops = [_op_delete(key)] + self._entry_ops(path, entries, [], 0)
            response = await self._guarded_txn([_cmp(key, "MOD", "EQUAL", kv.mod_revision)], ops, guard)
            if response.succeeded:
                return
        # bounded: a writer that changes the record between every read and delete would hold
        # the caller here for good (a livelock); it decides what to do now
        raise BadVersionError(f"{path} changed {DELETE_TRIES} times while it was being deleted")

    async def _guarded_txn(self, compare: list, success: list, guard: tuple[str, int] | None,
                           failure: list | None = None) -> Any:
        """`_txn` that also compares the guard record's mod revision (GuardFailedError when the
        guard is what failed it). The responses of `failure` come first, as without a guard."""
        if guard is None:
            return await self._txn(compare, success, failure)
        guard_path, guard_revision = guard
        guard_key = self._rkey(guard_path)
        response = await self._txn(compare + [_cmp(guard_key, "MOD", "EQUAL", guard_revision)], success,
                                   (failure or []) + [_op_range(guard_key)])
        if not response.succeeded:
            kvs = response.responses[-1].response_range.kvs
            check_guard(guard_path, guard_revision, kvs[0].mod_revision if kvs else None)
        return response

    async def _delete_recursive(self, path: str, guard: tuple[str, int] | None) -> None:
        base = self._rkey(path + "/")
        paths = []
        if await self._get_kv(path) is not None:
            paths.append(path)
        after = base
        while True:
            response = await self._range(rpc.RangeRequest(key=after, range_end=prefix_end(base), keys_only=True,
                                                          limit=1000))
            paths += [self._path(kv.key) for kv in response.kvs]
            if not response.more:
                break
            after = response.kvs[-1].key + b"\x00"
        # a guard record in the tree goes last: every delete before it is checked against it
        last = [guard[0]] if guard is not None and guard[0] in paths else []
        if last:
            paths.remove(guard[0])
        counters = self._s + (path + "/").encode()
        for victim in paths:
            # read-then-delete, retried while the record changes in between (a record written
            # meanwhile is deleted too, in its new state, with its new index entries)
            try:
                await self._delete_indexed(victim, None, guard=guard)
            except NotFoundError:
                pass
        await self._guarded_txn([], [_op_delete(self._s + path.encode()),
                                     rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(
                                         key=counters, range_end=prefix_end(counters)))], guard)
        for victim in last:
            try:
                await self._delete_indexed(victim, None, guard=guard)
            except NotFoundError:
                pass
        for parent in [p for p in self._seq_next if p == path or p.startswith(path + "/")]:
            self._seq_next.pop(parent, None)

    async def _get_children(self, path: str) -> list[str]:
        base = self._rkey(path if path == "/" else path + "/")
        end = prefix_end(base)
        children: list[str] = []
        start = base
        while True:
            response = await self._range(rpc.RangeRequest(key=start, range_end=end, keys_only=True, limit=1000))
            for kv in response.kvs:
                self._path(kv.key)          # a key that is not UTF-8: MetadataStoreError
                name = kv.key[len(base):].partition(b"/")[0].decode()
                if not children or children[-1] != name:
                    children.append(name)
            if not response.more:
                break
            start = response.kvs[-1].key + b"\x00"
        return sorted(set(children), key=str.encode)

    async def _list_prefix(self, prefix: str, after: str | None, limit: int | None) -> Page:
        first = self._rkey(prefix)
        end = prefix_end(first)
        assert end is not None
        if after is not None:
            first = max(first, self._rkey(after) + b"\x00")
        kvs, revision, more = await self._scan(first, end, limit=limit)
        return Page([self._record(kv) for kv in kvs], revision, more)

    async def _scan(self, first: bytes, end: bytes, *, limit: int | None = None,
                    keys_only: bool = False) -> tuple[list[Any], int, bool]:
        """The keys in [first, end) (at most `limit`), the revision they were read at, and
        whether there are more. In pages: one etcd range of every key could be huge (or exceed a
        client's reply limit). The first page fixes the revision, the others read at it: one snapshot. A
        page that is too large is asked again with half as many keys; small pages grow."""
        size = LIST_PAGE
        for attempt in range(LIST_RESTARTS + 1):
            kvs: list[Any] = []
            start, revision = first, 0
            while True:
                want = size if limit is None else min(size, limit - len(kvs))
                try:
                    response = await self._range(rpc.RangeRequest(key=start, range_end=end, limit=want,
                                                                  revision=revision, keys_only=keys_only))
                except CompactedError:
                    if revision == 0 or attempt == LIST_RESTARTS:
                        raise
                    break           # the snapshot was compacted under the listing: start over
                except MetadataStoreError as error:
                    if want == 1 or not _too_large(error):
                        raise
                    size = want // 2
                    continue
                revision = revision or response.header.revision
                kvs += response.kvs
                if not response.more:
                    return kvs, revision, False
                if limit is not None and len(kvs) >= limit:
                    return kvs, revision, True
                start = response.kvs[-1].key + b"\x00"
                if len(response.kvs) == want and response.ByteSize() * 4 < LIST_PAGE_BYTES:
                    size = min(size * 2, LIST_PAGE_MAX)
        raise AssertionError("unreachable")

    # --- secondary indexes --------------------------------------------------------------------

    def _index_bounds(self, name: str, bounds: tuple[bytes, bytes | None]) -> tuple[bytes, bytes]:
        base = self._i + name.encode() + b"\x00"
        low, high = bounds
        end = base + high if high is not None else prefix_end(base)
        assert end is not None
        return base + low, end

    async def _range_query(self, spec: IndexSpec, bounds: tuple[bytes, bytes | None]) -> list[Record]:
        base = self._i + spec.name.encode() + b"\x00"
        start, end = self._index_bounds(spec.name, bounds)
        kvs, revision, _ = await self._scan(start, end, keys_only=True)
        paths = [decode_index_entry(kv.key[len(base):])[1] for kv in kvs]
        records: list[Record] = []
        size = MAX_TXN_OPS
        while paths:
            chunk = paths[:size]
            try:
                reply = await self._txn([], [_op_range(self._rkey(path), revision) for path in chunk])
            except MetadataStoreError as error:
                if size == 1 or not _too_large(error):
                    raise
                size //= 2          # their values exceed gRPC's reply limit together
                continue
            del paths[:len(chunk)]
            for path, item in zip(chunk, reply.responses):
                kvs = item.response_range.kvs
                if not kvs:
                    raise MetadataStoreError(f"index {spec.name!r} names a missing record {path}")
                records.append(self._record(kvs[0]))
        return records

    # --- watches -------------------------------------------------------------------------------

    async def _check_history(self, since: int) -> None:
        # The watch starts at since + 1: that revision must not be compacted (etcd keeps the
        # compaction revision itself; `since` 0 too needs revision 1, the first one).
        try:
            await self._range(rpc.RangeRequest(key=self._r, keys_only=True, limit=1, revision=_after(since)))
        except CompactedError as exc:
            raise CompactedError(f"revision {since} is compacted: re-read and watch again ({exc})") from None
        except MetadataStoreError as exc:
            if "future revision" not in str(exc):
                raise

    async def _open(self, key: bytes, range_end: bytes | None, since: int | None,
                    convert: Callable[[Any], Any]) -> Watch:
        if since is None:
            since = await self._current_revision()
        else:
            await self._check_history(since)
        try:
            etcd_watch = await self.client.watch(key, range_end=range_end, start_revision=_after(since))
        except asyncio.CancelledError:
            if _caller_cancelled():
                raise
            raise self._call_cancelled("watch") from None
        except Exception as exc:
            raise _error(exc, "watch") from exc
        if self._closed:
            # created while the store closed: close() did not see it, nothing would end it
            try:
                await etcd_watch.cancel()
            except Exception:
                pass
            raise MetadataStoreError("watch: the metadata store is closed")
        pump: asyncio.Task

        def on_close(watch: Watch) -> None:
            self._watches.discard(watch)
            if pump is not asyncio.current_task(pump.get_loop()):     # the pump failing it ends by itself
                pump.cancel()

        watch = Watch(since, on_close)
        self._watches.add(watch)
        pump = asyncio.get_running_loop().create_task(self._pump(watch, key, range_end, since, convert, etcd_watch),
                                                      name=f"etcd-watch {key!r}")
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        return watch

    async def _pump(self, watch: Watch, key: bytes, range_end: bytes | None, since: int,
                    convert: Callable[[Any], Any], etcd_watch: Any) -> None:
        # `last`: the newest revision delivered from, `seen`: the keys of its events delivered
        # so far. etcd sends a revision's events in one response (without `fragment`), so a
        # broken stream leaves `last` whole and a reconnect resumes after it: resuming at it
        # would fail when etcd compacted up to the next one, though nothing needed is gone.
        # Only a failed conversion cuts a revision (`cut`): then the reconnect resumes at
        # `last` itself and skips what was already delivered.
        last, seen, cut = since, set(), False
        delay = RECONNECT_MIN
        try:
            while not watch.closed:
                try:
                    if etcd_watch is None:
                        resume = last if cut else _after(last)
                        etcd_watch = await self.client.watch(key, range_end=range_end, start_revision=resume)
                        log.info("etcd watch on %r resumed from revision %d", key, resume)
                    async for event in etcd_watch:
                        revision = event.kv.mod_revision
                        if revision < last or (revision == last and (revision == since or event.kv.key in seen)):
                            continue
                        try:
                            notification = await convert(event)
                        except Exception:
                            cut = revision == last      # (a newer revision: `last` is whole)
                            raise
                        cut = False
                        if revision > last:
                            last, seen = revision, set()
                        seen.add(event.kv.key)
                        watch._push(notification)
                        delay = RECONNECT_MIN
                    if watch.closed:
                        return
                    etcd_watch = None     # the stream ended: reconnect
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    error = _error(exc, "watch")
                    if isinstance(error, (CompactedError, _Unreadable)):
                        watch._fail(error)
                        return
                    log.warning("etcd watch on %r interrupted (%s); resuming after revision %d", key, error,
                                last - 1 if cut else last)
                    etcd_watch = None
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RECONNECT_MAX)
        finally:
            if etcd_watch is not None:
                try:
                    await etcd_watch.cancel()
                except Exception:
                    pass

    async def _watch(self, path: str, prefix: bool, since: int | None) -> Watch:
        key = self._rkey(path)
        range_end = prefix_end(key) if prefix else None

        async def convert(event: Any) -> Notification:
            with _reading("watch"):
                path = self._path(event.kv.key)
                if event.kind == "DELETE":
                    return Notification(NotificationType.DELETED, path, event.kv.mod_revision)
                record = self._record(event.kv)
            kind = NotificationType.CREATED if event.kv.version == 1 else NotificationType.MODIFIED
            return Notification(kind, path, event.kv.mod_revision, record)

        return await self._open(key, range_end, since, convert)

    async def _range_watch(self, spec: IndexSpec, bounds: tuple[bytes, bytes | None], since: int | None) -> Watch:
        base = self._i + spec.name.encode() + b"\x00"
        start, end = self._index_bounds(spec.name, bounds)

        async def convert(event: Any) -> Notification:
            with _reading("range watch"):
                index_key, path = decode_index_entry(event.kv.key[len(base):])
            revision = event.kv.mod_revision
            if event.kind == "DELETE":
                return Notification(NotificationType.DELETED, path, revision, None, spec.name, index_key)
            reply = await self._range(rpc.RangeRequest(key=self._rkey(path), revision=revision))
            if not reply.kvs:
                raise _Unreadable(f"range watch: index {spec.name!r} entry without its record {path}")
            with _reading("range watch"):
                record = self._record(reply.kvs[0])
            kind = NotificationType.CREATED if event.kv.version == 1 else NotificationType.MODIFIED
            return Notification(kind, path, revision, record, spec.name, index_key)

        return await self._open(start, end, since, convert)

    # --- sessions ------------------------------------------------------------------------------

    async def _create_session(self, ttl: float) -> Session:
        # etcd's TTL runs from when it grants the lease: the local deadline counts from before
        # the request (from the reply, it could end after etcd expired the lease)
        sent = asyncio.get_running_loop().time()
        response = await self._rpc(self.client.leasestub.LeaseGrant,
                                   rpc.LeaseGrantRequest(TTL=max(1, math.ceil(ttl))), "create a session")
        if response.error:
            raise MetadataStoreError(f"create a session: {response.error}")
        if self._closed:
            # granted while the store closed: close() did not see it, nobody would revoke it
            try:
                await self._rpc(self.client.leasestub.LeaseRevoke, rpc.LeaseRevokeRequest(ID=response.ID),
                                "close the session")
            except MetadataStoreError:
                pass            # etcd expires it after its TTL
            raise MetadataStoreError("create a session: the metadata store is closed")
        return Session(self, response.ID, float(response.TTL), started=sent)

    async def _refresh_session(self, session: Session) -> bool:
        try:
            reply = await self.client.refresh_lease(session.id)
        except asyncio.CancelledError:
            if _caller_cancelled():
                raise
            raise self._call_cancelled("refresh the session") from None
        except Exception as exc:
            raise _error(exc, "refresh the session") from exc
        return reply is not None and reply.TTL > 0

    async def _revoke_session(self, session: Session) -> None:
        try:
            await self._rpc(self.client.leasestub.LeaseRevoke, rpc.LeaseRevokeRequest(ID=session.id), "close the session")
        except SessionExpiredError:
            pass


def _mismatch(path: str, version: int | None, revision: int | None) -> BadVersionError:
    """A failed compare of a put or delete: what it expected."""
    expected = [f"version {version}"] if version is not None else []
    expected += [f"revision {revision}"] if revision is not None else []
    return BadVersionError(f"{path}: expected {' and '.join(expected) or 'the record'} does not match")
