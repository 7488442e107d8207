"""Backlog quotas (Pulsar's BacklogQuotaManager): past a destination_storage (bytes) or
message_age (seconds) quota, a producer_request_hold / producer_exception policy refuses new
producers, and consumer_backlog_eviction moves the slowest subscriptions forward, never past
the read horizon of an open transaction. No quota by default (-1)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from pyengine.broker import Broker
from pyengine.broker.backlog_quota import REFUSED, backlog_size
from pyengine.errors import ProducerBlockedQuotaExceededError, ProducerBlockedQuotaExceededException
from pyengine.broker.policies import BacklogQuota
from pyengine.transaction.coordinator.clock import wall_clock_ms

from tests.broker.helpers import drain

T = "persistent://public/default/backlog-quota"
PAYLOAD = b"x" * 100


async def _fill(broker, count: int, subscriptions=("slow",)):
    topic = await broker.service.get_topic(T)
    for name in subscriptions:
        await topic.open_subscription(name)               # no consumer: a backlog builds up
    producer = await broker.create_producer(T)
    for _ in range(count):
        await producer.send(PAYLOAD)
    return producer


async def _set_namespace_quota(broker, quota_type: str, quota: BacklogQuota) -> None:
    policies = broker.service.policies
    namespace = policies.policies("public/default")
    await policies.set_policies("public/default", dataclasses.replace(
        namespace, backlog_quota_map={**(namespace.backlog_quota_map or {}), quota_type: quota.to_json()}))


async def test_no_quota_by_default(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await _fill(broker, 50)
        await broker.create_producer(T)
        await broker.service.backlog_quotas.check_now()
        assert broker.service.topics[T].subscriptions["slow"].backlog() == 50


async def test_size_quota_with_producer_request_hold_refuses_new_producers_until_consumed(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await _fill(broker, 1)
        topic = broker.service.topics[T]
        entry_size = backlog_size(topic)
        await _set_namespace_quota(broker, "destination_storage", BacklogQuota(10 * entry_size))   # hold by default
        for _ in range(8):
            await producer.send(PAYLOAD)
        await broker.create_producer(T)                    # 9 entries: under the limit
        await producer.send(PAYLOAD)                       # the 10th reaches it
        with pytest.raises(ProducerBlockedQuotaExceededError, match=f"^{REFUSED}$"):
            await broker.create_producer(T, send_timeout_ms=100)
        await broker.service.backlog_quotas.check_now()    # hold: nothing is evicted
        assert topic.subscriptions["slow"].backlog() == 10
        consumer = await broker.subscribe(T, "slow")
        for message in (await drain(consumer))[:2]:
            await consumer.acknowledge(message)
        await broker.create_producer(T)


async def test_size_quota_with_producer_exception_refuses_with_the_exception(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await _set_namespace_quota(broker, "destination_storage", BacklogQuota(500, -1, "producer_exception"))
        await _fill(broker, 5)
        with pytest.raises(ProducerBlockedQuotaExceededException, match=f"^{REFUSED}$"):
            await broker.create_producer(T)
        # A topic policy overrides the namespace's: no size limit there.
        await broker.service.policies.set_topic_policy(
            T, "backLogQuotaMap", {"destination_storage": BacklogQuota(-1, -1, "producer_exception").to_json()})
        await broker.create_producer(T)


async def test_an_open_transactions_entries_are_not_counted(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, backlog_quota_default_limit_bytes=300) as broker:
        producer = await _fill(broker, 0)
        txn = await broker.new_transaction()
        for _ in range(5):
            await producer.send(PAYLOAD, txn=txn)
        await broker.create_producer(T)                    # not readable yet: no backlog
        await txn.commit()
        with pytest.raises(ProducerBlockedQuotaExceededError):
            await broker.create_producer(T, send_timeout_ms=100)


async def test_a_backlog_without_subscriptions_is_no_backlog(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, backlog_quota_default_limit_bytes=100) as broker:
        await _fill(broker, 5, subscriptions=())
        await broker.create_producer(T)


async def test_eviction_moves_the_slowest_subscription_down_to_90_percent(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, backlog_quota_default_limit_bytes=2000,
                               backlog_quota_default_retention_policy="consumer_backlog_eviction") as broker:
        await _fill(broker, 40, subscriptions=("slow", "fast"))
        fast = await broker.subscribe(T, "fast")
        for message in await drain(fast):
            await fast.acknowledge(message)
        topic = broker.service.topics[T]
        await broker.create_producer(T)                    # eviction does not refuse producers
        assert backlog_size(topic) > 2000
        await broker.service.backlog_quotas.check_now()
        assert 0 < backlog_size(topic) <= 0.9 * 2000
        slow = topic.subscriptions["slow"]
        assert 0 < slow.backlog() < 40
        consumer = await broker.subscribe(T, "slow")       # it receives the newest messages
        assert len(await drain(consumer)) == slow.backlog()


async def test_eviction_never_passes_an_open_transactions_entries(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, backlog_quota_default_limit_bytes=100,
                               backlog_quota_default_retention_policy="consumer_backlog_eviction") as broker:
        producer = await _fill(broker, 5)
        txn = await broker.new_transaction()
        await producer.send(b"in-txn", txn=txn)
        for _ in range(5):
            await producer.send(PAYLOAD)
        topic = broker.service.topics[T]
        horizon = topic.buffer.max_read_position()
        await broker.service.backlog_quotas.check_now()
        slow = topic.subscriptions["slow"]
        assert slow.cursor.mark_delete == horizon          # the 5 before the transaction went
        await txn.commit()
        consumer = await broker.subscribe(T, "slow")
        received = [m.data for m in await drain(consumer)]
        assert received == [b"in-txn"] + [PAYLOAD] * 5
        await broker.service.backlog_quotas.check_now()    # once readable, they may go too
        assert backlog_size(topic) <= 90


async def test_eviction_counts_an_aborted_transactions_entries_as_pulsar_skips_them(tmp_path):
    """The backlog the skip is computed from counts the aborted entries and their marker, so
    the skip counts them too (Pulsar's skipEntries): it used to skip that many messages, and
    took every message queued behind a large aborted transaction."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic = await broker.service.get_topic(T)
        await topic.open_subscription("slow")
        producer = await broker.create_producer(T)
        txn = await broker.new_transaction()
        for _ in range(20):
            await producer.send(b"x" * 1000, txn=txn)
        await txn.abort()
        for i in range(10):
            await producer.send(b"small-%d" % i)
        slow = topic.subscriptions["slow"]
        assert slow.backlog() == 31 and backlog_size(topic) > 20_000
        await _set_namespace_quota(broker, "destination_storage",
                                   BacklogQuota(5000, policy="consumer_backlog_eviction"))
        await broker.service.backlog_quotas.check_now()
        # 25 entries of 31 over the target: the 20 aborted, the marker and 4 messages.
        consumer = await broker.subscribe(T, "slow")
        assert [m.data for m in await drain(consumer)] == [b"small-%d" % i for i in range(4, 10)]


async def test_message_age_quota_refuses_producers_and_evicts(tmp_path):
    offset = [0]
    async with Broker.embedded(tmp_path, sync=False, clock=lambda: wall_clock_ms() + offset[0]) as broker:
        await _set_namespace_quota(broker, "message_age", BacklogQuota(-1, 10, "producer_request_hold"))
        await _fill(broker, 3)
        await broker.create_producer(T)                    # the messages are not 10 s old yet
        offset[0] = 11_000
        with pytest.raises(ProducerBlockedQuotaExceededError, match=f"^{REFUSED}$"):
            await broker.create_producer(T, send_timeout_ms=100)
        await _set_namespace_quota(broker, "message_age", BacklogQuota(-1, 10, "consumer_backlog_eviction"))
        topic = broker.service.topics[T]
        await broker.service.backlog_quotas.check_now()
        assert topic.subscriptions["slow"].backlog() == 0


async def test_message_age_eviction_keeps_an_open_transactions_entries(tmp_path):
    offset = [0]
    async with Broker.embedded(tmp_path, sync=False, clock=lambda: wall_clock_ms() + offset[0]) as broker:
        await _set_namespace_quota(broker, "message_age", BacklogQuota(-1, 10, "consumer_backlog_eviction"))
        producer = await _fill(broker, 2)
        txn = await broker.new_transaction()
        await producer.send(b"in-txn", txn=txn)
        await producer.send(PAYLOAD)
        offset[0] = 11_000
        topic = broker.service.topics[T]
        horizon = topic.buffer.max_read_position()
        await broker.service.backlog_quotas.check_now()
        assert topic.subscriptions["slow"].cursor.mark_delete == horizon
        await txn.commit()
        consumer = await broker.subscribe(T, "slow")
        assert [m.data for m in await drain(consumer)] == [b"in-txn", PAYLOAD]


def test_bad_broker_defaults_are_refused(tmp_path):
    from pyengine.broker.service import BrokerConfig
    with pytest.raises(ValueError, match="policy must be one of"):
        BrokerConfig(tmp_path, backlog_quota_default_retention_policy="drop")
    with pytest.raises(ValueError, match="limitSize"):
        BrokerConfig(tmp_path, backlog_quota_default_limit_bytes=-5)
    with pytest.raises(ValueError, match="backlog_quota_check_interval_s"):
        BrokerConfig(tmp_path, backlog_quota_check_interval_s=0)


def _serve_config(tmp_path, *argv: str):
    import argparse

    from pyengine.cli import serve
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers(dest="command"))
    return serve.broker_config(parser.parse_args(["serve", "--data-dir", str(tmp_path), *argv]))


def test_the_serve_flags_are_the_brokers_default_quota(tmp_path):
    default = _serve_config(tmp_path)
    assert default.backlog_quota_default() == BacklogQuota(-1, -1, "producer_request_hold")
    assert default.backlog_quota_check_interval_s == 60
    config = _serve_config(tmp_path, "--backlog-quota-default-limit-bytes", "1000",
                           "--backlog-quota-default-limit-second", "30",
                           "--backlog-quota-default-retention-policy", "consumer_backlog_eviction",
                           "--backlog-quota-check-interval-seconds", "5")
    assert config.backlog_quota_default() == BacklogQuota(1000, 30, "consumer_backlog_eviction")
    assert config.backlog_quota_check_interval_s == 5
    for bad in (("--backlog-quota-default-limit-bytes", "-2"), ("--backlog-quota-default-retention-policy", "drop"),
                ("--backlog-quota-check-interval-seconds", "0")):
        with pytest.raises(SystemExit):
            _serve_config(tmp_path, *bad)


async def test_the_periodic_check_evicts_on_its_own(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, backlog_quota_default_limit_bytes=100,
                               backlog_quota_default_retention_policy="consumer_backlog_eviction",
                               backlog_quota_check_interval_s=0.05) as broker:
        await _fill(broker, 5)
        rounds = broker.service.backlog_quotas.rounds
        while broker.service.backlog_quotas.rounds < rounds + 2:      # a whole round after the sends
            await asyncio.sleep(0.01)
        assert broker.service.topics[T].subscriptions["slow"].backlog() == 0
