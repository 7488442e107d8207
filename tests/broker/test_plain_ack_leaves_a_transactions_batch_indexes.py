"""A plain acknowledgement of a batch some messages of which an open transaction acknowledged
leaves those messages to the transaction (PIP-31: a message in PENDING_ACK is not deleted by a
normal ack). Found by an audit: the whole entry was acked, and the transaction's abort gave
nothing back; a whole pending entry's plain ack was already dropped."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.transaction.pendingack import IndividualAck
from tests.broker.helpers import drain, publish_batch

T = "persistent://public/default/plain-ack-of-a-txn-batch"


@pytest.mark.parametrize("plain", ["whole entry", "every index"])
async def test_the_transactions_indexes_come_back_on_abort(tmp_path, plain):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        position = await publish_batch(broker, producer, [b"m0", b"m1", b"m2", b"m3"])
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        messages = await drain(consumer)
        txn = await broker.new_transaction()
        await consumer.acknowledge(messages[1], txn=txn)
        subscription = broker.service.topics[T].subscriptions["s"]
        whole = IndividualAck(position) if plain == "whole entry" else IndividualAck(position, 4, (0,))
        await subscription.ack_individual(None, [whole])
        assert not subscription.cursor.is_acked(position)
        await txn.abort()
        again = await drain(consumer)
        assert [m.data for m in again] == [b"m1"]
        await consumer.acknowledge(again[0])
        assert subscription.cursor.is_acked(position)
