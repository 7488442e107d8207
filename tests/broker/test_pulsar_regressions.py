"""One test per Apache Pulsar bug the broker layer avoids (the components' own regressions live
in tests/transaction/*/test_pulsar_regressions.py)."""

import asyncio

from pyengine.broker import Broker
from pyengine.client import MessageId
from tests.broker.helpers import drain

T = "persistent://public/default/regression"


async def test_21466_last_message_id_is_the_read_horizon_not_the_lac(tmp_path):
    """getLastMessageId returned the LAC while a transaction was open: a reader waited for an
    entry it could never receive."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        visible = await producer.send(b"visible")
        txn = await broker.new_transaction()
        await producer.send(b"open", txn=txn)
        await producer.send(b"behind-the-open-txn")
        reader = await broker.create_reader(T, MessageId.earliest)
        assert await reader.get_last_message_id() == visible
        assert [m.data for m in await drain(reader)] == [b"visible"]
        await txn.commit()
        last = await reader.get_last_message_id()
        assert [m.message_id for m in await drain(reader)][-1] == last


async def test_21951_last_message_id_is_never_a_marker(tmp_path):
    """After a commit the last entry is the commit marker; returning it left readers waiting
    for an entry that is never dispatched."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        txn = await broker.new_transaction()
        sent = await producer.send(b"txn", txn=txn)
        await txn.commit()
        topic = broker.service.topics[T]
        assert topic.ledger.read_entry(topic.ledger.lac).is_marker
        reader = await broker.create_reader(T, MessageId.earliest)
        assert await reader.get_last_message_id() == sent


async def test_21951_last_message_id_skips_aborted_entries(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        kept = await producer.send(b"kept")
        txn = await broker.new_transaction()
        for _ in range(300):                       # more than one backwards read chunk
            await producer.send(b"aborted", txn=txn)
        await txn.abort()
        reader = await broker.create_reader(T, MessageId.earliest)
        assert await reader.get_last_message_id() == kept


async def test_11877_22610_markers_and_aborted_entries_do_not_stall_readers_or_backlog(tmp_path):
    """Markers were counted as messages and aborted entries were filtered without moving the
    cursor: readers believed messages were available, backlog never reached zero."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        for commit in (True, False, True, False):
            txn = await broker.new_transaction()
            await producer.send(b"m", txn=txn)
            await (txn.commit() if commit else txn.abort())
        received = await drain(consumer)
        assert len(received) == 2
        for message in received:
            await consumer.acknowledge(message)
        subscription = broker.service.topics[T].subscriptions["s"]
        assert subscription.backlog() == 0
        assert subscription.cursor.mark_delete == broker.service.topics[T].ledger.lac


async def test_19581_complementary_batch_acks_make_the_batch_undeliverable(tmp_path):
    """A batch acked in part on the cursor and in part by an open transaction was dispatched
    again, so a consumer saw duplicates while the transaction was open."""
    from core_ext.batch import build_batch
    from pyengine.protocol.commands import message_metadata
    from pyengine.protocol.pulsar_api_pb2 import SingleMessageMetadata
    from pyengine.storage.entry import headers_and_payload

    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        topic = broker.service.topics[T]
        singles = [(SingleMessageMetadata(payload_size=1, sequence_id=i).SerializeToString(), bytes([i]))
                   for i in range(5)]
        metadata = message_metadata(producer.producer_name, 0, 1, num_messages_in_batch=5).SerializeToString()
        await topic.publish(producer._producer, headers_and_payload(metadata, build_batch(singles)),
                            sequence_id=0, num_messages=5)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        batch = await drain(consumer)
        assert len(batch) == 5
        for message in batch[:3]:
            await consumer.acknowledge(message)
        txn = await broker.new_transaction()
        for message in batch[3:]:
            await consumer.acknowledge(message, txn=txn)
        await consumer.redeliver_unacknowledged_messages()
        assert await drain(consumer) == []
        await txn.abort()
        again = await drain(consumer)
        assert sorted(m.message_id.batch_index for m in again) == [3, 4]


async def test_14097_plain_messages_flow_when_no_transaction_is_open(tmp_path):
    """With transactions enabled, plain publishes did not move the read horizon."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        txn = await broker.new_transaction()
        await producer.send(b"t", txn=txn)
        await txn.commit()
        for i in range(5):
            await producer.send(f"p{i}".encode())
        assert [m.data for m in await drain(consumer)] == [b"t"] + [f"p{i}".encode() for i in range(5)]
    async with Broker.embedded(tmp_path) as broker:          # and after a restart
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s")
        await producer.send(b"after-restart")
        assert [m.data for m in await drain(consumer)][-1] == b"after-restart"


async def test_19629_a_repeated_commit_succeeds_instead_of_duplicating(tmp_path):
    """A commit retried after a broker restart got InvalidTxnStatus although it had succeeded;
    the application resent everything."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        txn = await broker.new_transaction()
        await producer.send(b"once", txn=txn)
        await txn.commit()
        txn_id = txn.txn_id
    async with Broker.embedded(tmp_path) as broker:
        from pyengine.transaction import TxnAction, TxnStatus
        assert await broker.service.coordinator.end_transaction(txn_id, TxnAction.COMMIT) == TxnStatus.COMMITTED
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        assert [m.data for m in await drain(consumer)] == [b"once"]


async def test_10306_a_timed_out_transaction_releases_its_acks(tmp_path):
    """A transaction that timed out kept its pending acks: reprocessing failed with
    TransactionConflict until the broker restarted."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"m")
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        message = await consumer.receive(timeout=2)
        stuck = await broker.new_transaction(timeout_ms=100)
        await consumer.acknowledge(message, txn=stuck)
        await asyncio.sleep(0.5)
        again = await consumer.receive(timeout=2)            # released and delivered again
        retry = await broker.new_transaction()
        await consumer.acknowledge(again, txn=retry)         # no conflict
        await retry.commit()
