"""The v4 pending-ack log of one subscription, in the LMDB database `pending_ack`.

Pulsar keeps a managed ledger per subscription (`<topic>-<sub>__transaction_pending_ack`) and
appends commit/abort marks that replay must interpret. Here one record per accepted request
sits under key = subscription prefix + order-preserving sequence, and a transaction's records
are deleted when it ends, in the same LMDB write transaction as its acks on the cursor. The
log therefore only ever holds the acknowledgements of transactions still open, and replay is
a plain scan with no commit/abort marks to match.

The prefix is the cursor's key (topic id + cursor name) with its length in front, so no
subscription's prefix is a prefix of another's ("s" and "s2" of one topic stay apart).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import lmdb

from core_ext.poskeys import pack_i64, unpack_i64
from pyengine.storage.environment import StorageEnvironment, WriteFn, delete_prefix
from pyengine.storage.errors import CorruptRecordError
from pyengine.transaction.pendingack import IndividualAck, PendingAckReplayError
from pyengine.transaction.pendingack.records_pb2 import (
    CUMULATIVE,
    INDIVIDUAL,
    AckSetRecord,
    PendingAckPositionRecord,
    PendingAckRecord,
)
from pyengine.transaction.pendingack.validation import check_individual_acks
from pyengine_kernels import Position, TxnId

if TYPE_CHECKING:
    from pyengine.storage.cursor import ManagedCursor

_PREFIX_LENGTH = struct.Struct(">H")
_SEQ_BYTES = 8


@dataclass(frozen=True)
class LoggedAck:
    """One record: an individual request (`individual`) or a cumulative one (`cumulative`)."""

    seq: int
    txn: TxnId
    individual: tuple[IndividualAck, ...] = ()
    cumulative: Position | None = None


class LogPendingAckStore:
    # Its record deletes land in the cursor's LMDB write transaction when queued in the same
    # event-loop turn (the handle then needs not order them).
    deletes_with_cursor = True

    def __init__(self, env: StorageEnvironment, prefix: bytes, subscription: str) -> None:
        if not prefix:
            raise ValueError("the key prefix of a pending-ack log must not be empty")
        self.env = env
        self.subscription = subscription
        self._prefix = prefix
        self._db = env.db("pending_ack")
        self._next_seq: int | None = None

    @classmethod
    def for_cursor(cls, cursor: ManagedCursor) -> LogPendingAckStore:
        """The log of the subscription whose durable cursor is `cursor`."""
        key = cursor._key
        if len(key) > 0xFFFF:
            raise ValueError(f"subscription name too long for a pending-ack log: {cursor.name[:80]!r}...")
        return cls(cursor.ledger.env, _PREFIX_LENGTH.pack(len(key)) + key,
                   f"{cursor.ledger.name}/{cursor.name}")

    # --- writes ---------------------------------------------------------------------------

    def append_individual(self, txn: TxnId, acks: list[IndividualAck], *,
                          after: asyncio.Future[Any] | None = None) -> tuple[int, asyncio.Future[None]]:
        """Queue the record of an individual request; returns its sequence and a future that
        resolves once it is durable (or fails with a StorageError, nothing written). `after`:
        a write of the same environment it must not be durable without (the coordinator's
        registration of the subscription: StorageEnvironment.depend)."""
        record = PendingAckRecord(txn_most=txn.most_bits, txn_least=txn.least_bits, kind=INDIVIDUAL,
                                  positions=[_position_record(ack) for ack in acks])
        return self._append(record, after)

    def append_cumulative(self, txn: TxnId, position: Position, *,
                          after: asyncio.Future[Any] | None = None) -> tuple[int, asyncio.Future[None]]:
        record = PendingAckRecord(txn_most=txn.most_bits, txn_least=txn.least_bits, kind=CUMULATIVE,
                                  positions=[PendingAckPositionRecord(ledger_id=position.ledger_id,
                                                                      entry_id=position.entry_id)])
        return self._append(record, after)

    def append_cumulative_in_batch(self, txn: TxnId, before: Position, ack: IndividualAck, *,
                                   after: asyncio.Future[Any] | None = None) -> tuple[list[int], asyncio.Future[None]]:
        """Queue the records of a cumulative ack inside a batch (a cumulative record up to
        `before`, an individual one of `ack`) as one write: both are durable or neither."""
        cumulative = PendingAckRecord(txn_most=txn.most_bits, txn_least=txn.least_bits, kind=CUMULATIVE,
                                      positions=[PendingAckPositionRecord(ledger_id=before.ledger_id,
                                                                          entry_id=before.entry_id)])
        individual = PendingAckRecord(txn_most=txn.most_bits, txn_least=txn.least_bits, kind=INDIVIDUAL,
                                      positions=[_position_record(ack)])
        return self._append_all([cumulative, individual], after)

    def delete_records(self, seqs: Collection[int]) -> asyncio.Future[None]:
        """Queue the deletion of records (of a transaction that ended). Submitted in the same
        event-loop turn as other writes, it lands in the same LMDB write transaction."""
        keys = [self._key(seq) for seq in seqs]
        db = self._db

        def write(txn: lmdb.Transaction) -> None:
            for key in keys:
                txn.delete(key, db=db)

        return self.env.submit(write)

    async def delete(self) -> None:
        """Remove every record of the subscription (it is being deleted)."""
        await self.env.submit(self.delete_write())

    def delete_write(self) -> WriteFn:
        """The write removing every record of the subscription, for the caller to submit with
        the rest of the subscription's deletion (one LMDB transaction: a crash never leaves the
        subscription without its pending acks)."""
        prefix, db = self._prefix, self._db
        self._next_seq = 0
        return lambda txn: delete_prefix(txn, db, prefix)

    def _append(self, record: PendingAckRecord,
                after: asyncio.Future[Any] | None) -> tuple[int, asyncio.Future[None]]:
        seqs, future = self._append_all([record], after)
        return seqs[0], future

    def _append_all(self, records: list[PendingAckRecord],
                    after: asyncio.Future[Any] | None) -> tuple[list[int], asyncio.Future[None]]:
        """Queue `records` under consecutive sequences, in one write."""
        if self._next_seq is None:
            self._next_seq = self._last_seq() + 1
        first = self._next_seq
        seqs = list(range(first, first + len(records)))
        rows = [(self._key(seq), record.SerializeToString()) for seq, record in zip(seqs, records)]
        db = self._db

        def write(txn: lmdb.Transaction) -> None:
            for key, value in rows:
                txn.put(key, value, db=db)

        future = self.env.submit(write, after=after)
        self._next_seq = first + len(records)
        return seqs, future

    # --- reads ----------------------------------------------------------------------------

    def scan(self, chunk_size: int) -> Iterator[list[LoggedAck]]:
        """Every record in log order, `chunk_size` at a time (one read transaction per chunk).
        Each chunk starts strictly after the previous one's last key, so the scan ends after
        one pass. A record that cannot be read or decoded raises PendingAckReplayError naming
        the subscription and the record."""
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, not {chunk_size}")
        prefix = self._prefix
        start = prefix
        last_seq = -1
        while True:
            try:
                raw = self._read_chunk(start, chunk_size)
            except Exception as exc:       # LMDB, closed environment, I/O: all end the scan
                after = f"after record {last_seq}" if last_seq >= 0 else "from the start"
                raise PendingAckReplayError(
                    f"pending-ack log of {self.subscription}: cannot read the records {after}: {exc}") from exc
            chunk = [self._decode(key, value) for key, value in raw]
            if chunk:
                last_seq = chunk[-1].seq
            yield chunk
            if len(raw) < chunk_size:
                # Only a complete scan knows the last sequence (appends continue after it).
                self._next_seq = max(self._next_seq or 0, last_seq + 1)
                return
            start = raw[-1][0] + b"\x00"      # the smallest key after the last one read

    async def stored(self) -> tuple[int, int]:
        """The records stored now (durable) and the bytes of their values: the size of the
        subscription's pending-ack log (admin's pendingAckInternalStats)."""
        return await self.env.prefix_usage(self._db, self._prefix)

    def _read_chunk(self, start: bytes, chunk_size: int) -> list[tuple[bytes, bytes]]:
        prefix = self._prefix
        rows: list[tuple[bytes, bytes]] = []
        with self.env.read() as txn:
            cursor = txn.cursor(db=self._db)
            if not cursor.set_range(start):
                return rows
            for key, value in cursor:
                if not key.startswith(prefix):
                    break
                rows.append((bytes(key), bytes(value)))
                if len(rows) >= chunk_size:
                    break
        return rows

    def _decode(self, key: bytes, value: bytes) -> LoggedAck:
        suffix = key[len(self._prefix):]
        if len(suffix) != _SEQ_BYTES:
            raise PendingAckReplayError(
                f"pending-ack log of {self.subscription}: record key {key.hex()} is not prefix + sequence")
        seq = unpack_i64(suffix)
        try:
            return _logged_ack(seq, PendingAckRecord.FromString(value))
        except Exception as exc:
            raise PendingAckReplayError(
                f"pending-ack log of {self.subscription}: record {seq} cannot be decoded: {exc}") from exc

    def _last_seq(self) -> int:
        """The sequence of the last record, -1 when there is none."""
        prefix = self._prefix
        highest = self._key(2**63 - 1)
        with self.env.read() as txn:
            cursor = txn.cursor(db=self._db)
            if cursor.set_range(highest):
                found = cursor.key() == highest or cursor.prev()
            else:
                found = cursor.last()
            key = bytes(cursor.key()) if found else b""
        if not key.startswith(prefix):
            return -1
        if len(key) != len(prefix) + _SEQ_BYTES:
            raise CorruptRecordError(f"pending-ack log of {self.subscription}: record key {key.hex()} "
                                     "is not prefix + sequence")
        return unpack_i64(key[len(prefix):])

    def _key(self, seq: int) -> bytes:
        return self._prefix + pack_i64(seq)


def _position_record(ack: IndividualAck) -> PendingAckPositionRecord:
    record = PendingAckPositionRecord(ledger_id=ack.position.ledger_id, entry_id=ack.position.entry_id,
                                      batch_size=ack.batch_size)
    if ack.ack_set is not None:
        record.ack_set.CopyFrom(AckSetRecord(words=ack.ack_set))
    return record


def _logged_ack(seq: int, record: PendingAckRecord) -> LoggedAck:
    """The record as checked values (the same checks as a live request)."""
    txn = TxnId(record.txn_most, record.txn_least)
    if record.kind == CUMULATIVE:
        if len(record.positions) != 1:
            raise ValueError(f"a cumulative record holds one position, this one {len(record.positions)}")
        only = record.positions[0]
        position = Position(only.ledger_id, only.entry_id)
        if position.ledger_id < 0 or position.entry_id < 0:
            raise ValueError(f"{position} does not name an entry")
        return LoggedAck(seq, txn, cumulative=position)
    acks = [IndividualAck(Position(p.ledger_id, p.entry_id), p.batch_size,
                          tuple(p.ack_set.words) if p.HasField("ack_set") else None)
            for p in record.positions]
    return LoggedAck(seq, txn, individual=tuple(check_individual_acks(acks)))
