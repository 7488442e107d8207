"""Transaction-buffer snapshots (Pulsar's TransactionBufferSnapshot) and where they are kept.

A snapshot lets recovery skip the replay of everything before its max read position: at that
moment every entry up to that position belonged to a txn that had already ended (or to none),
so what recovery needs from that stretch is exactly what the snapshot holds — the aborted txns
and, per coordinator, the low watermark and the txns that ended above it.

Stored in the `tb_snapshots` database under the managed ledger's 8-byte topic prefix (so
deleting the managed ledger deletes it too), segmented as PIP-196 does: once enough aborts with
markers at or before the max read position have piled up, they are sealed into a segment,
written once under the prefix followed by the segment's last marker position, and the snapshot
record (the index) lists the segments and holds only the aborts none of them holds. A snapshot
write therefore costs the index and at most one new segment, not every abort the topic still
remembers (PIP-178/196's write amplification). A segment goes with the trim that deletes the
ledger of its last marker. Writes go through the group commit and coalesce: a snapshot
superseded before its commit is never written (a segment it sealed is carried by the next).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from core_ext.poskeys import pack_i64, pack_position
from pyengine.storage import StorageEnvironment
from pyengine.storage.environment import WriteFn
from pyengine.storage.errors import CorruptRecordError
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer.ended import EndedTxns
from pyengine.transaction.buffer.records_pb2 import (
    CoordinatorRecord,
    SnapshotSegmentRecord,
    TransactionBufferSnapshotRecord,
)
from pyengine_kernels import AbortedTxnSet, Position

# Aborts per sealed segment. Pulsar sizes its segments in bytes
# (transactionBufferSnapshotSegmentSize, 256 KiB); an abort takes ~20 bytes here, so this is
# about the same.
DEFAULT_SEGMENT_ABORTS = 10_000


@dataclass(frozen=True)
class SnapshotSegment:
    """A sealed segment: how many aborts it holds and the highest abort marker among them."""

    last_marker: Position
    aborted_count: int


def segment_key(topic_key: bytes, last_marker: Position) -> bytes:
    return topic_key + pack_position(last_marker.ledger_id, last_marker.entry_id)


@dataclass
class TransactionBufferSnapshot:
    max_read_position: Position
    aborted: AbortedTxnSet                      # every abort, the segments' included
    ended: EndedTxns = field(default_factory=EndedTxns)
    taken_ms: int = 0
    segments: tuple[SnapshotSegment, ...] = ()  # as loaded: the sealed segments it listed

    def encode(self, *, unsealed: AbortedTxnSet | None = None, segments: tuple[SnapshotSegment, ...] = ()) -> bytes:
        """The snapshot record: with `segments`, it holds only `unsealed` (the aborts none of
        them holds) and lists them; without, every abort."""
        record = TransactionBufferSnapshotRecord(
            max_read_ledger_id=self.max_read_position.ledger_id,
            max_read_entry_id=self.max_read_position.entry_id,
            aborted=(self.aborted if unsealed is None else unsealed).to_bytes(), taken_ms=self.taken_ms)
        for coordinator_id, low_watermark, outcomes in self.ended.items():
            record.coordinators.append(CoordinatorRecord(
                coordinator_id=coordinator_id, low_watermark=low_watermark,
                committed=sorted(k for k, v in outcomes.items() if v is TxnAction.COMMIT),
                aborted=sorted(k for k, v in outcomes.items() if v is TxnAction.ABORT),
                committed_unmarked=self.ended.unmarked_commits(coordinator_id)))
        for segment in segments:
            record.segments.append(SnapshotSegmentRecord(
                last_marker_ledger_id=segment.last_marker.ledger_id,
                last_marker_entry_id=segment.last_marker.entry_id, aborted_count=segment.aborted_count))
        return record.SerializeToString()

    @classmethod
    def decode(cls, raw: bytes, read_segment: Callable[[Position], bytes | None] | None = None,
               first: Position | None = None) -> TransactionBufferSnapshot:
        """Decode a snapshot record, reading the segments it lists with `read_segment`. A
        segment may be missing only if its last marker lies before `first` (the topic's first
        entry: a trim deleted it, and a snapshot written just before that trim still named it)."""
        try:
            record = TransactionBufferSnapshotRecord.FromString(raw)
            aborted = AbortedTxnSet.from_bytes(record.aborted)
            position = Position(record.max_read_ledger_id, record.max_read_entry_id)
            ended = EndedTxns()
            for coordinator in record.coordinators:
                ended.advance_low_watermark(coordinator.coordinator_id, coordinator.low_watermark)
                ended.add_many(coordinator.coordinator_id, list(coordinator.committed), TxnAction.COMMIT)
                ended.add_many(coordinator.coordinator_id, list(coordinator.aborted), TxnAction.ABORT)
                ended.add_unmarked_commits(coordinator.coordinator_id, list(coordinator.committed_unmarked))
            segments = []
            for stored in record.segments:
                segment = SnapshotSegment(Position(stored.last_marker_ledger_id, stored.last_marker_entry_id),
                                          stored.aborted_count)
                part = read_segment(segment.last_marker) if read_segment is not None else None
                if part is None:
                    if first is not None and segment.last_marker < first:
                        continue
                    raise CorruptRecordError(f"transaction-buffer snapshot: its segment ending at "
                                             f"{segment.last_marker} is missing")
                try:
                    aborts = AbortedTxnSet.from_bytes(part)
                except ValueError as exc:
                    raise CorruptRecordError(f"transaction-buffer snapshot: its segment ending at "
                                             f"{segment.last_marker}: {exc}") from exc
                if len(aborts) != segment.aborted_count or aborts.last_marker_position() != segment.last_marker:
                    raise CorruptRecordError(f"transaction-buffer snapshot: its segment ending at "
                                             f"{segment.last_marker} does not hold what the index says")
                aborted.update(aborts)
                segments.append(segment)
        except (DecodeError, ValueError) as exc:
            raise CorruptRecordError(f"transaction-buffer snapshot: {exc}") from exc
        return cls(position, aborted, ended, record.taken_ms, tuple(segments))


class SnapshotStore:
    """The snapshot of one topic in the `tb_snapshots` database, with its sealed segments."""

    def __init__(self, env: StorageEnvironment, topic_id: int, *,
                 segment_aborts: int = DEFAULT_SEGMENT_ABORTS) -> None:
        if not isinstance(segment_aborts, int) or isinstance(segment_aborts, bool) or segment_aborts <= 0:
            raise ValueError(f"segment_aborts must be a positive int, not {segment_aborts!r}")
        self.env = env
        self.key = pack_i64(topic_id)
        self.segment_aborts = segment_aborts
        self._db = env.db("tb_snapshots")
        self._segments: list[SnapshotSegment] = []       # sealed, by last marker
        self._unwritten: dict[Position, bytes] = {}      # sealed, no commit known to carry them yet
        self.last_sealed_ms = 0                          # when this process last sealed a segment

    @property
    def segments(self) -> tuple[SnapshotSegment, ...]:
        return tuple(self._segments)

    async def stored(self) -> tuple[int | None, int, int]:
        """What is stored now (durable) for this topic: the bytes of its snapshot record (the
        segments' index; None if there is none), and how many sealed segments and their bytes
        (admin's transactionBufferInternalStats)."""
        with self.env.read() as txn:
            index = txn.get(self.key, db=self._db)
            index_size = len(index) if index is not None else None
        segments, size = await self.env.prefix_usage(self._db, self.key, self.key + b"\x00")
        return index_size, segments, size

    def unsealed_count(self, aborted: AbortedTxnSet) -> int:
        """How many of `aborted` (the buffer's aborts) no segment holds."""
        return len(aborted.since(self._segments[-1].last_marker.next())) if self._segments else len(aborted)

    def load(self, first: Position | None = None) -> TransactionBufferSnapshot | None:
        """The stored snapshot with every abort of its segments; `first`: the topic's first
        entry (see `TransactionBufferSnapshot.decode`). Sealing goes on from its segments."""
        db = self._db
        with self.env.read() as txn:
            raw = txn.get(self.key, db=db)

            def read_segment(last_marker: Position) -> bytes | None:
                part = txn.get(segment_key(self.key, last_marker), db=db)
                return bytes(part) if part is not None else None

            snapshot = TransactionBufferSnapshot.decode(bytes(raw), read_segment, first) if raw is not None else None
        self._segments = list(snapshot.segments) if snapshot is not None else []
        self._unwritten = {}
        return snapshot

    def save(self, snapshot: TransactionBufferSnapshot) -> asyncio.Future[None]:
        """Queue `snapshot` (encoded now, so later changes do not leak into it); resolves once
        it (or a later one that replaced it before the commit) is durable."""
        write = self.write_of(snapshot, seal=True)
        carried = list(self._unwritten)
        saved = self.env.submit(write, key=("tb_snapshot", self.key))
        saved.add_done_callback(lambda done: self._carried(carried, done))
        return saved

    def write_of(self, snapshot: TransactionBufferSnapshot, *, first_kept: Position | None = None,
                 seal: bool = False) -> WriteFn:
        """The LMDB write that stores `snapshot` (encoded now): the index, and the sealed
        segments no commit is known to have carried yet. `seal`: first seal a new segment if
        enough aborts at or before its max read position are in no segment. `first_kept`: the
        write goes with a trim that deletes every entry before it (see
        ManagedLedger.add_trim_writer): the segments entirely before it are deleted, and
        `trimmed` forgets them once that trim has committed."""
        kept = self._segments if first_kept is None else [s for s in self._segments if s.last_marker >= first_kept]
        doomed = [s.last_marker for s in self._segments if first_kept is not None and s.last_marker < first_kept]
        bound = kept[-1].last_marker.next() if kept else Position.EARLIEST
        if first_kept is not None:
            bound = max(bound, first_kept)
        unsealed = snapshot.aborted.since(bound)
        if seal and len(unsealed) >= self.segment_aborts:
            unsealed = self._seal(unsealed, snapshot.max_read_position)
            kept = self._segments
        index = snapshot.encode(unsealed=unsealed, segments=tuple(kept))
        key, db = self.key, self._db
        parts = [(segment_key(key, last), part) for last, part in self._unwritten.items()
                 if first_kept is None or last >= first_kept]
        gone = [segment_key(key, last) for last in doomed]

        def write(txn) -> None:
            for part_key, part in parts:
                txn.put(part_key, part, db=db)
            for part_key in gone:
                txn.delete(part_key, db=db)
            txn.put(key, index, db=db)
        return write

    def _seal(self, unsealed: AbortedTxnSet, max_read_position: Position) -> AbortedTxnSet:
        """Seal the aborts of `unsealed` whose marker is at or before `max_read_position` into
        segments of `segment_aborts` each, in marker order; what stays unsealed. Only those: an
        abort applied after this snapshot has its marker beyond it (its txn's entries, before
        the marker, held the read position back until it ended), so no later abort can fall
        below a sealed segment. Aborts sharing a marker position (txns ended on a terminated
        topic are all at its LAC) go into one segment, then larger: a segment is named by its
        last marker, and what stays unsealed is what lies after it."""
        after = unsealed.since(max_read_position.next())
        if len(unsealed) - len(after) < self.segment_aborts:
            return unsealed
        items = [(txn, marker) for txn, marker in unsealed.items() if marker <= max_read_position]
        chunk, count = AbortedTxnSet(), 0
        for index, (txn, marker) in enumerate(items):
            chunk.add(txn, marker)
            count += 1
            if count >= self.segment_aborts and (index + 1 == len(items) or items[index + 1][1] != marker):
                self._segments.append(SnapshotSegment(marker, count))
                self._unwritten[marker] = chunk.to_bytes()
                chunk, count = AbortedTxnSet(), 0
        self.last_sealed_ms = int(time.time() * 1000)
        return unsealed.since(self._segments[-1].last_marker.next())

    def _carried(self, carried: list[Position], done: asyncio.Future[None]) -> None:
        if done.cancelled() or done.exception() is not None:
            return                      # still unwritten: the next snapshot carries them
        for last in carried:
            self._unwritten.pop(last, None)

    def trimmed(self, first_kept: Position) -> None:
        """A trim deleting every entry before `first_kept` has committed (with a write of
        `write_of(..., first_kept=...)`): forget the segments it deleted."""
        self._segments = [s for s in self._segments if s.last_marker >= first_kept]
        for last in [last for last in self._unwritten if last < first_kept]:
            del self._unwritten[last]
