"""Transaction-buffer snapshots (Pulsar's TransactionBufferSnapshot) and where they are kept.

A snapshot lets recovery skip the replay of everything before its max read position: at that
moment every entry up to that position belonged to a txn that had already ended (or to none),
so what recovery needs from that stretch is exactly what the snapshot holds — the aborted txns
and, per coordinator, the low watermark and the txns that ended above it.

One snapshot per topic in the `tb_snapshots` database, keyed by the managed ledger's 8-byte
topic prefix (so deleting the managed ledger deletes it too). Writes go through the group commit
and coalesce: a snapshot superseded before its commit is never written.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from core_ext.poskeys import pack_i64
from pyengine.storage import StorageEnvironment
from pyengine.storage.environment import WriteFn
from pyengine.storage.errors import CorruptRecordError
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer.ended import EndedTxns
from pyengine.transaction.buffer.records_pb2 import CoordinatorRecord, TransactionBufferSnapshotRecord
from pyengine_kernels import AbortedTxnSet, Position


@dataclass
class TransactionBufferSnapshot:
    max_read_position: Position
    aborted: AbortedTxnSet
    ended: EndedTxns = field(default_factory=EndedTxns)
    taken_ms: int = 0

    def encode(self) -> bytes:
        record = TransactionBufferSnapshotRecord(
            max_read_ledger_id=self.max_read_position.ledger_id,
            max_read_entry_id=self.max_read_position.entry_id,
            aborted=self.aborted.to_bytes(), taken_ms=self.taken_ms)
        for coordinator_id, low_watermark, outcomes in self.ended.items():
            record.coordinators.append(CoordinatorRecord(
                coordinator_id=coordinator_id, low_watermark=low_watermark,
                committed=sorted(k for k, v in outcomes.items() if v is TxnAction.COMMIT),
                aborted=sorted(k for k, v in outcomes.items() if v is TxnAction.ABORT)))
        return record.SerializeToString()

    @classmethod
    def decode(cls, raw: bytes) -> TransactionBufferSnapshot:
        try:
            record = TransactionBufferSnapshotRecord.FromString(raw)
            aborted = AbortedTxnSet.from_bytes(record.aborted)
            position = Position(record.max_read_ledger_id, record.max_read_entry_id)
            ended = EndedTxns()
            for coordinator in record.coordinators:
                ended.advance_low_watermark(coordinator.coordinator_id, coordinator.low_watermark)
                ended.add_many(coordinator.coordinator_id, list(coordinator.committed), TxnAction.COMMIT)
                ended.add_many(coordinator.coordinator_id, list(coordinator.aborted), TxnAction.ABORT)
        except (DecodeError, ValueError) as exc:
            raise CorruptRecordError(f"transaction-buffer snapshot: {exc}") from exc
        return cls(position, aborted, ended, record.taken_ms)


class SnapshotStore:
    """The snapshot of one topic in the `tb_snapshots` database."""

    def __init__(self, env: StorageEnvironment, topic_id: int) -> None:
        self.env = env
        self.key = pack_i64(topic_id)
        self._db = env.db("tb_snapshots")

    def load(self) -> TransactionBufferSnapshot | None:
        with self.env.read() as txn:
            raw = txn.get(self.key, db=self._db)
        return TransactionBufferSnapshot.decode(bytes(raw)) if raw is not None else None

    def save(self, snapshot: TransactionBufferSnapshot) -> asyncio.Future[None]:
        """Queue `snapshot` (encoded now, so later changes do not leak into it); resolves once
        it (or a later one that replaced it before the commit) is durable."""
        return self.env.submit(self.write_of(snapshot), key=("tb_snapshot", self.key))

    def write_of(self, snapshot: TransactionBufferSnapshot) -> WriteFn:
        """The LMDB write that stores `snapshot` (encoded now), for another write to carry
        (a trim's: see ManagedLedger.add_trim_writer)."""
        key, value, db = self.key, snapshot.encode(), self._db
        return lambda txn: txn.put(key, value, db=db)
