"""The embedded metadata store: records in the data dir's LMDB environment (`metadata` DB).

Every key of this store starts with `ms:` in the `metadata` database, apart from the broker's
admin records (`/admin/...`). Writes go through the environment's group commit: a write
function runs inside the batch's LMDB write transaction on the writer thread (so its checks
and changes are atomic with respect to every other write), and the operation resolves once
the batch is durable. Notifications are dispatched on the event loop right after, in commit
order. Reads use LMDB read transactions on the event loop: they see every write that has
resolved.

Each write function runs in an LMDB transaction nested in the batch's (`_atomically`): a
write that fails or raises half-way is rolled back alone — it changes nothing, as on the other
backends — and the other writes of the batch are committed as usual.

Keys of any length: LMDB refuses keys over 511 bytes, while paths have no length limit and
index entries hold keys of up to 4096 bytes (plus the path), and long topic and subscription
names (percent-encoded in paths) reach that in normal use. A store key of up to `MAX_KEY_BYTES`
(508: 511 less the `ms:` prefix) is the LMDB key as it is. A longer one is stored in a *slot*:
LMDB key `ms:` + its first `HEAD_BYTES` (476) bytes + the SHA-256 of the whole key, value = the
length of the rest of the key (u32) + the rest + the value. The slots of the keys sharing a
head are contiguous in LMDB, together with the keys of up to 508 bytes having that head: a scan
reads such a group whole and returns it in key order (memory per scan: the largest group it
crosses). A slot is told from a 508-byte key stored as it is by its content (the stored rest of
the key hashes to the slot's digest); writing a key over a slot of another key is refused.
Data dirs written before slots existed hold no key over 508 bytes, so they read as before;
pyengine versions without slots cannot read a data dir holding slots.

Sessions live in this process only: at start-up the sessions of an earlier process (and their
ephemeral records) are deleted, as a crashed broker's ZooKeeper or etcd session would expire.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import lmdb

from pyengine.metadata import MetadataStoreError
from pyengine.metadata.local import KV, LocalMetadataStore, Outcome, current_revision, txn_end_all_sessions
from pyengine.metadata.keys import prefix_end
from pyengine.storage import StorageEnvironment, StorageError

KEY_PREFIX = b"ms:"
_PREFIX_END = prefix_end(KEY_PREFIX)
LMDB_MAX_KEY_BYTES = 511                                # LMDB's default MDB_MAXKEYSIZE (py-lmdb's build)
MAX_KEY_BYTES = LMDB_MAX_KEY_BYTES - len(KEY_PREFIX)    # longest store key kept as the LMDB key
_DIGEST_BYTES = 32                                      # SHA-256
HEAD_BYTES = MAX_KEY_BYTES - _DIGEST_BYTES              # bytes of a longer key kept in its slot's key
_U32 = struct.Struct(">I")


def _slot_key(key: bytes) -> bytes:
    """The LMDB key of the slot of a store key longer than MAX_KEY_BYTES."""
    return KEY_PREFIX + key[:HEAD_BYTES] + hashlib.sha256(key).digest()


def _slot_entry(stored: bytes, raw: bytes) -> tuple[bytes, bytes] | None:
    """(store key, value) held by the slot whose LMDB key (less `ms:`) is `stored`; None when
    the entry is not a slot (a key of exactly MAX_KEY_BYTES bytes stored as it is)."""
    if len(stored) != MAX_KEY_BYTES or len(raw) < _U32.size:
        return None
    (n,) = _U32.unpack_from(raw)
    end = _U32.size + n
    if len(raw) < end:
        return None
    key = stored[:HEAD_BYTES] + raw[_U32.size:end]
    if len(key) <= MAX_KEY_BYTES or hashlib.sha256(key).digest() != stored[HEAD_BYTES:]:
        return None
    return key, raw[end:]


def _in_order(group: list[tuple[bytes, bytes]], start: bytes,
              end: bytes | None) -> tuple[list[tuple[bytes, bytes]], bool]:
    """The entries of a group (keys sharing their first HEAD_BYTES bytes) in [start, end), in
    key order, and whether the group reaches `end` (every later key is past it then)."""
    group.sort()
    beyond = end is not None and group[-1][0] >= end
    return [entry for entry in group if entry[0] >= start and (end is None or entry[0] < end)], beyond


class LmdbKV:
    """The store's key space inside an LMDB transaction of the `metadata` database."""

    __slots__ = ("_txn", "_db")

    def __init__(self, txn: lmdb.Transaction, db: Any) -> None:
        self._txn = txn
        self._db = db

    def get(self, key: bytes) -> bytes | None:
        if len(key) < MAX_KEY_BYTES:
            return self._txn.get(KEY_PREFIX + key, db=self._db)
        if len(key) == MAX_KEY_BYTES:
            raw = self._txn.get(KEY_PREFIX + key, db=self._db)
            return raw if raw is None or _slot_entry(key, raw) is None else None
        slot = _slot_key(key)
        raw = self._txn.get(slot, db=self._db)
        held = _slot_entry(slot[len(KEY_PREFIX):], raw) if raw is not None else None
        return held[1] if held is not None and held[0] == key else None

    def put(self, key: bytes, value: bytes) -> None:
        if len(key) < MAX_KEY_BYTES:
            self._txn.put(KEY_PREFIX + key, value, db=self._db)
            return
        if len(key) == MAX_KEY_BYTES:
            lmdb_key, stored = KEY_PREFIX + key, value
        else:
            lmdb_key = _slot_key(key)
            rest = key[HEAD_BYTES:]
            stored = _U32.pack(len(rest)) + rest + value
        raw = self._txn.get(lmdb_key, db=self._db)
        if raw is not None:
            held = _slot_entry(lmdb_key[len(KEY_PREFIX):], raw)
            if (held[0] if held is not None else lmdb_key[len(KEY_PREFIX):]) != key:
                raise MetadataStoreError(f"metadata key {key[:64]!r}... ({len(key)} bytes) collides with "
                                         f"the LMDB slot of another key")
        self._txn.put(lmdb_key, stored, db=self._db)

    def delete(self, key: bytes) -> None:
        if len(key) < MAX_KEY_BYTES:
            self._txn.delete(KEY_PREFIX + key, db=self._db)
        elif self.get(key) is not None:         # (not the slot of another key)
            self._txn.delete(KEY_PREFIX + key if len(key) == MAX_KEY_BYTES else _slot_key(key), db=self._db)

    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Entries with start <= key < end (None: no bound), in key order. LMDB orders every
        key of up to HEAD_BYTES bytes as the store does; longer keys are grouped by their head
        (see the module's docstring), and a group is sorted before it is returned."""
        cursor = self._txn.cursor(db=self._db)
        if not cursor.set_range(KEY_PREFIX + start[:HEAD_BYTES]):
            return
        n = len(KEY_PREFIX)
        check_start = len(start) > HEAD_BYTES       # else set_range went exactly to it
        head: bytes | None = None                   # the head of `group`
        group: list[tuple[bytes, bytes]] = []
        for lmdb_key, raw in cursor.iternext():
            if lmdb_key >= _PREFIX_END:
                break
            key = lmdb_key[n:]
            key_head = key[:HEAD_BYTES] if len(key) > HEAD_BYTES else None
            if group and key_head != head:
                entries, beyond = _in_order(group, start, end)
                yield from entries
                if beyond:
                    return
                group = []
            if key_head is None:
                if end is not None and key >= end:
                    return
                if not check_start or key >= start:
                    yield key, raw
                continue
            if not group:
                if end is not None and key_head >= end:     # so is every key of its group
                    return
                head = key_head
            group.append(_slot_entry(key, raw) or (key, raw))
        if group:
            yield from _in_order(group, start, end)[0]


def _atomically(fn: Callable[[KV], Outcome], env: lmdb.Environment, txn: lmdb.Transaction, db: Any) -> Outcome:
    """Run the write function `fn` in a transaction nested in the batch's `txn`: merged into it
    when `fn` succeeds, aborted (none of its changes) when it fails or raises. Never raises into
    the group commit: that would fail every write of the batch."""
    try:
        child = env.begin(write=True, parent=txn)
    except lmdb.Error as exc:
        return Outcome(error=MetadataStoreError(f"metadata write failed: {exc!r}"))
    try:
        outcome = fn(LmdbKV(child, db))
    except Exception as exc:
        child.abort()
        return Outcome(error=MetadataStoreError(f"metadata write failed: {exc!r}"))
    except BaseException:
        child.abort()
        raise
    if outcome.error is not None:       # refused: it changed nothing, but be sure
        child.abort()
        return outcome
    try:
        child.commit()
    except lmdb.Error as exc:           # (LMDB aborts a child whose commit fails)
        return Outcome(error=MetadataStoreError(f"metadata write failed: {exc!r}"))
    return outcome


class LmdbMetadataStore(LocalMetadataStore):
    def __init__(self, env: StorageEnvironment) -> None:
        super().__init__()
        self.env = env
        self._db = env.db("metadata")
        # nested write transactions (`_atomically`) need the py-lmdb environment, without
        # MDB_WRITEMAP (StorageEnvironment never sets it)
        self._lmdb: lmdb.Environment = env._env
        try:
            unfit = self._lmdb.flags().get("writemap") or self._lmdb.max_key_size() < LMDB_MAX_KEY_BYTES
        except lmdb.Error:          # a closed environment: every write fails anyway
            unfit = False
        if unfit:
            raise MetadataStoreError("the metadata store needs an LMDB environment without writemap and "
                                     f"with keys of up to {LMDB_MAX_KEY_BYTES} bytes")

    @contextmanager
    def _reader(self) -> Iterator[KV]:
        try:
            txn = self.env.read()
        except StorageError as exc:
            raise MetadataStoreError(f"metadata store unavailable: {exc}") from exc
        with txn:
            yield LmdbKV(txn, self._db)

    async def _apply(self, fn: Callable[[KV], Outcome]) -> Outcome:
        db = self._db
        lmdb_env = self._lmdb
        try:
            future = self.env.submit(lambda txn: _atomically(fn, lmdb_env, txn, db))
        except StorageError as exc:
            raise MetadataStoreError(f"metadata write failed: {exc}") from exc
        future.add_done_callback(self._committed)
        try:
            # shielded: a cancelled caller must not lose the notifications of a write that
            # is committed anyway
            return await asyncio.shield(future)
        except StorageError as exc:
            raise MetadataStoreError(f"metadata write failed: {exc}") from exc

    def _committed(self, future: asyncio.Future) -> None:
        if not future.cancelled() and future.exception() is None:
            self._dispatch(future.result())

    async def _new_session_id(self) -> int:
        return self.env.next_id("metadata-session")

    async def _start(self) -> None:
        await self._apply(txn_end_all_sessions)
        with self._reader() as kv:
            self._set_floor(current_revision(kv))
