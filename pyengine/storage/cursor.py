"""Managed cursor: a subscription's acknowledgement state over a managed ledger.

As in Pulsar, the state is a mark-delete position (everything at or before it is acknowledged),
the entries acknowledged individually beyond it, and, for batch entries acknowledged in part,
the batch's ack set (a set bit is an index still unacknowledged). Individually acknowledged
entries are kept per ledger as roaring bitmaps of entry ids, which stay small however the acks
are spread. Durable cursors persist their state with the next group commit after each change;
a non-durable cursor (a reader's) keeps it in memory only. The same goes for the cursor's string
properties, its subscription's properties (Pulsar's cursorProperties, PIP-105): given when the
cursor is created, replaced as a whole afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from pyroaring import BitMap

from pyengine.storage.environment import WriteFn, all_of
from pyengine.storage.errors import CorruptRecordError
from pyengine.storage.records_pb2 import BatchAcks, CursorRecord, LedgerAcks, PositionRecord
from pyengine_kernels import Position, ackset_and, ackset_is_fully_acked, ackset_new

if TYPE_CHECKING:
    from pyengine.storage.managed_ledger import ManagedLedger

_MAX_ENTRY_ID = (1 << 32) - 1      # the largest entry id a roaring BitMap (uint32) holds


class ManagedCursor:
    def __init__(self, ledger: ManagedLedger, name: str, mark_delete: Position, *, durable: bool,
                 acked: dict[int, BitMap] | None = None,
                 batch_acks: dict[Position, list[int]] | None = None,
                 properties: dict[str, int] | None = None,
                 cursor_properties: dict[str, str] | None = None) -> None:
        self.ledger = ledger
        self.name = name
        self.durable = durable
        self.mark_delete = mark_delete
        self._acked: dict[int, BitMap] = acked or {}
        self._batch_acks: dict[Position, list[int]] = batch_acks or {}
        self.properties: dict[str, int] = properties or {}
        self.cursor_properties: dict[str, str] = dict(cursor_properties or {})
        self.read_position = ledger.next_position(mark_delete)
        self._key = ledger._prefix + name.encode()
        # A save failed and none succeeded since: memory holds acks that are not durable, so an
        # ack repeating one of them changes nothing here but must still be written.
        self._unsaved = False
        # The latest save, until it settles: it carries every change made so far (each change
        # submits a save, sealed at or after it), so an ack repeating one is answered by it.
        self._saving: asyncio.Future[None] | None = None
        self._deleted = False
        self._advance_mark_delete()
        # The mark-delete position of the state last saved (as recovered when opened): what
        # trims go by, never by one in memory whose save may fail (see trim_bound).
        self.durable_mark_delete = self.mark_delete

    # --- opening --------------------------------------------------------------------------

    @classmethod
    async def open(cls, ledger: ManagedLedger, name: str, initial_position: str,
                   cursor_properties: dict[str, str] | None = None) -> ManagedCursor:
        """The stored cursor `name`, or a new one at `initial_position` with
        `cursor_properties` (ignored for a stored one, as Pulsar's asyncOpenCursor)."""
        if initial_position not in ("earliest", "latest"):
            raise ValueError(f"initial_position must be 'earliest' or 'latest', not {initial_position!r}")
        key = ledger._prefix + name.encode()
        ledger.env.check_key(key, f"the cursor name {name[:64]!r}")
        with ledger.env.read() as txn:
            raw = txn.get(key, db=ledger.env.db("cursors"))
        if raw is not None:
            return cls._from_record(ledger, raw)
        start = ledger.previous_position(ledger.first_position()) if initial_position == "earliest" else ledger.lac
        cursor = cls(ledger, name, start, durable=True, cursor_properties=cursor_properties)
        await cursor.persist()
        return cursor

    @classmethod
    def non_durable(cls, ledger: ManagedLedger, mark_delete: Position) -> ManagedCursor:
        return cls(ledger, f"reader-{id(object())}", mark_delete, durable=False)

    @classmethod
    def _from_record(cls, ledger: ManagedLedger, raw: bytes) -> ManagedCursor:
        try:
            rec = CursorRecord.FromString(raw)
            acked = {la.ledger_id: BitMap.deserialize(la.entry_ids) for la in rec.individually_deleted}
        except Exception as exc:
            raise CorruptRecordError(f"cursor record on {ledger.name}: {exc}") from exc
        batch = {Position(b.position.ledger_id, b.position.entry_id): list(b.ack_set) for b in rec.batch_acks}
        md = Position(rec.mark_delete.ledger_id, rec.mark_delete.entry_id)
        return cls(ledger, rec.name, md, durable=True, acked=acked, batch_acks=batch,
                   properties=dict(rec.properties), cursor_properties=dict(rec.cursor_properties))

    # --- acknowledgement ------------------------------------------------------------------

    def ack(self, positions: Iterable[Position]) -> asyncio.Future[None]:
        """Acknowledge whole entries individually. Each acknowledging method returns a future
        that resolves when the new state is durable (at once when the ack changes nothing and
        the state it repeats is durable already: see _unchanged)."""
        changed = False
        md = self.mark_delete
        positions = [position for position in positions if position > md]
        for position in positions:
            # Checked before any is taken: the bitmaps hold uint32 entry ids, and one out of
            # range (a client's malformed message id) failed half-way with an OverflowError,
            # the acks before it taken in memory, neither saved nor moving the mark-delete.
            self._check_entry(position)
        for position in positions:
            bitmap = self._acked.get(position.ledger_id)
            if bitmap is None:
                bitmap = self._acked[position.ledger_id] = BitMap()
            if position.entry_id not in bitmap:
                bitmap.add(position.entry_id)
                changed = True
            self._batch_acks.pop(position, None)
        if not changed:
            return self._unchanged()
        self._advance_mark_delete()
        return self.persist()

    def ack_batch_indexes(self, position: Position, ack_set: list[int], batch_size: int) -> asyncio.Future[None]:
        """Acknowledge some indexes of a batch entry: `ack_set` has a set bit for every index
        that stays unacknowledged. When no index is left, the whole entry is acknowledged."""
        if self.is_acked(position):
            return self._unchanged()
        self._check_entry(position)
        current = self._batch_acks.get(position) or ackset_new(batch_size)
        merged = ackset_and(current, ack_set)
        if ackset_is_fully_acked(merged, batch_size):
            return self.ack([position])
        if merged == current and position in self._batch_acks:
            return self._unchanged()
        self._batch_acks[position] = merged
        return self.persist()

    def ack_cumulative(self, position: Position) -> asyncio.Future[None]:
        """Acknowledge everything up to and including `position`."""
        if position <= self.mark_delete:
            return self._unchanged()
        self._check_written(position)
        self.mark_delete = position
        self._drop_acks_up_to(position)
        self._advance_mark_delete()
        if self.read_position <= self.mark_delete:
            self.read_position = self.ledger.next_position(self.mark_delete)
        return self.persist()

    def _check_entry(self, position: Position) -> None:
        if not 0 <= position.entry_id <= _MAX_ENTRY_ID:
            raise ValueError(f"cannot acknowledge {position}: not the position of an entry")
        self._check_written(position)

    def _check_written(self, position: Position) -> None:
        """Refuse an ack after the LAC, as Pulsar's ManagedCursor does: it names no entry yet,
        and the one written there later would count as acknowledged, never delivered."""
        lac = self.ledger.lac
        if position > lac:
            raise ValueError(f"cannot acknowledge {position}: after the last entry ({lac}) of {self.ledger.name}")

    def _unchanged(self) -> asyncio.Future[None]:
        """The answer to an ack that changes nothing in memory: done at once when the state it
        repeats is durable; else the outcome of the save in flight that carries it (a client's
        retry, a duplicate ack, must not be answered before the ack it repeats is durable, nor
        succeed when that save fails), or a new save when the last one failed."""
        if self._unsaved:
            return self.persist()
        saving = self._saving
        if saving is None:
            return _done()
        # Shielded: a caller giving up on its answer must not cancel the save others wait for.
        return asyncio.shield(saving)

    def is_acked(self, position: Position) -> bool:
        if position <= self.mark_delete:
            return True
        bitmap = self._acked.get(position.ledger_id)
        return bitmap is not None and position.entry_id in bitmap

    def acked_between(self, after: Position, upto: Position) -> int:
        """How many entries in (after, upto] are acknowledged individually (beyond the
        mark-delete position)."""
        count = 0
        for ledger_id, bitmap in self._acked.items():
            if after.ledger_id <= ledger_id <= upto.ledger_id:
                first = after.entry_id + 1 if ledger_id == after.ledger_id else 0
                end = upto.entry_id + 1 if ledger_id == upto.ledger_id else _MAX_ENTRY_ID + 1
                if first < end:
                    count += bitmap.range_cardinality(max(first, 0), end)
        return count

    def individually_deleted_ranges(self) -> list[tuple[Position, Position]]:
        """The entries acknowledged after the mark-delete position, as Pulsar's
        individuallyDeletedMessages: open-closed ranges (before the first, the last], in order."""
        ranges = []
        for ledger_id in sorted(self._acked):
            first = last = None
            for entry_id in self._acked[ledger_id]:          # in ascending order
                if last is not None and entry_id == last + 1:
                    last = entry_id
                    continue
                if first is not None:
                    ranges.append((Position(ledger_id, first - 1), Position(ledger_id, last)))
                first = last = entry_id
            if first is not None:
                ranges.append((Position(ledger_id, first - 1), Position(ledger_id, last)))
        return ranges

    def batch_ack_set(self, position: Position) -> list[int] | None:
        """The ack set of a partly acknowledged batch entry (set bit = still unacknowledged)."""
        return self._batch_acks.get(position)

    def _advance_mark_delete(self) -> None:
        md = self.mark_delete
        while True:
            nxt = self.ledger.next_position(md)
            if nxt > self.ledger.lac:
                break
            bitmap = self._acked.get(nxt.ledger_id)
            if bitmap is None or nxt.entry_id not in bitmap:
                break
            bitmap.discard(nxt.entry_id)
            md = nxt
        if md != self.mark_delete:
            self.mark_delete = md
            self._drop_acks_up_to(md)
            if self.read_position <= md:       # (acked before read: as Pulsar, read on after them)
                self.read_position = self.ledger.next_position(md)

    def _drop_acks_up_to(self, position: Position) -> None:
        for ledger_id in [lid for lid in self._acked if lid <= position.ledger_id]:
            bitmap = self._acked[ledger_id]
            if ledger_id < position.ledger_id:
                del self._acked[ledger_id]
            else:
                bitmap.remove_range(0, position.entry_id + 1)
                if not bitmap:
                    del self._acked[ledger_id]
        for pos in [p for p in self._batch_acks if p <= position]:
            del self._batch_acks[pos]

    # --- positioning ----------------------------------------------------------------------

    def seek(self, position: Position, ack_set: list[int] | None = None) -> asyncio.Future[None]:
        """Reset the cursor so that `position` is the next entry read; everything before it
        counts as acknowledged and everything from it on as not (Pulsar's resetCursor). A
        reset forward past whole ledgers lets them be trimmed once saved, as any other move of
        the mark-delete position does (Pulsar resets through its mark-delete path). `ack_set`
        (set bit = unacknowledged): the batch at `position` has its other indexes acknowledged
        (a seek to a message inside a batch, as Pulsar's cursor takes the reset position's).
        A position after the next one to be written is taken as that one: left there, the
        entries written before it would count as acknowledged, never delivered."""
        following = self.ledger.lac.next()
        if position > following:
            position, ack_set = following, None
        # Checked before the cursor moves: a malformed set raised after it had moved in memory
        # and dropped its acks, none of it saved.
        held = None
        if ack_set and position.entry_id >= 0 and not ackset_is_fully_acked(ack_set):
            held = list(ack_set)
        self.mark_delete = self.ledger.previous_position(position) if position.entry_id >= 0 else position
        self._acked.clear()
        self._batch_acks.clear()
        if held is not None:
            self._batch_acks[position] = held
        self.read_position = self.ledger.next_position(self.mark_delete)
        return self.persist()

    def rewind(self) -> None:
        """Read again from the first unacknowledged entry."""
        self.read_position = self.ledger.next_position(self.mark_delete)

    def backlog(self) -> int:
        """Entries after the mark-delete position, up to the LAC, not yet acknowledged."""
        lac, ledgers = self.ledger.lac, self.ledger.ledgers
        pending = self.ledger.entries_between(self.mark_delete, lac)
        acked = 0
        for ledger_id, bitmap in self._acked.items():
            # Only acks of entries that are there, as `pending` counts them: an ack of a position
            # past a ledger's last entry, or in a ledger the topic does not have (any more), is
            # taken as it is (a client's stale or malformed message id), but counted it made
            # the backlog fall short, down to negative numbers.
            info = ledgers.get(ledger_id)
            if info is None or ledger_id > lac.ledger_id:
                continue
            last = lac.entry_id if ledger_id == lac.ledger_id else info.last_entry_id
            if last >= 0:
                acked += bitmap.range_cardinality(0, last + 1)
        return pending - acked

    # --- persistence ----------------------------------------------------------------------

    def record(self) -> CursorRecord:
        md = self.mark_delete
        return CursorRecord(
            name=self.name,
            mark_delete=PositionRecord(ledger_id=md.ledger_id, entry_id=md.entry_id),
            individually_deleted=[LedgerAcks(ledger_id=lid, entry_ids=bm.serialize())
                                  for lid, bm in sorted(self._acked.items()) if bm],
            batch_acks=[BatchAcks(position=PositionRecord(ledger_id=p.ledger_id, entry_id=p.entry_id),
                                  ack_set=words) for p, words in sorted(self._batch_acks.items())],
            properties=self.properties,
            cursor_properties=self.cursor_properties,
        )

    def set_cursor_properties(self, cursor_properties: dict[str, str]) -> asyncio.Future[None]:
        """Replace the cursor's string properties; the future resolves when they are durable.
        Taken in memory at once, as every change of the cursor: a failed save leaves them to
        the next one, as it does acks."""
        self.cursor_properties = dict(cursor_properties)
        return self.persist()

    def persist(self) -> asyncio.Future[None]:
        """Write the cursor's state with the next group commit (coalesced with other changes in
        the same batch); the future resolves when it is durable."""
        env = self.ledger.env
        if not self.durable or self._deleted:
            # Deleted (or being deleted): a save would write its record again, or, queued in
            # the deletion's group commit under the same key, take the deletion's place.
            return _done()
        db, key = env.db("cursors"), self._key
        # Serialise at seal time, so one batch writes the cursor's latest state once. Submissions
        # coalesce: only the last one's seal runs, and its state is what they all wrote.
        state: dict[str, object] = {}

        def seal() -> None:
            state["mark_delete"] = self.mark_delete
            state["value"] = self.record().SerializeToString()

        def settled(future: asyncio.Future[None]) -> None:
            self._saved(future, state.get("mark_delete"))

        saved = self._saving = env.submit(lambda txn: txn.put(key, state["value"], db=db), key=("cursor", key),
                                          on_seal=seal)
        saved.add_done_callback(settled)
        return saved

    def _saved(self, saved: asyncio.Future[None], mark_delete: Position | None) -> None:
        """A save settled. `mark_delete`: the one it wrote (None: a save that coalesced into a
        later submission, which tells it)."""
        # Saves settle in commit order, and each writes the whole state as of its seal: one that
        # succeeds after a failed one has written everything the failed one carried.
        if saved is self._saving:
            self._saving = None
        if saved.cancelled() or saved.exception() is not None:
            self._unsaved = True
            return
        self._unsaved = False
        if mark_delete is None:
            return
        before, self.durable_mark_delete = self.durable_mark_delete, mark_delete
        # Past the last entry of a ledger, durably: the ledger may trim what every cursor
        # consumed (as Pulsar's ManagedCursorImpl tells its ledger once the position is saved).
        if mark_delete > before and (mark_delete.ledger_id != before.ledger_id
                                     or self.ledger.is_last_entry(mark_delete)):
            self.ledger.trim_soon()

    def trim_bound(self) -> Position:
        """What trims may delete up to for this cursor: the lower of its mark-delete position as
        saved and the one in memory. A move forward counts once saved (in flight or failed, a
        restart would find the cursor where the last save left it, needing the entries after
        it); a move back (a seek, a rewound compaction cursor) at once, the entries it will read
        again being kept while it is saved."""
        md, durable = self.mark_delete, self.durable_mark_delete
        return md if md < durable else durable

    async def flush(self) -> None:
        if self.durable:
            await self.persist()

    async def delete(self, also: Sequence[WriteFn] = ()) -> None:
        """Delete the cursor's record, and do `also` (what the subscription keeps beside it) in
        the same LMDB transaction."""
        env = self.ledger.env
        self._deleted = True        # from now on nothing of it is saved (see persist)
        if self.durable:
            db, key = env.db("cursors"), self._key
            await env.submit(all_of([*also, lambda txn: txn.delete(key, db=db)]), key=("cursor", key))
        elif also:
            await env.submit(all_of(list(also)))

    def __repr__(self) -> str:
        return f"ManagedCursor({self.name!r}, mark_delete={self.mark_delete}, read={self.read_position})"


def _done() -> asyncio.Future[None]:
    future = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future
