"""A pure-Python reference model of coordinator semantics (what END_TXN, timeouts and restarts
must do), for the stateful property test. Every operation is instantaneous here; the model
answers what the service must answer, or the error class it must raise."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyengine.errors import InvalidTxnStatusError, TransactionNotFoundError
from pyengine.transaction import TxnAction, TxnStatus
from pyengine_kernels import TxnId


@dataclass
class ModelTxn:
    txn: TxnId
    deadline_ms: int
    status: TxnStatus = TxnStatus.OPEN
    finished_ms: int | None = None
    partitions: list[str] = field(default_factory=list)
    subscriptions: list[tuple[str, str]] = field(default_factory=list)


class ReferenceCoordinator:
    def __init__(self, num_coordinators: int, retention_ms: int) -> None:
        self.retention_ms = retention_ms
        self.next_sequence = [0] * num_coordinators
        self.txns: dict[TxnId, ModelTxn] = {}

    def new(self, cid: int, timeout_ms: int, now: int) -> TxnId:
        txn = TxnId(cid, self.next_sequence[cid])
        self.next_sequence[cid] += 1
        self.txns[txn] = ModelTxn(txn, now + timeout_ms)
        return txn

    def status(self, txn: TxnId, now: int) -> TxnStatus | type[Exception]:
        t = self.txns.get(txn)
        if t is None or (t.finished_ms is not None and t.finished_ms + self.retention_ms <= now):
            return TransactionNotFoundError
        return t.status

    def add(self, txn: TxnId, items: list, partitions: bool, now: int) -> None | type[Exception]:
        status = self.status(txn, now)
        if status is TransactionNotFoundError:
            return TransactionNotFoundError
        if status != TxnStatus.OPEN:
            return InvalidTxnStatusError
        target = self.txns[txn].partitions if partitions else self.txns[txn].subscriptions
        target.extend(item for item in dict.fromkeys(items) if item not in target)
        return None

    def end(self, txn: TxnId, action: TxnAction, now: int) -> TxnStatus | type[Exception]:
        status = self.status(txn, now)
        if status is TransactionNotFoundError:
            return TransactionNotFoundError
        assert isinstance(status, TxnStatus)
        if status == TxnStatus.OPEN:
            return self._finish(self.txns[txn], TxnStatus.COMMITTED if action == TxnAction.COMMIT
                                else TxnStatus.ABORTED, now)
        return status if status.outcome == action else InvalidTxnStatusError

    def expire(self, now: int) -> None:
        for t in self.txns.values():
            if t.status == TxnStatus.OPEN and t.deadline_ms <= now:
                self._finish(t, TxnStatus.TIME_OUT, now)

    def low_watermark(self, cid: int) -> int:
        live = [t.txn.least_bits for t in self.txns.values()
                if t.txn.most_bits == cid and not t.status.is_terminal]
        return min(live) - 1 if live else self.next_sequence[cid] - 1

    @staticmethod
    def _finish(t: ModelTxn, status: TxnStatus, now: int) -> TxnStatus:
        t.status, t.finished_ms = status, now
        return status
