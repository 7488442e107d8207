"""Figures of a coordinator service, shaped for Prometheus: gauges by state, counters since the
service started, and END_TXN latencies (a bounded sample of recent ones, count and sum, and
counts per latency bucket since the start, which a Prometheus histogram needs)."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from pyengine.transaction import TxnStatus

# Upper bounds (ms) of the END_TXN latency buckets; one more bucket holds what lies above.
END_TXN_LATENCY_BOUNDS_MS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0)


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
    end_txn_latency_buckets: list[int]       # answers per END_TXN_LATENCY_BOUNDS_MS bucket, then above
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
    latency_buckets: list[int] = field(default_factory=lambda: [0] * (len(END_TXN_LATENCY_BOUNDS_MS) + 1))

    @classmethod
    def total(cls, parts: list[Counters]) -> Counters:
        """The counters of several coordinators together (v4's and v5's: one broker's figures)."""
        whole = cls()
        for part in parts:
            whole.created += part.created
            whole.committed += part.committed
            whole.aborted += part.aborted
            whole.timed_out += part.timed_out
            whole.end_txn_count += part.end_txn_count
            whole.end_txn_latency_sum_ms += part.end_txn_latency_sum_ms
            whole.latencies.extend(part.latencies)
            whole.latency_buckets = [a + b for a, b in zip(whole.latency_buckets, part.latency_buckets)]
        return whole

    def record_end_txn(self, latency_ms: float) -> None:
        self.end_txn_count += 1
        self.end_txn_latency_sum_ms += latency_ms
        self.latencies.append(latency_ms)
        self.latency_buckets[bisect.bisect_left(END_TXN_LATENCY_BOUNDS_MS, latency_ms)] += 1

    def record_ended(self, status: TxnStatus) -> None:
        if status == TxnStatus.COMMITTED:
            self.committed += 1
        elif status == TxnStatus.ABORTED:
            self.aborted += 1
        elif status == TxnStatus.TIME_OUT:
            self.timed_out += 1
