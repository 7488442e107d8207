"""`/metrics`: Prometheus text that prometheus-client's parser reads, with figures that move as
transactions run on the broker."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

OUT = "persistent://public/default/out"
IN = "persistent://public/default/in"


async def scrape(api) -> dict[str, dict[tuple, float]]:
    """metric sample name -> {sorted label items: value}"""
    reply = await api.get("/metrics")
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/plain")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(reply.body):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    wanted = {"cluster": "standalone", **labels}
    matches = [v for key, v in samples.get(name, {}).items() if all(dict(key).get(k) == w for k, w in wanted.items())]
    assert len(matches) == 1, f"{name}{labels}: {samples.get(name)}"
    return matches[0]


async def test_transaction_counters_and_latency_move(api, client):
    before = await scrape(api)
    for name in ("pulsar_txn_created_total", "pulsar_txn_committed_total", "pulsar_txn_aborted_total",
                 "pulsar_txn_timeout_total", "pyengine_txn_end_latency_seconds_count"):
        assert value(before, name) == 0
    assert value(before, "pulsar_txn_active_count", coordinator_id="0") == 0

    producer = await client.create_producer(OUT)
    for outcome in ("commit", "commit", "abort"):
        txn = await client.new_transaction()
        await producer.send(b"x", txn=txn)
        await (txn.commit() if outcome == "commit" else txn.abort())
    held_open = await client.new_transaction()

    after = await scrape(api)
    assert value(after, "pulsar_txn_created_total") == 4
    assert value(after, "pulsar_txn_committed_total") == 2
    assert value(after, "pulsar_txn_aborted_total") == 1
    assert sum(value(after, "pulsar_txn_active_count", coordinator_id=c) for c in ("0", "1")) == 1
    assert value(after, "pyengine_txn_count", state="COMMITTED") == 2
    assert value(after, "pyengine_txn_count", state="ABORTED") == 1
    assert value(after, "pyengine_txn_count", state="OPEN") == 1
    assert value(after, "pyengine_txn_end_latency_seconds_count") == 3
    assert value(after, "pyengine_txn_end_latency_seconds_bucket", le="+Inf") == 3
    assert value(after, "pyengine_txn_end_latency_seconds_sum") > 0
    buckets = sorted((float(dict(k)["le"]), v) for k, v in after["pyengine_txn_end_latency_seconds_bucket"].items())
    assert [count for _, count in buckets] == sorted(count for _, count in buckets)    # cumulative
    assert value(after, "pulsar_txn_tb_committed_total", topic=OUT) == 2
    assert value(after, "pulsar_txn_tb_aborted_total", topic=OUT) == 1
    assert value(after, "pulsar_in_messages_total", topic=OUT, namespace="public/default") == 3
    await held_open.abort()


async def test_v5_transactions_are_counted_with_v4s(api, client):
    # Found by an audit: the counters and the END_TXN histogram left out v5 transactions
    # (PIP-473: the existing transaction metrics remain).
    for outcome in ("commit", "abort"):
        txn = await client.new_transaction(version=5)
        await (txn.commit() if outcome == "commit" else txn.abort())
    v4 = await client.new_transaction()
    await v4.commit()
    after = await scrape(api)
    assert value(after, "pulsar_txn_created_total") == 3
    assert value(after, "pulsar_txn_committed_total") == 2
    assert value(after, "pulsar_txn_aborted_total") == 1
    assert value(after, "pyengine_txn_end_latency_seconds_count") == 3
    assert value(after, "pyengine_txn_end_latency_seconds_bucket", le="+Inf") == 3


async def test_timeouts_are_counted(api, client):
    await client.new_transaction(timeout_ms=30)
    for _ in range(200):
        samples = await scrape(api)
        if value(samples, "pulsar_txn_timeout_total") == 1:
            break
        await asyncio.sleep(0.02)
    assert value(samples, "pulsar_txn_timeout_total") == 1
    assert value(samples, "pulsar_txn_aborted_total") == 1        # a timed-out txn is aborted, as in Pulsar
    assert value(samples, "pyengine_txn_count", state="TIME_OUT") == 1


async def test_read_horizon_lag_and_pending_acks(api, client):
    producer = await client.create_producer(OUT)
    txn = await client.new_transaction()
    await producer.send(b"in txn", txn=txn)
    await producer.send(b"plain")
    await producer.send(b"plain")
    source = await client.create_producer(IN)
    for _ in range(2):
        await source.send(b"input")
    consumer = await client.subscribe(IN, "sub", initial_position="earliest", consumer_name="c")
    for _ in range(2):
        await consumer.acknowledge(await consumer.receive(timeout=5), txn=txn)

    samples = await scrape(api)
    assert value(samples, "pyengine_txn_read_horizon_lag_entries", topic=OUT) == 3
    assert value(samples, "pulsar_txn_tb_active_total", topic=OUT) == 1
    assert value(samples, "pyengine_pending_ack_positions", topic=IN, subscription="sub") == 2
    assert value(samples, "pyengine_pending_ack_transactions", topic=IN, subscription="sub") == 1
    assert value(samples, "pulsar_subscription_back_log", topic=IN, subscription="sub") == 2
    assert value(samples, "pulsar_consumers_count", topic=IN) == 1
    assert value(samples, "pulsar_producers_count", topic=OUT) == 1
    assert value(samples, "pulsar_subscriptions_count", topic=IN) == 1
    assert value(samples, "pulsar_storage_size", topic=OUT) > 0

    await txn.commit()
    samples = await scrape(api)
    assert value(samples, "pyengine_txn_read_horizon_lag_entries", topic=OUT) == 0
    assert value(samples, "pulsar_txn_tb_active_total", topic=OUT) == 0
    assert value(samples, "pyengine_pending_ack_positions", topic=IN, subscription="sub") == 0
    assert value(samples, "pulsar_subscription_back_log", topic=IN, subscription="sub") == 0
    assert value(samples, "pulsar_msg_backlog", topic=IN) == 0


async def test_metrics_stay_out_of_the_default_registry(api):
    await scrape(api)
    assert REGISTRY.get_sample_value("pulsar_txn_created_total", {"cluster": "standalone"}) is None
