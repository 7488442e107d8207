"""The acks of a transaction on one subscription share its ADD_SUBSCRIPTION_TO_TXN. A caller
that cancels its own ack must not cancel that registration: the other acks, cancelled by
nobody, go through (found by an audit: they ended with CancelledError, their tasks cancelled,
as the Java client's per-caller futures never do)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.protocol import pulsar_api_pb2 as pb
from tests.client.conftest import answer_late

TOPIC = "persistent://public/default/cancelled-txn-ack"


async def test_cancelling_one_transactional_ack_leaves_the_others_of_the_transaction_alone(client, monkeypatch):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "s", consumer_type="shared", initial_position="earliest")
    for data in (b"a", b"b"):
        await producer.send(data)
    first, second = [await consumer.receive(timeout=5) for _ in range(2)]
    txn = await client.new_transaction()
    answer_late(monkeypatch, 0.5, lambda cmd: cmd.type == pb.BaseCommand.ADD_SUBSCRIPTION_TO_TXN)
    other_ack = asyncio.ensure_future(consumer.acknowledge(second, txn))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(consumer.acknowledge(first, txn), 0.1)
    await asyncio.wait_for(other_ack, 5)                 # neither cancelled nor failed
    assert not other_ack.cancelled()
