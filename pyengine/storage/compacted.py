"""A topic's compacted view: the entries topic compaction kept, at their original positions.

Pulsar writes the compacted view to a BookKeeper ledger of its own and records its id in the
`__compaction` cursor's properties. Here the view lives in the `compacted` LMDB database,
keyed like the managed ledger's entries (topic id + position), so a read-compacted consumer
looks an entry up by the position it is at, and message ids stay the original ones. A new
compaction replaces the whole view in one LMDB transaction (`replace_write`), written with
the move of the `__compaction` cursor, so a restart finds either the old view and horizon or
the new ones, never a mix.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from core_ext.poskeys import pack_i64, pack_position, unpack_position
from pyengine.storage.entry import Entry, read_entry_range
from pyengine.storage.environment import StorageEnvironment, WriteFn
from pyengine_kernels import Position

DB_NAME = "compacted"


class CompactedView:
    """The compacted entries of one topic (`topic_id`)."""

    def __init__(self, env: StorageEnvironment, topic_id: int) -> None:
        self.env = env
        self.topic_id = topic_id
        self._prefix = pack_i64(topic_id)
        self._db = env.db(DB_NAME)

    def _key(self, position: Position) -> bytes:
        return self._prefix + pack_position(position.ledger_id, position.entry_id)

    def read_entries(self, start: Position, max_entries: int, last: Position | None = None) -> list[Entry]:
        """Up to `max_entries` entries at or after `start`, up to `last` (inclusive) if given."""
        if max_entries <= 0:
            return []
        end_key = self._key(last) if last is not None else None
        with self.env.read() as txn:
            return read_entry_range(txn, self._db, self._prefix, self._key(start), end_key, max_entries)

    def iter_entries(self, chunk: int = 500) -> Iterator[Entry]:
        start = Position(-1, -1)
        while True:
            entries = self.read_entries(start, chunk)
            yield from entries
            if len(entries) < chunk:
                return
            start = entries[-1].position.next()

    def read_entry(self, position: Position) -> Entry | None:
        with self.env.read() as txn:
            value = txn.get(self._key(position), db=self._db)
        return Entry.decode(position, value) if value is not None else None

    def last_entry(self) -> Entry | None:
        prefix = self._prefix
        with self.env.read() as txn:
            cursor = txn.cursor(db=self._db)
            following = pack_i64(self.topic_id + 1)
            if cursor.set_range(following):
                found = cursor.prev()
            else:
                found = cursor.last()
            if not found or not cursor.key().startswith(prefix):
                return None
            ledger_id, entry_id = unpack_position(cursor.key()[8:])
            return Entry.decode(Position(ledger_id, entry_id), cursor.value())

    def replace_write(self, entries: Iterable[Entry]) -> WriteFn:
        """A write (for `StorageEnvironment.submit`) that replaces the whole view by `entries`."""
        rows = [(self._key(entry.position), entry.encode()) for entry in entries]
        db, prefix = self._db, self._prefix

        def write(txn) -> None:
            _delete_prefix(txn, db, prefix)
            for key, value in rows:
                txn.put(key, value, db=db)
        return write

    def delete_write(self) -> WriteFn:
        db, prefix = self._db, self._prefix
        return lambda txn: _delete_prefix(txn, db, prefix)


def _delete_prefix(txn, db, prefix: bytes) -> None:
    cursor = txn.cursor(db=db)
    if cursor.set_range(prefix):
        while cursor.key() and cursor.key().startswith(prefix):
            if not cursor.delete():
                break


__all__ = ["CompactedView", "DB_NAME"]
