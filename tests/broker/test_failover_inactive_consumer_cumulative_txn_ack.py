"""A Failover consumer that is no longer the active one may not ack cumulatively in a transaction.

When another consumer becomes the active one, what the previous one holds unacknowledged goes to
it, in order (the cursor's rewind). The previous one's application may still hold those messages
and ack one cumulatively in a transaction: accepted (as in Pulsar), the active consumer, which
processes the same messages, acked a later one cumulatively, the request leaving out what the
cursor already acknowledged, and both transactions committed the same messages (exactly-once
broken). An individual ack names each message and conflicts by itself; a cumulative one does
not, so the broker refuses it from a consumer that is not active: the transaction aborts and
the active consumer's processing stands."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.client import Client, MessageId
from pyengine.errors import TransactionConflictError
from tests.broker.helpers import drain
from tests.client.conftest import NetworkBroker

TOPIC = "persistent://public/default/failover-inactive-cumulative"


@pytest.fixture
async def broker(tmp_path):
    async with NetworkBroker(tmp_path / "data", num_coordinators=1,
                             active_consumer_failover_delay_time_ms=0) as network_broker:
        yield network_broker


async def _handed_over(client, messages: int, take: int):
    """`messages` published; the consumer of priority 1 takes `take` of them, then one of
    priority 0 subscribes and is handed them (either API: the network client or the
    embedding one). Returns (previous, what it took, active)."""
    producer = await client.create_producer(TOPIC)
    for i in range(messages):
        await producer.send(b"m%d" % i)
    previous = await client.subscribe(TOPIC, "s", consumer_type="failover", initial_position="earliest",
                                      priority=1)
    taken = [await previous.receive(timeout=5) for _ in range(take)]
    active = await client.subscribe(TOPIC, "s", consumer_type="failover", initial_position="earliest",
                                    priority=0)
    return previous, taken, active


async def test_the_previous_active_consumers_cumulative_ack_is_refused(broker):
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        previous, taken, active = await _handed_over(client, 7, 4)
        stream = [await active.receive(timeout=5) for _ in range(7)]
        assert [m.data for m in stream] == [b"m%d" % i for i in range(7)]     # handed over, in order
        txn = await client.new_transaction()
        with pytest.raises(TransactionConflictError, match="not the active"):
            await previous.acknowledge_cumulative(taken[-1], txn=txn)
        with pytest.raises(TransactionConflictError):
            await txn.commit()
        txn = await client.new_transaction()
        await active.acknowledge_cumulative(stream[-1], txn=txn)
        await txn.commit()
        # an individual ack of the inactive consumer still conflicts by itself (acked already)
        txn = await client.new_transaction()
        with pytest.raises(TransactionConflictError):
            await previous.acknowledge(taken[0], txn=txn)
        await txn.abort()
        await previous.close()
        assert await drain(active, 0.3) == []


async def test_the_embedding_apis_previous_active_consumer_is_refused_too(tmp_path):
    async with Broker.embedded(tmp_path, active_consumer_failover_delay_time_ms=0) as broker:
        previous, taken, active = await _handed_over(broker, 3, 2)
        assert [m.data for m in await drain(active, 0.3)] == [b"m0", b"m1", b"m2"]
        txn = await broker.new_transaction()
        with pytest.raises(TransactionConflictError, match="not the active"):
            await previous.acknowledge_cumulative(taken[-1], txn=txn)
            await txn.commit()


async def test_a_seek_makes_what_the_consumer_is_sent_again_fresh(tmp_path):
    """Handed over and back, the consumer's copies went stale; a seek sends the stream again
    from the cursor, so acking the new copies cumulatively is accepted, as over the network
    (where a seek disconnects the consumer and a new one subscribes)."""
    async with Broker.embedded(tmp_path, active_consumer_failover_delay_time_ms=0) as broker:
        previous, taken, active = await _handed_over(broker, 5, 1)
        assert [m.data for m in await drain(active, 0.3)] == [b"m%d" % i for i in range(5)]
        await active.close()                                    # back to the first one
        await previous.seek(MessageId.earliest)
        again = await drain(previous, 0.3)
        assert [m.data for m in again] == [b"m%d" % i for i in range(5)]
        txn = await broker.new_transaction()
        await previous.acknowledge_cumulative(again[-1], txn=txn)
        await txn.commit()
