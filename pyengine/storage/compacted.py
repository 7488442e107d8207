"""A topic's compacted view: the entries topic compaction kept, at their original positions.

Pulsar writes the compacted view to a BookKeeper ledger of its own and records its id in the
`__compaction` cursor's properties. Here the view lives in the `compacted` LMDB database,
keyed like the managed ledger's entries (a prefix + position), so a read-compacted consumer
looks an entry up by the position it is at, and message ids stay the original ones.

Each compaction writes a new generation of the view (as Pulsar a new ledger), keyed
GENERATION_MARK + topic id + generation + position, staged in bounded writes (`stage_write`)
that readers never see: they read the current generation only. The generation becomes current
with the move of the `__compaction` cursor whose property records it, in one LMDB
transaction; the generations that are not current (the previous one, or one staged by a
compaction that failed or was killed) are removed afterwards in bounded writes
(`delete_others_write`). So a restart finds either the old view and horizon or the new ones,
never a mix, and a crash while a generation is staged leaves the previous one readable.

Views written before generations were keyed (topic id + position, "legacy") stay readable;
the first generation to become current removes them in its switch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from core_ext.poskeys import pack_i64, pack_position, unpack_position
from pyengine.storage.entry import Entry, publish_time_of, read_entry_range
from pyengine.storage.environment import StorageEnvironment, WriteFn, delete_prefix
from pyengine_kernels import Position

DB_NAME = "compacted"
# Before the rows of generations: a byte no legacy key starts with (pack_i64 of a topic id,
# which is >= 0, starts with 0x80 or more).
GENERATION_MARK = b"G"
LEGACY = -1                       # the generation of a view keyed the legacy way
DEFAULT_DELETE_CHUNK = 1000


class CompactedView:
    """The compacted entries of one topic (`topic_id`): its current generation."""

    def __init__(self, env: StorageEnvironment, topic_id: int) -> None:
        self.env = env
        self.topic_id = topic_id
        self._db = env.db(DB_NAME)
        self._legacy_prefix = pack_i64(topic_id)
        self._generations_prefix = GENERATION_MARK + pack_i64(topic_id)
        self.generation = 0
        self._prefix = self.prefix_of(0)

    def prefix_of(self, generation: int) -> bytes:
        if generation == LEGACY:
            return self._legacy_prefix
        if generation < 0:
            raise ValueError(f"a view generation is >= 0, not {generation}")
        return self._generations_prefix + pack_i64(generation)

    def use(self, generation: int) -> None:
        """Read `generation` from now on (its switch is durable)."""
        self._prefix = self.prefix_of(generation)
        self.generation = generation

    def take_up(self, generation: int) -> None:
        """After a restart: the view recorded as `generation`, or the legacy view when that
        generation has no rows and legacy rows exist (a legacy view is removed by the switch
        to the first generation, so its rows mean no generation ever became current)."""
        if not self._has_rows(self.prefix_of(generation)) and self._has_rows(self._legacy_prefix):
            self.use(LEGACY)
        else:
            self.use(generation)

    def _has_rows(self, prefix: bytes) -> bool:
        with self.env.read() as txn:
            cursor = txn.cursor(db=self._db)
            return cursor.set_range(prefix) and cursor.key().startswith(prefix)

    def has_other_generations(self, keep: int) -> bool:
        """Whether rows of a generation other than `keep` exist (a read: what
        `delete_others_write` would remove, found without a write)."""
        prefix, kept = self._generations_prefix, self.prefix_of(keep)
        with self.env.read() as txn:
            cursor = txn.cursor(db=self._db)
            if not cursor.set_range(prefix) or not cursor.key().startswith(prefix):
                return False
            if not cursor.key().startswith(kept):
                return True
            return cursor.set_range(_successor(kept)) and cursor.key().startswith(prefix)

    def _key(self, position: Position) -> bytes:
        return self._prefix + pack_position(position.ledger_id, position.entry_id)

    # --- reading --------------------------------------------------------------------------

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
            if cursor.set_range(_successor(prefix)):
                found = cursor.prev()
            else:
                found = cursor.last()
            if not found or not cursor.key().startswith(prefix):
                return None
            ledger_id, entry_id = unpack_position(cursor.key()[len(prefix):])
            return Entry.decode(Position(ledger_id, entry_id), cursor.value())

    def read_entries_backward(self, before: Position | None, max_entries: int) -> list[Entry]:
        """Up to `max_entries` entries before `before` (None: from the view's end), newest first."""
        if max_entries <= 0:
            return []
        prefix, out = self._prefix, []
        with self.env.read() as txn:
            cursor = txn.cursor(db=self._db)
            start = self._key(before) if before is not None else _successor(prefix)
            found = cursor.prev() if cursor.set_range(start) else cursor.last()
            while found and len(out) < max_entries and cursor.key().startswith(prefix):
                ledger_id, entry_id = unpack_position(cursor.key()[len(prefix):])
                out.append(Entry.decode(Position(ledger_id, entry_id), cursor.value()))
                found = cursor.prev()
        return out

    def find_by_publish_time(self, timestamp_ms: int, before: Position) -> Position | None:
        """The first entry before `before` published at or after `timestamp_ms` (None: there
        is none). A binary search over the keys, as the managed ledger's: publish times are
        taken as non-decreasing along the view, and it looks up at most about 128 keys (the
        bits of a position), where a scan read every entry of the view on the event loop."""
        prefix, db = self._prefix, self._db
        skip = len(prefix)
        bound = int.from_bytes(pack_position(before.ledger_id, before.entry_id), "big")
        with self.env.read() as txn:
            cursor = txn.cursor(db=db)

            def first_at(point: int) -> tuple[int, bytes] | None:
                """The first entry at or after the key `point` and before `bound`: (its key, its row)."""
                if not cursor.set_range(prefix + point.to_bytes(16, "big")) or not cursor.key().startswith(prefix):
                    return None
                key = int.from_bytes(cursor.key()[skip:], "big")
                return (key, cursor.value()) if key < bound else None

            # The smallest key whose first entry is published at or after, or is none.
            low, high = 0, bound
            while low < high:
                middle = (low + high) // 2
                found = first_at(middle)
                if found is None or publish_time_of(found[1]) >= timestamp_ms:
                    high = middle
                else:
                    low = found[0] + 1          # the keys up to the entry found have that entry first
            found = first_at(low)
        if found is None:
            return None
        return Position(*unpack_position(found[0].to_bytes(16, "big")))

    # --- writing --------------------------------------------------------------------------

    def stage_write(self, generation: int, entries: Iterable[Entry]) -> WriteFn:
        """A write (for `StorageEnvironment.submit`) of `entries` into `generation`, which
        readers do not see until it is `use`d."""
        if generation == self.generation:
            raise ValueError(f"generation {generation} is the current view: it is not staged")
        prefix = self.prefix_of(generation)
        rows = [(prefix + pack_position(e.position.ledger_id, e.position.entry_id), e.encode()) for e in entries]
        db = self._db

        def write(txn) -> None:
            for key, value in rows:
                txn.put(key, value, db=db)
        return write

    def switch_write(self) -> WriteFn:
        """The view's part of the switch to a new generation (submitted with the cursor move
        that records it): a legacy view is removed there, as its rows would be taken for the
        current view after a restart."""
        db, prefix = self._db, self._legacy_prefix
        return lambda txn: delete_prefix(txn, db, prefix)

    def delete_others_write(self, keep: int, limit: int = DEFAULT_DELETE_CHUNK) -> WriteFn:
        """A write removing up to `limit` rows of the generations other than `keep`; it returns
        how many it removed (fewer than `limit`: none is left)."""
        db, prefix = self._db, self._generations_prefix
        kept = self.prefix_of(keep)

        def write(txn) -> int:
            removed = 0
            cursor = txn.cursor(db=db)
            found = cursor.set_range(prefix)
            while found and removed < limit:
                key = cursor.key()
                if not key.startswith(prefix):
                    break
                if key.startswith(kept):
                    found = cursor.set_range(_successor(kept))
                    continue
                found = cursor.delete()
                removed += 1
            return removed
        return write

    def delete_write(self) -> WriteFn:
        """Remove the whole view, every generation (and a legacy view)."""
        db, prefixes = self._db, (self._legacy_prefix, self._generations_prefix)

        def write(txn) -> None:
            for prefix in prefixes:
                delete_prefix(txn, db, prefix)
        return write


def _successor(prefix: bytes) -> bytes:
    """The smallest key after every key starting with `prefix`."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        raise ValueError("a prefix of 0xff bytes only has no successor")
    return stripped[:-1] + bytes([stripped[-1] + 1])


__all__ = ["CompactedView", "DB_NAME", "LEGACY"]
