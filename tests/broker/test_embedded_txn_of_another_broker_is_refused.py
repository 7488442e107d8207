"""A send or acknowledgement given a `txn` that is no transaction of this embedded broker is
refused with a clear error, before anything is stored, as `pyengine.client` refuses a `txn` that
is not its Transaction (TypeError).

- Not a transaction at all: it failed deep inside with AttributeError (a send), or with a
  PulsarError wrapping one (an ack).
- A transaction of another embedded broker: each broker numbers its transactions alike, so its
  id named one of this broker's own: the message joined that unrelated transaction, stored or
  dropped by its end, whatever became of the transaction it was sent in (ValueError now)."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from tests.broker.helpers import drain

T = "persistent://public/default/txn-of-another-broker"


@pytest.mark.parametrize("how", ["send", "ack", "cumulative ack"])
async def test_a_transaction_of_another_broker_is_refused(tmp_path, how):
    async with Broker.embedded(tmp_path / "a") as broker, Broker.embedded(tmp_path / "b") as other:
        producer = await broker.create_producer(T)
        await producer.send(b"m0")
        consumer = await broker.subscribe(T, "s", consumer_type="failover", initial_position="earliest")
        received = await consumer.receive(timeout=5)
        own = await broker.new_transaction()
        foreign = await other.new_transaction()
        assert foreign.txn_id == own.txn_id                 # what made it join `own`
        with pytest.raises(ValueError, match="of another broker"):
            if how == "send":
                await producer.send(b"sent in the other broker's txn", txn=foreign)
            elif how == "ack":
                await consumer.acknowledge(received, txn=foreign)
            else:
                await consumer.acknowledge_cumulative(received, txn=foreign)
        await foreign.commit()
        await own.abort()
        await consumer.close()
        consumer = await broker.subscribe(T, "s", consumer_type="failover", initial_position="earliest")
        assert [m.data for m in await drain(consumer)] == [b"m0"]


@pytest.mark.parametrize("how", ["send", "ack", "cumulative ack"])
async def test_a_txn_that_is_no_transaction_is_a_type_error(tmp_path, how):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"m0")
        consumer = await broker.subscribe(T, "s", consumer_type="failover", initial_position="earliest")
        received = await consumer.receive(timeout=5)
        with pytest.raises(TypeError, match="txn must be an EmbeddedTransaction"):
            if how == "send":
                await producer.send(b"m1", txn="not a transaction")
            elif how == "ack":
                await consumer.acknowledge(received, txn=object())
            else:
                await consumer.acknowledge_cumulative(received, txn=object())
        await producer.send(b"m1")                          # the producer goes on, nothing was stored
        assert [m.data for m in await drain(consumer)] == [b"m1"]
