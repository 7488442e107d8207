"""Figures of a coordinator service, shaped for Prometheus: gauges by state, counters since the
service started, and END_TXN latencies (a bounded sample of recent ones plus count and sum, so
a histogram or summary can be fed from it)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pyengine.transaction import TxnStatus


@dataclass
class CoordinatorStats:
    by_status: dict[TxnStatus, int]          # live txns, plus the finished ones still retained
    created_total: int
    committed_total: int
    aborted_total: int                       # ended ABORTED (client aborts)
    timed_out_total: int                     # ended TIME_OUT
    end_txn_count: int                       # END_TXN requests answered with success
    end_txn_latency_sum_ms: float
    end_txn_latency_ms: list[float]          # the most recent answers, oldest first
    low_watermarks: dict[int, int]           # coordinator id -> low watermark
    pending_timeouts: int                    # OPEN txns with an armed deadline
    ending: int                              # txns whose participants are being told

    @property
    def open(self) -> int:
        return self.by_status[TxnStatus.OPEN]


@dataclass
class Counters:
    created: int = 0
    committed: int = 0
    aborted: int = 0
    timed_out: int = 0
    end_txn_count: int = 0
    end_txn_latency_sum_ms: float = 0.0
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=1024))

    def record_end_txn(self, latency_ms: float) -> None:
        self.end_txn_count += 1
        self.end_txn_latency_sum_ms += latency_ms
        self.latencies.append(latency_ms)

    def record_ended(self, status: TxnStatus) -> None:
        if status == TxnStatus.COMMITTED:
            self.committed += 1
        elif status == TxnStatus.ABORTED:
            self.aborted += 1
        elif status == TxnStatus.TIME_OUT:
            self.timed_out += 1
