"""An acknowledgement of a position after the topic's last entry is refused, as Pulsar's
ManagedCursor refuses it ("Invalid mark deleted position"): taken, it made the messages written
there later count as acknowledged, never delivered (found by an audit: an id of another topic,
acknowledged cumulatively on this one)."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.client import MessageId
from pyengine.errors import NotAllowedError
from tests.broker.helpers import drain

T = "persistent://public/default/ahead"


@pytest.mark.parametrize("how", ["individual", "cumulative", "batch index", "in a txn", "cumulative in a txn"])
async def test_an_ack_ahead_of_the_last_entry_is_refused_and_takes_nothing(tmp_path, how):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        last = await producer.send(b"m0")
        consumer = await broker.subscribe(T, "s", consumer_type="failover", initial_position="earliest")
        ahead = MessageId(last.ledger_id, last.entry_id + 3)
        txn = await broker.new_transaction() if "txn" in how else None
        with pytest.raises(NotAllowedError, match="Invalid mark deleted position"):
            if how == "batch index":
                await consumer.acknowledge(MessageId(last.ledger_id, last.entry_id + 3, 1, batch_size=4))
            elif how.startswith("cumulative"):
                await consumer.acknowledge_cumulative(ahead, txn=txn)
            else:
                await consumer.acknowledge(ahead, txn=txn)
        if txn is not None:
            await txn.abort()
        for i in range(1, 6):
            await producer.send(b"m%d" % i)
        assert [m.data for m in await drain(consumer)] == [b"m%d" % i for i in range(6)]
