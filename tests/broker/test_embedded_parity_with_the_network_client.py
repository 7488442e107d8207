"""The embedded API as the network client behaves (found by a differential audit of the two):
each test is a case where they differed, the network side being Apache Pulsar's."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.client import CumulativeAcknowledgementNotAllowedError
from pyengine.client.message import MessageId
from pyengine.errors import InvalidTxnStatusError, MetadataError, NotAllowedError, PulsarError
from tests.broker.helpers import SHORT_TXN_TIMEOUT_MS, drain, timed_out

T = "persistent://public/default/parity"


async def test_an_ack_in_a_timed_out_transaction_is_refused_and_its_message_comes_back(tmp_path):
    """Before, the subscription's registration was taken once: a later ack of the timed-out
    (aborted) transaction was reserved, and its message never came back."""
    async with Broker.embedded(tmp_path, num_coordinators=1) as broker:
        producer = await broker.create_producer(T)
        for payload in (b"a", b"b"):
            await producer.send(payload)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        first, second = await consumer.receive(5), await consumer.receive(5)
        txn = await broker.new_transaction(timeout_ms=SHORT_TXN_TIMEOUT_MS)
        await consumer.acknowledge(first, txn=txn)
        await timed_out(txn)                            # past its timeout: aborted by the coordinator
        with pytest.raises(InvalidTxnStatusError):
            await consumer.acknowledge(second, txn=txn)
        txn.state = "open"                              # as a client that missed its own timer would
        with pytest.raises(InvalidTxnStatusError):
            await consumer.acknowledge(second, txn=txn)
        await consumer.redeliver_unacknowledged_messages()
        assert sorted(m.data for m in await drain(consumer, 1.0)) == [b"a", b"b"]


async def test_a_transaction_past_its_timeout_refuses_everything_and_aborts_quietly(tmp_path):
    async with Broker.embedded(tmp_path, num_coordinators=1) as broker:
        producer = await broker.create_producer(T)
        txn = await broker.new_transaction(timeout_ms=SHORT_TXN_TIMEOUT_MS)
        await producer.send(b"in time", txn=txn)
        await timed_out(txn)
        with pytest.raises(InvalidTxnStatusError, match="timed out"):
            await producer.send(b"late", txn=txn)
        with pytest.raises(InvalidTxnStatusError, match="timed out"):
            await txn.commit()
        await txn.abort()                               # the coordinator aborted it already
        assert txn.state == "aborted"


async def test_a_send_on_a_closed_producer_fails_its_transactions_commit(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        txn = await broker.new_transaction()
        await producer.send(b"kept out", txn=txn)
        await producer.close()
        with pytest.raises(PulsarError):
            await producer.send(b"never sent", txn=txn)
        with pytest.raises(PulsarError, match="closed"):
            await txn.commit()                          # aborted instead
        assert txn.state == "aborted"
        assert await drain(consumer, 0.5) == []


@pytest.mark.parametrize(("fields", "error"), [
    ({"sequence_id": 1 << 64}, ValueError), ({"sequence_id": 1 << 63}, ValueError), ({"sequence_id": -1}, ValueError),
    ({"key": 7}, TypeError), ({"properties": {"k": 1}}, TypeError), ({"event_time": -5}, ValueError),
])
async def test_bad_send_fields_are_refused_and_the_producer_goes_on(tmp_path, fields, error):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"before")
        with pytest.raises(error):
            await producer.send(b"bad", **fields)
        assert producer.last_sequence_id == 0
        await producer.send(b"after")
        assert producer.last_sequence_id == 1


async def test_an_unsubscribe_refused_for_other_consumers_keeps_the_consumer_open(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        first = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        other = await broker.subscribe(T, "s", consumer_type="shared")
        with pytest.raises(MetadataError, match="shared consumer attempting to unsubscribe"):
            await first.unsubscribe()
        await other.close()
        await producer.send(b"still here")
        assert (await first.receive(5)).data == b"still here"
        await first.unsubscribe()
        assert "s" not in broker.service.topics[T].subscriptions


async def test_a_cumulative_ack_on_shared_is_refused_with_its_own_error_first(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"m")
        for kind in ("shared", "key_shared"):
            consumer = await broker.subscribe(T, kind, consumer_type=kind, initial_position="earliest")
            message = await consumer.receive(5)
            with pytest.raises(CumulativeAcknowledgementNotAllowedError):
                await consumer.acknowledge_cumulative(message)
            await consumer.close()
            with pytest.raises(CumulativeAcknowledgementNotAllowedError):      # before "closed"
                await consumer.acknowledge_cumulative(message)
            assert issubclass(CumulativeAcknowledgementNotAllowedError, NotAllowedError)


async def test_a_readers_negative_ack_waits_the_default_delay(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"m")
        reader = await broker.create_reader(T, MessageId.earliest)
        message = await reader.read_next(5)
        await reader.negative_acknowledge(message)
        with pytest.raises(TimeoutError):
            await reader.read_next(0.5)                 # not at once (60 s, as the network reader)
        await reader.close()
