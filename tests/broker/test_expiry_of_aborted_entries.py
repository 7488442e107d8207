"""Message expiry tests every stored entry not acknowledged by its publish time, markers and
entries of aborted transactions too, as Pulsar's expiry monitor reads raw entries. They used
to be passed over, so a backlog ending in them outlived every TTL, and a size quota with
producer_request_hold that they filled refused new producers for good."""

from __future__ import annotations

import asyncio
import dataclasses

from pyengine.broker import Broker
from pyengine.broker.policies import BacklogQuota
from pyengine.transaction.coordinator.clock import wall_clock_ms

T = "persistent://public/default/expiry-of-aborted"


async def _aborted_backlog(broker: Broker) -> object:
    topic = await broker.service.get_topic(T)
    await topic.open_subscription("slow")
    producer = await broker.create_producer(T)
    await producer.send(b"plain")
    txn = await broker.new_transaction()
    for _ in range(20):
        await producer.send(b"x" * 1000, txn=txn)
    await txn.abort()
    await producer.close()
    return topic


async def test_aborted_entries_and_markers_expire(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic = await _aborted_backlog(broker)
        slow = topic.subscriptions["slow"]
        assert slow.backlog() == 22
        assert await slow.expire_messages(0, wall_clock_ms() + 1)
        assert slow.backlog() == 0
        assert slow.cursor.mark_delete == topic.ledger.lac


async def test_a_marker_younger_than_the_ttl_stays_with_what_follows(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic = await _aborted_backlog(broker)
        slow = topic.subscriptions["slow"]
        marker = topic.ledger.lac
        cutoff = topic.ledger.read_entry(marker).publish_time - 1
        await slow.expire_messages(0, cutoff)
        assert slow.cursor.mark_delete < marker and slow.backlog() >= 1     # at least the marker


async def test_a_ttl_releases_a_size_quota_filled_by_an_aborted_transaction(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, message_expiry_check_interval_s=3600) as broker:
        topic = await _aborted_backlog(broker)
        policies = broker.service.policies
        namespace = policies.policies("public/default")
        await policies.set_policies("public/default", dataclasses.replace(
            namespace, message_ttl_seconds=1,
            backlog_quota_map={"destination_storage": BacklogQuota(5000).to_json()}))   # hold
        await asyncio.sleep(1.1)
        await broker.service.message_expiry.check_now()
        assert topic.subscriptions["slow"].backlog() == 0
        await broker.create_producer(T)                 # was refused: the quota stayed exceeded
