"""Exclusive and Failover redeliveries carry redelivery count 0, as Pulsar's single-active
dispatcher (PersistentDispatcherSingleActiveConsumer: RedeliveryTrackerDisabled) sends them.
Found by an audit: redeliver_unacknowledged_messages and negative acks raised the count there,
so a client's dead-letter policy moved, or (the official client) stranded, the message."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker

from .helpers import drain

T = "persistent://public/default/single-active-counts"


@pytest.mark.parametrize("consumer_type", ["exclusive", "failover"])
async def test_redeliveries_of_the_active_consumer_carry_no_count(tmp_path, consumer_type):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type=consumer_type, initial_position="earliest",
                                          negative_ack_redelivery_delay_ms=0)
        for i in range(3):
            await producer.send(b"m%d" % i)
        assert [m.redelivery_count for m in await drain(consumer)] == [0, 0, 0]
        await consumer.redeliver_unacknowledged_messages()
        again = await drain(consumer)
        assert [(m.data, m.redelivery_count) for m in again] == [(b"m0", 0), (b"m1", 0), (b"m2", 0)]
        await consumer.negative_acknowledge(again[0])
        assert [(m.data, m.redelivery_count) for m in await drain(consumer)] == [(b"m0", 0), (b"m1", 0), (b"m2", 0)]


async def test_shared_redeliveries_still_count(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                          negative_ack_redelivery_delay_ms=0)
        await producer.send(b"m0")
        await consumer.negative_acknowledge(await consumer.receive(timeout=2))
        assert (await consumer.receive(timeout=2)).redelivery_count == 1


async def test_a_subscription_that_becomes_failover_forgets_its_shared_counts(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        shared = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                        negative_ack_redelivery_delay_ms=0)
        await producer.send(b"m0")
        await shared.negative_acknowledge(await shared.receive(timeout=2))
        assert (await shared.receive(timeout=2)).redelivery_count == 1
        await shared.close()
        failover = await broker.subscribe(T, "s", consumer_type="failover")
        assert [(m.data, m.redelivery_count) for m in await drain(failover)] == [(b"m0", 0)]
