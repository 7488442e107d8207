"""pyengine.client: an Exclusive/Failover consumer whose broker rewinds on its own.

When the coordinator aborts a transaction on its timeout, the subscription gives back what its
acks held and, on Exclusive/Failover, sends everything unacknowledged again, in order, under
the consumer's current epoch: the client hears of the abort only later (its commit fails). Found
by the soak's cumulative exactly-once pipeline (a value output by two committed transactions):
the copies still queued came first, then the given-back stream, so the next transaction took
messages twice and its cumulative ack covered both copies. The client now takes an entry at or
before the last one it got as the broker's rewind: its queued copies are dropped (they come
again) and what the application holds is stale, as after a reconnect."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import TransactionConflictError
from pyengine.transaction import TxnAction
from tests.broker.helpers import drain
from tests.client.conftest import broker, client  # noqa: F401  (fixtures)

TOPIC = "persistent://public/default/broker-rewind"


async def _given_back_and_delivered(consumer, broker, txn) -> None:
    """The coordinator aborts `txn` as on its timeout (the client is not told) and the
    subscription's stream comes again: wait until its first entry is back at the client."""
    handler = next(iter(consumer._handlers.values()))
    before = handler.held.stale
    await broker.service.coordinator.end_transaction(txn.txn_id, TxnAction.ABORT)
    for _ in range(200):
        if handler.held.stale is not before or handler.queued >= 10:
            return
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("consumer_type", ["exclusive", "failover"])
async def test_a_rewind_of_the_broker_drops_the_queued_copies(client, broker, consumer_type):
    producer = await client.create_producer(TOPIC)
    for i in range(10):
        await producer.send(b"m%d" % i)
    consumer = await client.subscribe(TOPIC, "s", consumer_type=consumer_type, initial_position="earliest")
    taken = [await consumer.receive(timeout=5) for _ in range(3)]
    txn = await client.new_transaction()
    await consumer.acknowledge_cumulative(taken[-1], txn=txn)
    await asyncio.sleep(0.1)                      # m3..m9 queued at the client
    await _given_back_and_delivered(consumer, broker, txn)
    # The stream once, in order: not m3..m9 (queued before the rewind), then m0..m9.
    assert [m.data for m in await drain(consumer, 0.3)] == [b"m%d" % i for i in range(10)]


async def test_a_cumulative_ack_covering_messages_held_across_a_rewind_is_a_conflict(client, broker):
    producer = await client.create_producer(TOPIC)
    for i in range(10):
        await producer.send(b"m%d" % i)
    consumer = await client.subscribe(TOPIC, "s", consumer_type="failover", initial_position="earliest")
    first = [await consumer.receive(timeout=5) for _ in range(3)]
    timed_out = await client.new_transaction()
    await consumer.acknowledge_cumulative(first[-1], txn=timed_out)
    held = await consumer.receive(timeout=5)      # m3: taken by the next transaction's processor
    assert held.data == b"m3"
    await _given_back_and_delivered(consumer, broker, timed_out)
    # m3 comes again: an ack in a transaction that covers the copy taken before would let the
    # transaction after it take the new copy and process it a second time.
    txn = await client.new_transaction()
    with pytest.raises(TransactionConflictError):
        await consumer.acknowledge_cumulative(held, txn=txn)
    await txn.abort()
    assert [m.data for m in await drain(consumer, 0.3)] == [b"m%d" % i for i in range(10)]
