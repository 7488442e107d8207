"""Redelivery edges found by an audit, each now as Pulsar:

* `redeliver_unacknowledged_messages()` of an embedded consumer dropped its queued messages
  without giving their permits back, so it could stall for good (the Java client's
  increaseAvailablePermits(currentSize)).
* A negative ack by a consumer at its unacked-messages limit left it blocked: the nacked
  messages never came back while it held the others (Pulsar's
  Consumer.redeliverUnacknowledgedMessages sets blockedConsumerOnUnackedMsgs = false).
* An embedded Exclusive consumer's negative ack brought back only that message, after the
  later ones; pulsar-client (and the wire server) redeliver everything unacknowledged there,
  in order."""

from __future__ import annotations

import asyncio

from pyengine.broker import Broker

from .helpers import drain

T = "persistent://public/default/redelivery-edges"


async def test_redelivering_everything_gives_the_queued_messages_permits_back(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                          receiver_queue_size=10)
        for i in range(10):
            await producer.send(b"m%d" % i)
        await asyncio.sleep(0.1)
        for _ in range(3):
            await consumer.receive(timeout=1)              # 3 taken, 7 still queued
        await consumer.redeliver_unacknowledged_messages()
        got = await drain(consumer, timeout=0.5)
        assert sorted(m.data for m in got) == sorted(b"m%d" % i for i in range(10))


async def test_a_negative_ack_at_the_unacked_limit_gets_the_messages_again(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=10) as broker:
        producer = await broker.create_producer(T)
        for i in range(30):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                          negative_ack_redelivery_delay_ms=0)
        first = await drain(consumer)
        assert len(first) == 10                             # blocked at the limit
        for message in first[:2]:
            await consumer.negative_acknowledge(message)   # 8 held: more than half the limit
        assert [m.data for m in await drain(consumer)] == [b"m0", b"m1"]


async def test_an_exclusive_negative_ack_redelivers_everything_unacknowledged_in_order(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest", negative_ack_redelivery_delay_ms=0)
        for i in range(3):
            await producer.send(b"m%d" % i)
        first = [await consumer.receive(timeout=2) for _ in range(3)]
        await consumer.negative_acknowledge(first[0])
        assert [m.data for m in await drain(consumer)] == [b"m0", b"m1", b"m2"]


async def test_a_cumulative_ack_forgets_the_redelivery_counts_it_covers(tmp_path):
    """Found by an audit: the counts of messages acknowledged cumulatively were kept for ever
    (one per message ever redelivered on the subscription). Cumulative acks are Exclusive and
    Failover ones, which now keep no counts at all (Pulsar's single-active dispatcher has
    RedeliveryTrackerDisabled: every message comes with count 0), so none is left behind."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest", negative_ack_redelivery_delay_ms=0)
        for i in range(5):
            await producer.send(b"m%d" % i)
        received = [await consumer.receive(timeout=2) for _ in range(5)]
        await consumer.negative_acknowledge(received[0])       # all five come again
        again = [await consumer.receive(timeout=2) for _ in range(5)]
        dispatcher = broker.service.topics[T].subscriptions["s"].dispatcher
        assert [m.redelivery_count for m in again] == [0] * 5 and dispatcher.redelivery_counts == {}
        await consumer.acknowledge_cumulative(again[2])
        await consumer.acknowledge_cumulative(again[4])
        assert dispatcher.redelivery_counts == {}
