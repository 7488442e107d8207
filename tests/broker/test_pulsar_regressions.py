"""One test per Apache Pulsar bug the broker layer avoids (the components' own regressions live
in tests/transaction/*/test_pulsar_regressions.py)."""

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.client import MessageId
from tests.broker.helpers import SHORT_TXN_TIMEOUT_MS, drain, publish_batch, timed_out

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


async def test_11877_a_reader_that_read_everything_is_not_told_markers_are_left(tmp_path):
    """Each transaction leaves a marker entry after its messages; the end-of-topic check
    counted it while the broker never dispatched it, so hasMessageAvailable() stayed true.
    Here the last message id a reader is given is its last message, never a marker."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        for i in range(3):
            txn = await broker.new_transaction()
            await producer.send(b"m%d" % i, txn=txn)
            await txn.commit()                       # a commit marker after each message
        reader = await broker.create_reader(T, MessageId.earliest)
        received = await drain(reader)
        assert [m.data for m in received] == [b"m0", b"m1", b"m2"]
        last = await reader.get_last_message_id()
        assert last == received[-1].message_id       # hasMessageAvailable(): nothing left


async def test_22610_aborted_entries_do_not_stall_a_reader_or_the_backlog(tmp_path):
    """Aborted entries were filtered without moving the position past them: a reader stayed
    stuck on them and a subscription's backlog never reached zero."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        for commit in (False, False, True, False):
            txn = await broker.new_transaction()
            await producer.send(b"committed" if commit else b"aborted", txn=txn)
            await (txn.commit() if commit else txn.abort())
        await producer.send(b"plain")
        reader = await broker.create_reader(T, MessageId.earliest)
        assert [m.data for m in await drain(reader)] == [b"committed", b"plain"]
        received = await drain(consumer)
        assert [m.data for m in received] == [b"committed", b"plain"]
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
        stuck = await broker.new_transaction(timeout_ms=SHORT_TXN_TIMEOUT_MS)
        await consumer.acknowledge(message, txn=stuck)
        await timed_out(stuck)
        again = await consumer.receive(timeout=2)            # released and delivered again
        retry = await broker.new_transaction()
        await consumer.acknowledge(again, txn=retry)         # no conflict
        await retry.commit()


# --- acks in transactions: redelivery, permits and the pending-ack log ----------------------

async def test_21177_messages_held_by_an_open_txn_do_not_use_up_a_consumers_permits(tmp_path):
    """The dispatcher filtered entries pending in a transaction only after counting them against
    the consumer's permits: a consumer with a small receiver queue got nothing and stayed stuck.
    After a restart the subscription reads those entries again (its pending acks replayed)."""
    from pyengine.transaction import TxnAction

    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        for i in range(10):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                          receiver_queue_size=5)
        held = [await consumer.receive(timeout=2) for _ in range(5)]
        txn = await broker.new_transaction()
        for message in held:
            await consumer.acknowledge(message, txn=txn)
        txn_id = txn.txn_id
    async with Broker.embedded(tmp_path) as broker:
        consumer = await broker.subscribe(T, "s", consumer_type="shared", receiver_queue_size=5)
        assert [m.data for m in await drain(consumer)] == [b"m%d" % i for i in range(5, 10)]
        await broker.service.coordinator.end_transaction(txn_id, TxnAction.ABORT)
        assert sorted(m.data for m in await drain(consumer)) == [b"m%d" % i for i in range(5)]


async def test_14327_an_abort_redelivers_only_the_batch_indexes_no_other_txn_holds(tmp_path):
    """txn1 acked indexes 0-1 of a batch, txn2 indexes 2-4; aborting txn2 redelivered the whole
    batch, and acking 0-1 again was a TransactionConflict."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        await publish_batch(broker, producer, [bytes([i]) for i in range(5)])
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        batch = await drain(consumer)
        assert len(batch) == 5
        txn1, txn2 = await broker.new_transaction(), await broker.new_transaction()
        for message in batch[:2]:
            await consumer.acknowledge(message, txn=txn1)
        for message in batch[2:]:
            await consumer.acknowledge(message, txn=txn2)
        await txn2.abort()
        again = await drain(consumer)
        assert sorted(m.message_id.batch_index for m in again) == [2, 3, 4]
        for message in again:                   # no conflict with txn1's indexes
            await consumer.acknowledge(message)
        await txn1.commit()
        assert await drain(consumer) == []
        assert broker.service.topics[T].subscriptions["s"].backlog() == 0


async def test_25107_an_aborted_txns_acked_messages_come_back_exactly_once(tmp_path):
    """After aborting a transaction that acked messages, they were delivered more than once."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        for i in range(10):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        received = await drain(consumer)
        txn = await broker.new_transaction()
        for message in received:
            await consumer.acknowledge(message, txn=txn)
        await txn.abort()
        again = await drain(consumer)
        assert sorted(m.data for m in again) == sorted(m.data for m in received)   # each once
        retry = await broker.new_transaction()
        for message in again:
            await consumer.acknowledge(message, txn=retry)
        await retry.commit()
        await consumer.redeliver_unacknowledged_messages()
        assert await drain(consumer) == []
        assert broker.service.topics[T].subscriptions["s"].backlog() == 0


async def test_19814_redelivery_never_replays_aborted_batches(tmp_path):
    """A Shared consumer restarted while batched transactional messages were unacked got
    messages of aborted transactions on the replay path."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        visible = {b"p0", b"p1"}
        await producer.send(b"p0")
        for round_ in range(4):
            txn = await broker.new_transaction()
            payloads = [b"t%d-%d" % (round_, i) for i in range(4)]
            await publish_batch(broker, producer, payloads, txn=txn)
            if round_ % 2:
                await txn.abort()
            else:
                await txn.commit()
                visible.update(payloads)
        await producer.send(b"p1")
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        for _ in range(3):                       # restarts and redeliveries, nothing acked
            assert {m.data for m in await drain(consumer)} == visible
            await consumer.close()
            consumer = await broker.subscribe(T, "s", consumer_type="shared")
        await consumer.redeliver_unacknowledged_messages()
        assert {m.data for m in await drain(consumer)} == visible


async def test_librdkafka_2993_a_long_run_of_aborted_entries_does_not_stall_a_consumer(tmp_path):
    """Kafka analogue: ~1.8M aborted messages in a row made a read_committed consumer fail. Here
    thousands of aborted entries stand between a consumer with a one-message queue and the
    next committed message; they are skipped (and acked) without a permit each."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest", receiver_queue_size=1)
        aborted = await broker.new_transaction()
        await asyncio.gather(*(producer.send(b"a", txn=aborted) for _ in range(3000)))
        await aborted.abort()
        await producer.send(b"after")
        message = await consumer.receive(timeout=10)
        assert message.data == b"after"
        await consumer.acknowledge(message)
        assert broker.service.topics[T].subscriptions["s"].backlog() == 0


async def test_15137_a_long_open_txn_does_not_pin_later_records_of_the_pending_ack_log(tmp_path):
    """A long-open transaction that acked a later position stopped the pending-ack log's
    cleanup: the broker kept every later record and ran out of memory."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        for i in range(51):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        messages = await drain(consumer)
        long_open = await broker.new_transaction()
        await consumer.acknowledge(messages[50], txn=long_open)
        for message in messages[:50]:
            txn = await broker.new_transaction()
            await consumer.acknowledge(message, txn=txn)
            await txn.commit()
        store = broker.service.topics[T].subscriptions["s"].pending_ack.store

        def logged():
            return [ack for chunk in store.scan(100) for ack in chunk]

        await broker.service.env.barrier()      # the records' deletions are durable
        assert [ack.txn for ack in logged()] == [long_open.txn_id]
        await long_open.commit()
        await broker.service.env.barrier()
        assert logged() == []
        assert broker.service.topics[T].subscriptions["s"].backlog() == 0


async def test_kop_1283_a_txn_aborted_after_a_pause_is_never_visible(tmp_path):
    """KoP: read_committed consumers saw messages of transactions aborted 75 ms or more after
    the send."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        for _ in range(3):
            txn = await broker.new_transaction()
            await producer.send(b"aborted", txn=txn)
            await asyncio.sleep(0.1)
            await txn.abort()
        txn = await broker.new_transaction()
        await producer.send(b"committed", txn=txn)
        await txn.commit()
        assert [m.data for m in await drain(consumer)] == [b"committed"]


async def test_14760_a_topic_whose_buffer_recovery_failed_can_be_loaded_again(tmp_path):
    """A failed transaction-buffer recovery left the topic half-open and unusable (reader or
    writer creation failed, CursorAlreadyClosed) until the broker restarted. Here the load
    fails with the reason and releases what it opened; the next load starts afresh."""
    from pyengine.storage import CorruptRecordError

    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        txn = await broker.new_transaction()
        await producer.send(b"committed", txn=txn)
        await txn.commit()
    async with Broker.embedded(tmp_path) as broker:
        env = broker.service.env
        with env.read() as read:                  # the topic's snapshot record (the only topic)
            keys = [key for key, _ in read.cursor(db=env.db("tb_snapshots"))]
        assert len(keys) == 1
        await env.submit(lambda txn: txn.put(keys[0], b"\xff garbage", db=env.db("tb_snapshots")))
        for _ in range(2):                        # fails the same way each time, nothing left behind
            with pytest.raises(CorruptRecordError):
                await broker.service.get_topic(T)
            assert T not in broker.service.topics
        await env.submit(lambda txn: txn.delete(keys[0], db=env.db("tb_snapshots")))
        consumer = await broker.subscribe(T, "s", initial_position="earliest")   # full replay instead
        assert [m.data for m in await drain(consumer)] == [b"committed"]
        producer = await broker.create_producer(T)
        await producer.send(b"after")
        assert [m.data for m in await drain(consumer)] == [b"after"]


async def test_14760_a_failed_load_leaves_nothing_running(tmp_path, monkeypatch):
    """A load that fails after the transaction buffer recovered (here the compacted view's
    load): that buffer is closed (its snapshot timer would otherwise outlive the failed topic
    and write stale snapshots beside the next load's), and the next load starts afresh."""
    from pyengine.broker.compaction import TopicCompaction
    from pyengine.transaction.buffer import BufferState

    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"m")
        await broker.subscribe(T, "s", initial_position="earliest")
    async with Broker.embedded(tmp_path) as broker:
        service = broker.service
        buffers = []
        new_buffer = service.new_transaction_buffer
        monkeypatch.setattr(service, "new_transaction_buffer", lambda ledger: buffers.append(new_buffer(ledger))
                            or buffers[-1])
        load = TopicCompaction.load

        def failing_load(self):
            raise RuntimeError("the compacted view cannot be read")

        monkeypatch.setattr(TopicCompaction, "load", failing_load)
        with pytest.raises(RuntimeError, match="compacted view"):
            await service.get_topic(T)
        assert T not in service.topics and buffers[-1].state is BufferState.CLOSED
        monkeypatch.setattr(TopicCompaction, "load", load)
        consumer = await broker.subscribe(T, "s")
        assert [m.data for m in await drain(consumer)] == [b"m"]
        assert buffers[-1].state is BufferState.READY


async def test_a_subscription_whose_pending_acks_cannot_be_replayed_takes_down_only_itself(tmp_path):
    """A pending-ack log that cannot be replayed failed the whole topic's load: its producers
    and its other subscriptions were down too. As Pulsar's (a subscription's consumers wait
    for its pending-ack handle, PersistentSubscription.addConsumer), the topic serves and only
    that subscription refuses its consumers (ServiceNotReady, retried by clients); each
    attach tries the replay again, so a repaired log serves without a reload."""
    from pyengine.errors import ServiceNotReadyError

    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"m")
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        await broker.subscribe(T, "other", initial_position="earliest")
        message = await consumer.receive(timeout=2)
        txn = await broker.new_transaction()
        await consumer.acknowledge(message, txn=txn)
    async with Broker.embedded(tmp_path) as broker:
        env = broker.service.env
        with env.read() as read:
            keys = [key for key, _ in read.cursor(db=env.db("pending_ack"))]
        assert len(keys) == 1
        await env.submit(lambda t: t.put(keys[0], b"\xff\xff\xff", db=env.db("pending_ack")))
        producer = await broker.create_producer(T)
        await producer.send(b"after")
        other = await broker.subscribe(T, "other")
        assert [m.data for m in await drain(other)] == [b"m", b"after"]
        for _ in range(2):
            with pytest.raises(ServiceNotReadyError, match="pending-ack"):
                await broker.subscribe(T, "s")
        await env.submit(lambda t: t.delete(keys[0], db=env.db("pending_ack")))
        consumer = await broker.subscribe(T, "s")
        assert [m.data for m in await drain(consumer)] == [b"m", b"after"]


# --- commit and coordinator semantics ---------------------------------------------------------

async def test_13348_committing_a_txn_whose_send_failed_aborts_it_and_says_why(tmp_path):
    """A commit of a transaction with a failed operation went through as if nothing had
    happened (or aborted silently). Here the commit aborts the transaction and raises the
    send's error; nothing of the transaction becomes visible."""
    from pyengine.errors import PulsarError

    other = "persistent://public/default/regression-terminated"
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        doomed = await broker.create_producer(other)
        await (await broker.service.get_topic(other)).terminate()
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        txn = await broker.new_transaction()
        await producer.send(b"first", txn=txn)
        failed = asyncio.ensure_future(doomed.send(b"refused", txn=txn))
        await asyncio.sleep(0)                  # the send is in flight when the commit starts
        with pytest.raises(PulsarError, match="terminated"):
            await txn.commit()
        assert failed.done() and failed.exception() is not None
        assert txn.state == "aborted"
        from pyengine.transaction import TxnStatus
        assert broker.service.coordinator.get(txn.txn_id).status is TxnStatus.ABORTED
        assert await drain(consumer) == []


async def test_redpanda_3036_the_horizon_is_exactly_before_the_first_open_entry(tmp_path):
    """Redpanda: an off-by-one between the stable offset as a bound and as a last readable
    offset made records past it visible. Here the entry right before an open transaction's
    first entry is the last one delivered, and the read horizon names it."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        before = await producer.send(b"before")
        txn = await broker.new_transaction()
        first = await producer.send(b"open", txn=txn)
        await producer.send(b"after")
        buffer = broker.service.topics[T].buffer
        assert (first.ledger_id, first.entry_id) == (before.ledger_id, before.entry_id + 1)
        horizon = buffer.max_read_position()
        assert (horizon.ledger_id, horizon.entry_id) == (before.ledger_id, before.entry_id)
        assert [m.data for m in await drain(consumer)] == [b"before"]
        await txn.commit()
        assert [m.data for m in await drain(consumer)] == [b"open", b"after"]


async def test_redpanda_5442_an_open_txn_goes_on_at_once_after_a_restart(tmp_path):
    """Redpanda: after its coordinator restarted, ongoing transactions were blocked for about a
    minute. Here a transaction opened before a restart takes sends and commits right after."""
    import time

    from pyengine.broker.embedded import EmbeddedTransaction

    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        txn = await broker.new_transaction()
        await producer.send(b"before-restart", txn=txn)
        txn_id = txn.txn_id
    async with Broker.embedded(tmp_path) as broker:
        started = time.monotonic()
        same = EmbeddedTransaction(broker.service, txn_id)
        producer = await broker.create_producer(T)
        await producer.send(b"after-restart", txn=same)
        await same.commit()
        assert time.monotonic() - started < 30          # not the minute (a bound of 2 s: load)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        assert [m.data for m in await drain(consumer)] == [b"before-restart", b"after-restart"]
