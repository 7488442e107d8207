"""The PIP-473 metrics of one broker's v5 transaction components (names as the spec):

* `pulsar_txn_metadata_store_op_writes_total` — op records written;
* `pulsar_txn_metadata_store_header_cas_total{result="ok|conflict|reject"}` — header CAS
  attempts: ok (landed), conflict (lost to a concurrent change: re-read and retried), reject
  (not attempted or refused: the txn was not OPEN, or unknown);
* `pulsar_txn_metadata_store_index_query_seconds` — latency of the index range queries on
  idx:writes-by-segment / idx:acks-by-segment-subscription (a histogram);
* `pulsar_txn_metadata_store_outstanding_op_records` — op records not collected yet (a gauge:
  recounted by every GC sweep, moved by this broker's writes and deletes in between).
"""

from __future__ import annotations

import bisect
import time
from contextlib import contextmanager
from collections.abc import Iterator

INDEX_QUERY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class V5Metrics:
    def __init__(self) -> None:
        self.op_writes_total = 0
        self.header_cas_total = {"ok": 0, "conflict": 0, "reject": 0}
        self.index_query_buckets = [0] * (len(INDEX_QUERY_BUCKETS_S) + 1)   # last: +Inf
        self.index_query_count = 0
        self.index_query_sum_s = 0.0
        self.outstanding_op_records = 0

    def op_written(self, count: int = 1) -> None:
        self.op_writes_total += count
        self.outstanding_op_records += count

    def ops_deleted(self, count: int) -> None:
        self.outstanding_op_records = max(0, self.outstanding_op_records - count)

    def cas(self, result: str) -> None:
        self.header_cas_total[result] += 1

    @contextmanager
    def index_query(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            self.index_query_buckets[bisect.bisect_left(INDEX_QUERY_BUCKETS_S, elapsed)] += 1
            self.index_query_count += 1
            self.index_query_sum_s += elapsed

    def cumulative_buckets(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs for a Prometheus histogram, +Inf last."""
        out, total = [], 0
        for bound, count in zip((*map(str, INDEX_QUERY_BUCKETS_S), "+Inf"), self.index_query_buckets):
            total += count
            out.append((bound, total))
        return out

    def as_dict(self) -> dict:
        return {"op_writes_total": self.op_writes_total, "header_cas_total": dict(self.header_cas_total),
                "index_query_count": self.index_query_count, "index_query_sum_s": self.index_query_sum_s,
                "outstanding_op_records": self.outstanding_op_records}


def prometheus_families(metrics: V5Metrics, cluster: str):
    """The four PIP-473 metric families (prometheus_client), labelled with the cluster."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    writes = CounterMetricFamily("pulsar_txn_metadata_store_op_writes", "v5 transaction op records written",
                                 labels=["cluster"])
    writes.add_metric([cluster], metrics.op_writes_total)
    yield writes
    cas = CounterMetricFamily("pulsar_txn_metadata_store_header_cas", "v5 transaction header CAS attempts by outcome",
                              labels=["cluster", "result"])
    for result, count in metrics.header_cas_total.items():
        cas.add_metric([cluster, result], count)
    yield cas
    queries = HistogramMetricFamily("pulsar_txn_metadata_store_index_query_seconds",
                                    "Latency of the v5 op-record index range queries", labels=["cluster"])
    queries.add_metric([cluster], metrics.cumulative_buckets(), sum_value=metrics.index_query_sum_s)
    yield queries
    outstanding = GaugeMetricFamily("pulsar_txn_metadata_store_outstanding_op_records",
                                    "v5 op records not collected yet (txn GC backlog)", labels=["cluster"])
    outstanding.add_metric([cluster], metrics.outstanding_op_records)
    yield outstanding
