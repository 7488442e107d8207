"""Review findings on the v4 pending acknowledgements as the subscription uses them."""

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.errors import NotAllowedError, TransactionConflictError
from pyengine.broker.policies import Retention
from pyengine.storage import ManagedLedgerConfig
from pyengine.transaction.pendingack import IndividualAck
from tests.broker.helpers import drain, publish_batch

T = "persistent://public/default/pending-ack-review"


async def test_a_cumulative_txn_ack_inside_the_first_batch_after_trimmed_ledgers(tmp_path):
    """A transactional cumulative ack of a message inside a batch that is the first entry of
    the oldest ledger left (those before it consumed and trimmed) failed with an unknown
    error: the entry before the batch, the cumulative part of the request, was (ledger, -1),
    which names no entry, and the pending acks refused it as malformed (ValueError). Nothing
    unacknowledged lies before such a batch: the request is its batch indexes alone."""
    config = dict(retention=Retention(0, 0), ledger=ManagedLedgerConfig(max_entries_per_ledger=2))
    async with Broker.embedded(tmp_path, **config) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="exclusive", initial_position="earliest")
        await producer.send(b"m0")
        await producer.send(b"m1")
        await consumer.acknowledge_cumulative((await drain(consumer))[-1])
        await publish_batch(broker, producer, [b"a", b"b", b"c"])
        batch = await drain(consumer)
        topic = broker.service.topics[T]
        for _ in range(100):                        # the first ledger is trimmed once consumed
            if 1 not in topic.ledger.ledgers:
                break
            await asyncio.sleep(0.02)
        assert list(topic.ledger.ledgers) == [2]
        txn = await broker.new_transaction()
        await consumer.acknowledge_cumulative(batch[1], txn=txn)
        await txn.commit()
        cursor = topic.subscriptions["s"].cursor
        position = batch[0].message_id.position
        assert cursor.batch_ack_set(position) == [0b100]          # a and b acknowledged, c not
        assert topic.subscriptions["s"].backlog() == 1


@pytest.mark.parametrize("acked_index", [0, 1])
async def test_a_whole_entry_txn_ack_of_a_partly_acked_batch_conflicts_whichever_index_was_acked(tmp_path,
                                                                                               acked_index):
    """A transactional ack of a whole batch entry (no ack set: the wire's and the embedding
    API's whole-entry ack, batch size 1) over a batch the cursor holds partly acknowledged
    is a conflict, as the same ack with the batch's size is. It was decided by index 0 alone
    (the size 1 it came with): refused when index 0 was acknowledged, taken when only index 1
    was, and its commit then acknowledged index 1 a second time."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await publish_batch(broker, producer, [b"a", b"b", b"c"])
        batch = await drain(consumer)
        await consumer.acknowledge(batch[acked_index])
        subscription = broker.service.topics[T].subscriptions["s"]
        position = batch[0].message_id.position
        assert subscription.cursor.batch_ack_set(position) is not None
        txn = await broker.new_transaction()
        with pytest.raises(TransactionConflictError, match="already acked before"):
            await subscription.ack_with_transaction(None, txn.txn_id, [IndividualAck(position)])
        assert position not in subscription.pending_ack.individual_ack_positions
        await txn.abort()


@pytest.mark.parametrize("ack_set", [(0b11000,), (0b111,), (0, 0), (-1,)])
async def test_a_malformed_ack_set_of_a_txn_ack_is_refused_as_not_allowed(tmp_path, ack_set):
    """A transactional batch-index ack whose ack set has bits beyond its batch, acknowledges
    none of it, or has words too many: refused with NotAllowedError (what a client's bad input
    gets), not the pending acks' ValueError that the wire answered as an UnknownError."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await publish_batch(broker, producer, [b"a", b"b", b"c"])
        position = (await drain(consumer))[0].message_id.position
        subscription = broker.service.topics[T].subscriptions["s"]
        txn = await broker.new_transaction()
        with pytest.raises(NotAllowedError, match="refused"):
            await subscription.ack_with_transaction(None, txn.txn_id, [IndividualAck(position, 3, ack_set)])
        assert position not in subscription.pending_ack.individual_ack_positions
        await txn.abort()
