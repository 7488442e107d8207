"""An embedded consumer refuses to acknowledge (or negatively acknowledge) a message of another
topic, as `pyengine.client` and pulsar-client-cpp do (ValueError): a received message's id names
its topic, and taken here it (n)acked whatever sits at its position on this topic. Ledger ids are
broker-wide, so another topic's id can fall between this topic's ledgers: acked cumulatively, it
took this topic's messages before it, never received."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.storage import ManagedLedgerConfig
from tests.broker.helpers import drain

A = "persistent://public/default/acked-by-mistake"
B = "persistent://public/default/acked-on"


@pytest.mark.parametrize("how", ["cumulative", "individual", "negative", "cumulative in a txn", "in a txn"])
async def test_a_message_of_another_topic_is_refused_and_takes_nothing(tmp_path, how):
    async with Broker.embedded(tmp_path, ledger=ManagedLedgerConfig(max_entries_per_ledger=2)) as broker:
        on_b = await broker.create_producer(B)
        on_a = await broker.create_producer(A)
        b0 = await on_b.send(b"b0")
        await on_b.send(b"b1")
        a0 = await on_a.send(b"a0")
        b2 = await on_b.send(b"b2")                 # B's next ledger: A's lies between B's two
        assert b0.ledger_id < a0.ledger_id < b2.ledger_id
        of_a = await (await broker.subscribe(A, "s", initial_position="earliest")).receive(timeout=5)
        consumer = await broker.subscribe(B, "s", consumer_type="failover", initial_position="earliest",
                                          negative_ack_redelivery_delay_ms=0)
        assert (await consumer.receive(timeout=5)).data == b"b0"
        txn = await broker.new_transaction() if "txn" in how else None
        with pytest.raises(ValueError, match="is of persistent://public/default/acked-by-mistake"):
            if how.startswith("cumulative"):
                await consumer.acknowledge_cumulative(of_a, txn=txn)
            elif how == "negative":
                await consumer.negative_acknowledge(of_a)
            else:
                await consumer.acknowledge(of_a, txn=txn)
        if txn is not None:
            await txn.commit()                       # nothing of it was refused to B's subscription
        await consumer.close()
        consumer = await broker.subscribe(B, "s", consumer_type="failover", initial_position="earliest")
        assert [m.data for m in await drain(consumer)] == [b"b0", b"b1", b"b2"]
