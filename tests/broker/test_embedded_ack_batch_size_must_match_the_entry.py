"""An embedded consumer acknowledges a batched message with the batch size its MessageId
carries, which a caller may have built (or changed): one the entry does not have is refused
(NotAllowedError), with nothing of the batch acknowledged, in a transaction or not. Taken as
it came, an ack set built for a batch of 3 acknowledged indexes 3.. of a batch of 10 (their
bits are clear), and the cursor or the pending acks kept the size of the wrong batch."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from pyengine.broker import Broker
from pyengine.errors import NotAllowedError
from tests.broker.helpers import drain, publish_batch

T = "persistent://public/default/embedded-ack-batch-size"
HOW = ["individual", "cumulative", "individual in a txn", "cumulative in a txn"]


async def _received(consumer, count: int) -> list:
    """The `count` messages expected, then whatever else comes in a short silence (none)."""
    return [await consumer.receive(timeout=5) for _ in range(count)] + await drain(consumer, 0.05)


async def _acknowledge(consumer, message_id, how, txn):
    if how.startswith("cumulative"):
        await consumer.acknowledge_cumulative(message_id, txn=txn)
    else:
        await consumer.acknowledge(message_id, txn=txn)


@pytest.mark.parametrize("claimed", [3, 11])
@pytest.mark.parametrize("how", HOW)
async def test_a_batch_size_the_entry_does_not_have_is_refused(tmp_path, how, claimed):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="failover", initial_position="earliest")
        await publish_batch(broker, producer, [b"m%d" % i for i in range(10)])
        got = await _received(consumer, 10)
        assert [m.message_id.batch_size for m in got] == [10] * 10
        txn = await broker.new_transaction() if "txn" in how else None
        with pytest.raises(NotAllowedError, match="holds 10 messages"):
            await _acknowledge(consumer, dataclasses.replace(got[1].message_id, batch_size=claimed), how, txn)
        sub = broker.service.topics[T].subscriptions["s"]
        if txn is not None:
            assert not sub.pending_ack.individual_ack_positions and sub.pending_ack.cumulative_ack_of_txn is None
            # As Pulsar's clients: a transaction one of whose acks failed aborts at its commit.
            with pytest.raises(NotAllowedError):
                await txn.commit()
            assert txn.state == "aborted"
        assert sub.cursor.batch_ack_set(got[1].message_id.position) is None
        await consumer.close()
        consumer = await broker.subscribe(T, "s", consumer_type="failover")
        assert [m.data for m in await _received(consumer, 10)] == [b"m%d" % i for i in range(10)]


@pytest.mark.parametrize("how", HOW)
async def test_the_batch_size_of_the_entry_is_taken(tmp_path, how):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="failover", initial_position="earliest")
        await publish_batch(broker, producer, [b"m%d" % i for i in range(10)])
        got = await _received(consumer, 10)
        txn = await broker.new_transaction() if "txn" in how else None
        await _acknowledge(consumer, got[1].message_id, how, txn)
        if txn is not None:
            await txn.commit()
        await consumer.close()
        consumer = await broker.subscribe(T, "s", consumer_type="failover")
        left = [b"m0"] if how == "individual" or how == "individual in a txn" else []
        assert [m.data for m in await _received(consumer, len(left) + 8)] == left + [b"m%d" % i for i in range(2, 10)]


@pytest.mark.parametrize("claimed, index", [(300_000_000, 1), (0, 0), (10, 10)])
@pytest.mark.parametrize("how", HOW)
async def test_an_absurd_batch_is_refused_before_its_ack_set_is_built(tmp_path, how, claimed, index):
    """Refused before the embedding API builds the ack set from the id (300M took ~1 s and
    ~350 MB first; a size of 0, or an index past the size, raised IndexError)."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="failover", initial_position="earliest")
        await publish_batch(broker, producer, [b"m%d" % i for i in range(10)])
        got = await _received(consumer, 10)
        txn = await broker.new_transaction() if "txn" in how else None
        claim = dataclasses.replace(got[1].message_id, batch_size=claimed, batch_index=index)
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(NotAllowedError):
            await _acknowledge(consumer, claim, how, txn)
        assert loop.time() - began < 0.3
        if txn is not None:
            with pytest.raises(NotAllowedError):
                await txn.commit()
