"""Prometheus metrics at `GET /metrics`, read from the live broker at each scrape by a custom
collector in a registry of its own (prometheus-client's global default registry is left alone).

Pulsar's names, with Pulsar's labels (`cluster`, and `namespace` / `topic` / `subscription` /
`coordinator_id`), where Pulsar has the metric:

* coordinator: `pulsar_txn_active_count` (per coordinator), `pulsar_txn_created_total`,
  `pulsar_txn_committed_total`, `pulsar_txn_aborted_total` (timed-out txns included, as in
  Pulsar), `pulsar_txn_timeout_total` — broker-wide, without `coordinator_id`, v4 and v5
  transactions together (PIP-473: the existing metrics remain); the active count is v4's
  coordinators' (v5's OPEN transactions are the metadata store's, every broker's);
* per topic (Pulsar's topic-level metrics): `pulsar_in_messages_total`, `pulsar_in_bytes_total`,
  `pulsar_out_messages_total`, `pulsar_out_bytes_total` (since the topic was loaded),
  `pulsar_rate_in`, `pulsar_rate_out`, `pulsar_throughput_in`, `pulsar_throughput_out` (last
  stats interval), `pulsar_storage_size`, `pulsar_msg_backlog`, `pulsar_subscriptions_count`,
  `pulsar_producers_count`, `pulsar_consumers_count`, and the transaction buffer's
  `pulsar_txn_tb_active_total`, `pulsar_txn_tb_committed_total`, `pulsar_txn_tb_aborted_total`;
* per subscription, readers' too (as Pulsar's aggregator): `pulsar_subscription_back_log`,
  `pulsar_subscription_delayed`, `pulsar_subscription_unacked_messages`,
  `pulsar_subscription_blocked_on_unacked_messages`, `pulsar_subscription_msg_rate_out`,
  `pulsar_subscription_msg_throughput_out`, `pulsar_subscription_msg_rate_redeliver`.

Ours (`pyengine_` prefix), for what Pulsar does not export:

* `pyengine_txn_count{state}`: transactions by coordinator state (the live ones, plus the
  finished ones the coordinators still retain);
* `pyengine_txn_ending_count`: transactions whose outcome is being applied on their participants
  (a count that stays up means a participant does not confirm);
* `pyengine_txn_end_latency_seconds`: histogram of END_TXN latency (request to answer; v4 and
  v5). Pulsar's
  `pulsar_txn_execution_latency_le_*` measures something else (a txn's whole life), so it is
  not exported under that name;
* `pyengine_txn_read_horizon_lag_entries{topic}`: entries between the topic's max read
  position and its last confirmed entry, held back from readers by open transactions;
* `pyengine_pending_ack_positions{subscription}` and `pyengine_pending_ack_transactions
  {subscription}`: entries reserved by open transactions' individual acknowledgements, and how
  many transactions hold acknowledgements.

Transaction keys (pip-transaction-key-fencing; see `routes_transaction_keys`):
`pulsar_txn_transaction_key_count`, `pulsar_txn_transaction_key_epoch{transaction_key}`,
`pulsar_txn_transaction_key_age{transaction_key}` (summary).

Only loaded topics are reported: the broker loads a topic when it is used.
"""

from __future__ import annotations

from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from pyengine.admin.routes_transaction_keys import transaction_key_metrics
from pyengine.admin.stats import subscription_stats
from pyengine.admin.routing import Call, Reply, RouteTable
from pyengine.broker.service import BrokerService
from pyengine.transaction import TxnStatus
from pyengine.transaction.coordinator.metadata_metrics import prometheus_families
from pyengine.transaction.coordinator.stats import END_TXN_LATENCY_BOUNDS_MS

METRICS_PATH = "/metrics"
REGISTRY = web.AppKey("metrics_registry", CollectorRegistry)
_LIVE = (TxnStatus.OPEN, TxnStatus.COMMITTING, TxnStatus.ABORTING)
_TOPIC = ["cluster", "namespace", "topic"]
_SUBSCRIPTION = [*_TOPIC, "subscription"]

routes = RouteTable("meta")


class BrokerCollector(Collector):
    def __init__(self, service: BrokerService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        yield from self._coordinator_metrics()
        yield from transaction_key_metrics(self.service)
        if self.service.v5 is not None:
            yield from prometheus_families(self.service.v5.metrics, self.service.config.cluster_name)
        yield from self._topic_metrics()

    def _coordinator_metrics(self) -> Iterator[Metric]:
        cluster = self.service.config.cluster_name
        coordinator = self.service.coordinator
        stats = coordinator.stats()

        active = GaugeMetricFamily("pulsar_txn_active_count", "Transactions not ended yet, per coordinator",
                                   labels=["cluster", "coordinator_id"])
        for cid in coordinator.coordinator_ids:
            counts = coordinator.store(cid).status_counts()
            active.add_metric([cluster, str(cid)], sum(counts[status] for status in _LIVE))
        yield active

        counters = coordinator.counters          # v4's and v5's (PIP-473: existing metrics remain)
        for name, documentation, value in (
                ("pulsar_txn_created_total", "Transactions created", counters.created),
                ("pulsar_txn_committed_total", "Transactions committed", counters.committed),
                ("pulsar_txn_aborted_total", "Transactions aborted (timed-out ones included)",
                 counters.aborted + counters.timed_out),
                ("pulsar_txn_timeout_total", "Transactions aborted by their timeout", counters.timed_out)):
            counter = CounterMetricFamily(name, documentation, labels=["cluster"])
            counter.add_metric([cluster], value)
            yield counter

        by_state = GaugeMetricFamily("pyengine_txn_count", "Transactions by coordinator state (finished ones "
                                     "while retained)", labels=["cluster", "state"])
        for status, count in stats.by_status.items():
            by_state.add_metric([cluster, status.name], count)
        yield by_state

        ending = GaugeMetricFamily("pyengine_txn_ending_count", "Transactions whose outcome is being applied "
                                   "on their participants", labels=["cluster"])
        ending.add_metric([cluster], stats.ending)
        yield ending

        latency = HistogramMetricFamily("pyengine_txn_end_latency_seconds", "END_TXN latency, request to answer",
                                        labels=["cluster"])
        cumulative, buckets = 0, []
        for bound_ms, count in zip(END_TXN_LATENCY_BOUNDS_MS, counters.latency_buckets):
            cumulative += count
            buckets.append((repr(bound_ms / 1000), cumulative))
        buckets.append(("+Inf", counters.end_txn_count))
        latency.add_metric([cluster], buckets, counters.end_txn_latency_sum_ms / 1000)
        yield latency

    def _topic_metrics(self) -> Iterator[Metric]:
        cluster = self.service.config.cluster_name
        gauges = {name: GaugeMetricFamily(name, documentation, labels=_TOPIC) for name, documentation in (
            ("pulsar_storage_size", "Bytes stored by the topic's ledgers"),
            ("pulsar_msg_backlog", "Entries not yet acknowledged, summed over the subscriptions (readers' too)"),
            ("pulsar_subscriptions_count", "Subscriptions (readers' too)"),
            ("pulsar_producers_count", "Connected producers"),
            ("pulsar_consumers_count", "Connected consumers"),
            ("pulsar_rate_in", "Messages published per second (last stats interval)"),
            ("pulsar_rate_out", "Messages delivered per second (last stats interval)"),
            ("pulsar_throughput_in", "Bytes published per second (last stats interval)"),
            ("pulsar_throughput_out", "Bytes delivered per second (last stats interval)"),
            ("pulsar_txn_tb_active_total", "Open transactions with entries on the topic"),
            ("pyengine_txn_read_horizon_lag_entries", "Entries between the max read position and the last "
                                                      "confirmed entry (held back by open transactions)"))}
        counters = {name: CounterMetricFamily(name, documentation, labels=_TOPIC) for name, documentation in (
            ("pulsar_in_messages_total", "Messages published since the topic was loaded"),
            ("pulsar_in_bytes_total", "Bytes published since the topic was loaded"),
            ("pulsar_out_messages_total", "Messages delivered since the topic was loaded"),
            ("pulsar_out_bytes_total", "Bytes delivered since the topic was loaded"),
            ("pulsar_txn_tb_committed_total", "Transactions committed on the topic since it was loaded"),
            ("pulsar_txn_tb_aborted_total", "Transactions aborted on the topic since it was loaded"))}
        per_subscription = {name: GaugeMetricFamily(name, documentation, labels=_SUBSCRIPTION)
                            for name, documentation in (
            ("pulsar_subscription_back_log", "Entries not yet acknowledged"),
            ("pulsar_subscription_delayed", "Messages held back for delayed delivery"),
            ("pulsar_subscription_unacked_messages", "Messages delivered and not acknowledged (Shared, Key_Shared)"),
            ("pulsar_subscription_blocked_on_unacked_messages", "1 while held back by its unacked-messages limit"),
            ("pulsar_subscription_msg_rate_out", "Messages delivered per second (last stats interval)"),
            ("pulsar_subscription_msg_throughput_out", "Bytes delivered per second (last stats interval)"),
            ("pulsar_subscription_msg_rate_redeliver", "Messages asked for again per second (last stats interval)"),
            ("pyengine_pending_ack_positions", "Entries reserved by open transactions' acknowledgements"),
            ("pyengine_pending_ack_transactions", "Open transactions holding acknowledgements"))}

        for topic in list(self.service.topics.values()):
            labels = [cluster, topic.topic_name.namespace_name, topic.name]
            ledger, buffer = topic.ledger, topic.buffer
            buffer_stats = buffer.stats()
            # Every subscription, readers' (non-durable) ones too, as Pulsar's aggregator
            subscriptions = [(name, sub, subscription_stats(sub)) for name, sub in
                             [*topic.subscriptions.items(), *topic.non_durable_subscriptions().items()]]
            values = {
                "pulsar_storage_size": ledger.total_size,
                "pulsar_msg_backlog": sum(stats["msgBacklog"] for _, _, stats in subscriptions),
                "pulsar_subscriptions_count": len(subscriptions),
                "pulsar_producers_count": len(topic.producers),
                "pulsar_consumers_count": topic.number_of_consumers(),
                "pulsar_rate_in": topic.rate_in.msg_rate,
                "pulsar_rate_out": topic.rate_out.msg_rate,
                "pulsar_throughput_in": topic.rate_in.byte_rate,
                "pulsar_throughput_out": topic.rate_out.byte_rate,
                "pulsar_txn_tb_active_total": buffer_stats["ongoing_txn_count"],
                "pyengine_txn_read_horizon_lag_entries": ledger.entries_between(buffer.max_read_position(), ledger.lac),
                "pulsar_in_messages_total": topic.msg_in_counter,
                "pulsar_in_bytes_total": topic.bytes_in_counter,
                "pulsar_out_messages_total": topic.rate_out.msgs,
                "pulsar_out_bytes_total": topic.rate_out.bytes,
                "pulsar_txn_tb_committed_total": buffer_stats["committed_total"],
                "pulsar_txn_tb_aborted_total": buffer_stats["aborted_total"],
            }
            for name, value in values.items():
                (gauges.get(name) or counters[name]).add_metric(labels, value)
            for name, subscription, stats in subscriptions:
                pending = subscription.pending_ack.stats() if subscription.pending_ack is not None else None
                for metric, value in (
                        ("pulsar_subscription_back_log", stats["msgBacklog"]),
                        ("pulsar_subscription_delayed", stats["msgDelayed"]),
                        ("pulsar_subscription_unacked_messages", stats["unackedMessages"]),
                        ("pulsar_subscription_blocked_on_unacked_messages",
                         int(stats["blockedSubscriptionOnUnackedMsgs"])),
                        ("pulsar_subscription_msg_rate_out", stats["msgRateOut"]),
                        ("pulsar_subscription_msg_throughput_out", stats["msgThroughputOut"]),
                        ("pulsar_subscription_msg_rate_redeliver", stats["msgRateRedeliver"]),
                        ("pyengine_pending_ack_positions", pending["pending_individual_positions"] if pending else 0),
                        ("pyengine_pending_ack_transactions", len(pending["transactions"]) if pending else 0)):
                    per_subscription[metric].add_metric([*labels, name], value)
        yield from gauges.values()
        yield from counters.values()
        yield from per_subscription.values()


def metrics_registry(service: BrokerService) -> CollectorRegistry:
    """A registry of its own holding the broker's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(service))
    return registry


@routes.add("GET", METRICS_PATH, summary="Prometheus metrics of the broker (text exposition format).",
            replies={200: Reply("Metrics", {"type": "string"}, media_type="text/plain")})
async def get_metrics(call: Call) -> web.Response:
    return web.Response(body=generate_latest(call.request.app[REGISTRY]),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})
