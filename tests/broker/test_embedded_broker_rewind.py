"""The embedding API: an Exclusive/Failover consumer whose subscription rewinds on its own.

When the coordinator aborts a transaction on its timeout, the subscription gives back what its
acks held and, on Exclusive/Failover, delivers everything unacknowledged again, in order, under
the consumer's current epoch: the application hears of the abort only later (its commit fails).
The copies still queued at the consumer came first, then the given-back stream, so the next
transaction took messages twice and its cumulative ack covered both copies (as the network
client did, see tests/client/test_broker_rewind_makes_held_messages_stale.py). The embedded
consumer now takes an entry at or before the last one delivered to it as the subscription's
rewind: its queued copies are dropped (they come again) and what the application holds is
stale (a transaction may not ack it cumulatively)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.errors import TransactionConflictError
from pyengine.transaction import TxnAction
from tests.broker.helpers import drain

T = "persistent://public/default/embedded-broker-rewind"


async def _given_back_and_delivered(broker, consumer, txn, first) -> None:
    """The coordinator aborts `txn` as on its timeout (the application is not told) and the
    subscription's stream comes again: wait until its first message, `first`, is back at the
    consumer (the subscription holds it as delivered to the consumer again)."""
    await broker.service.coordinator.end_transaction(txn.txn_id, TxnAction.ABORT)
    delivered = consumer._consumer.pending          # the subscription's view of the consumer
    for _ in range(200):
        if first.message_id.position in delivered:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the aborted transaction's messages were not delivered again")


async def _subscribed_with_ten_messages(broker, consumer_type):
    producer = await broker.create_producer(T)
    for i in range(10):
        await producer.send(b"m%d" % i)
    return await broker.subscribe(T, "s", consumer_type=consumer_type, initial_position="earliest")


@pytest.mark.parametrize("consumer_type", ["exclusive", "failover"])
async def test_a_rewind_of_the_subscription_drops_the_queued_copies(tmp_path, consumer_type):
    async with Broker.embedded(tmp_path) as broker:
        consumer = await _subscribed_with_ten_messages(broker, consumer_type)
        taken = [await consumer.receive(timeout=5) for _ in range(3)]
        txn = await broker.new_transaction()
        await consumer.acknowledge_cumulative(taken[-1], txn=txn)
        await _given_back_and_delivered(broker, consumer, txn, taken[0])
        # The stream once, in order: not m3..m9 (queued before the rewind), then m0..m9.
        assert [m.data for m in await drain(consumer)] == [b"m%d" % i for i in range(10)]


@pytest.mark.parametrize("consumer_type", ["exclusive", "failover"])
async def test_a_cumulative_ack_covering_messages_held_across_a_rewind_is_a_conflict(tmp_path, consumer_type):
    async with Broker.embedded(tmp_path) as broker:
        consumer = await _subscribed_with_ten_messages(broker, consumer_type)
        first = [await consumer.receive(timeout=5) for _ in range(3)]
        timed_out = await broker.new_transaction()
        await consumer.acknowledge_cumulative(first[-1], txn=timed_out)
        held = await consumer.receive(timeout=5)      # m3: taken by the next transaction's processor
        assert held.data == b"m3"
        await _given_back_and_delivered(broker, consumer, timed_out, first[0])
        # m3 comes again: an ack in a transaction that covers the copy taken before would let
        # the transaction after it take the new copy and process it a second time.
        txn = await broker.new_transaction()
        with pytest.raises(TransactionConflictError):
            await consumer.acknowledge_cumulative(held, txn=txn)
        # as any failed ack of a transaction: its commit aborts it and raises the failure
        with pytest.raises(TransactionConflictError):
            await txn.commit()
        assert txn.state == "aborted"
        again = await drain(consumer)
        assert [m.data for m in again] == [b"m%d" % i for i in range(10)]
        # The copies delivered since the rewind are the application's to ack in a transaction.
        txn = await broker.new_transaction()
        await consumer.acknowledge_cumulative(again[-1], txn=txn)
        await txn.commit()
        assert broker.service.topics[T].subscriptions["s"].backlog() == 0


async def test_a_cumulative_ack_outside_a_transaction_is_not_refused(tmp_path):
    """As the network client: only a transaction's cumulative ack is refused (one outside a
    transaction acknowledges nothing that the next one would take and process again)."""
    async with Broker.embedded(tmp_path) as broker:
        consumer = await _subscribed_with_ten_messages(broker, "exclusive")
        first = [await consumer.receive(timeout=5) for _ in range(3)]
        timed_out = await broker.new_transaction()
        await consumer.acknowledge_cumulative(first[-1], txn=timed_out)
        held = await consumer.receive(timeout=5)
        await _given_back_and_delivered(broker, consumer, timed_out, first[0])
        await consumer.acknowledge_cumulative(held)
        assert broker.service.topics[T].subscriptions["s"].backlog() == 6          # m4..m9
        # the copies delivered since the rewind, once (m0..m3 were delivered before the ack)
        assert [m.data for m in await drain(consumer)] == [b"m%d" % i for i in range(10)]
