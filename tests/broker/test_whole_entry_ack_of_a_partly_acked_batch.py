"""A whole-entry acknowledgement (what a client without batch-index acks sends: ledger and
entry, no ack set, no batch size) of a batch some of whose indexes the cursor already holds
acknowledged. It was taken for an ack of a one-message entry, found "fully pending" (index 0
acknowledged) and ignored: the rest of the batch came back after a reconnect."""

from pyengine.broker import Broker
from pyengine.transaction.pendingack import IndividualAck
from pyengine_kernels import Position
from tests.broker.helpers import drain, publish_batch
from tests.transaction.pendingack.helpers import acking

T = "persistent://public/default/whole-entry-ack"


async def test_a_whole_entry_ack_of_a_partly_acked_batch_acknowledges_all_of_it(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await publish_batch(broker, producer, [b"a", b"b", b"c"])
        [first, *_] = await drain(consumer, 0.5)
        sub = broker.service.topics[T].subscriptions["s"]
        position = Position(first.message_id.ledger_id, first.message_id.entry_id)
        await sub.ack_individual(None, [IndividualAck(position, 3, tuple(acking(3, 0)))])
        assert not sub.cursor.is_acked(position)
        await sub.ack_individual(None, [IndividualAck(position)])
        assert sub.cursor.is_acked(position) and sub.backlog() == 0
        await consumer.close()
        again = await broker.subscribe(T, "s", consumer_type="shared")
        assert await drain(again, 0.5) == []


async def test_a_whole_entry_ack_leaves_a_batch_a_transaction_holds_entirely_to_it(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await publish_batch(broker, producer, [b"a", b"b", b"c"])
        [first, *_] = await drain(consumer, 0.5)
        position = Position(first.message_id.ledger_id, first.message_id.entry_id)
        sub = broker.service.topics[T].subscriptions["s"]
        await sub.ack_individual(None, [IndividualAck(position, 3, tuple(acking(3, 0)))])
        txn = await broker.new_transaction()
        await sub.ack_with_transaction(None, txn.txn_id, [IndividualAck(position, 3, tuple(acking(3, 1, 2)))])
        await sub.ack_individual(None, [IndividualAck(position)])       # reserved: the txn's
        assert not sub.cursor.is_acked(position)
        await txn.abort()
        assert not sub.cursor.is_acked(position)
