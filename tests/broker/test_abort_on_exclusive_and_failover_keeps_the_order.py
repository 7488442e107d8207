"""An aborted transaction's acknowledgements on Exclusive and Failover give the stream back in
order, as Pulsar's single-active dispatcher does (PersistentSubscription.endTxn hands the abort
to the active consumer, and redeliverUnacknowledgedMessages rewinds the cursor: "we cannot
redeliver single messages to single consumers to preserve ordering"). Found by an audit: only
the released messages came back, after later ones."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from tests.broker.helpers import drain

T = "persistent://public/default/abort-order"


@pytest.mark.parametrize("consumer_type", ["exclusive", "failover"])
@pytest.mark.parametrize("cumulative", [False, True])
async def test_an_abort_redelivers_every_unacknowledged_message_in_order(tmp_path, consumer_type, cumulative):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        for i in range(5):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(T, "s", consumer_type=consumer_type, initial_position="earliest")
        received = await drain(consumer)
        await consumer.acknowledge(received[0])
        txn = await broker.new_transaction()
        if cumulative:
            await consumer.acknowledge_cumulative(received[2], txn=txn)
        else:
            await consumer.acknowledge(received[2], txn=txn)
        await txn.abort()
        await producer.send(b"n0")
        assert [m.data for m in await drain(consumer)] == [b"m1", b"m2", b"m3", b"m4", b"n0"]


async def test_on_shared_only_the_released_messages_come_back(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        for i in range(3):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        received = await drain(consumer)
        txn = await broker.new_transaction()
        await consumer.acknowledge(received[1], txn=txn)
        await txn.abort()
        again = await drain(consumer)
        assert [m.data for m in again] == [b"m1"] and again[0].redelivery_count == 1
