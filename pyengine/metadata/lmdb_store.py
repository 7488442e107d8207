"""The embedded metadata store: records in the data dir's LMDB environment (`metadata` DB).

Every key of this store starts with `ms:` in the `metadata` database, apart from the broker's
admin records (`/admin/...`). Writes go through the environment's group commit: a write
function runs inside the batch's LMDB write transaction on the writer thread (so its checks
and changes are atomic with respect to every other write), and the operation resolves once
the batch is durable. Notifications are dispatched on the event loop right after, in commit
order. Reads use LMDB read transactions on the event loop: they see every write that has
resolved.

Sessions live in this process only: at start-up the sessions of an earlier process (and their
ephemeral records) are deleted, as a crashed broker's ZooKeeper or etcd session would expire.
"""

from __future__ import annotations

import asyncio
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


class LmdbKV:
    """The store's key space inside an LMDB transaction of the `metadata` database."""

    __slots__ = ("_txn", "_db")

    def __init__(self, txn: lmdb.Transaction, db: Any) -> None:
        self._txn = txn
        self._db = db

    def get(self, key: bytes) -> bytes | None:
        return self._txn.get(KEY_PREFIX + key, db=self._db)

    def put(self, key: bytes, value: bytes) -> None:
        self._txn.put(KEY_PREFIX + key, value, db=self._db)

    def delete(self, key: bytes) -> None:
        self._txn.delete(KEY_PREFIX + key, db=self._db)

    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        limit = KEY_PREFIX + end if end is not None else _PREFIX_END
        cursor = self._txn.cursor(db=self._db)
        if not cursor.set_range(KEY_PREFIX + start):
            return
        n = len(KEY_PREFIX)
        for key, value in cursor.iternext():
            if key >= limit:
                return
            yield key[n:], value


def _guarded(fn: Callable[[KV], Outcome], kv: KV) -> Outcome:
    # Never raise into the group commit: that would fail every write of the batch.
    try:
        return fn(kv)
    except Exception as exc:
        return Outcome(error=MetadataStoreError(f"metadata write failed: {exc!r}"))


class LmdbMetadataStore(LocalMetadataStore):
    def __init__(self, env: StorageEnvironment) -> None:
        super().__init__()
        self.env = env
        self._db = env.db("metadata")

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
        try:
            future = self.env.submit(lambda txn: _guarded(fn, LmdbKV(txn, db)))
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
