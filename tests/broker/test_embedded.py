"""The embedding API end to end: produce, consume, acknowledge, redeliver, seek, read,
de-duplicate and run transactions in-process, across restarts."""

import asyncio
import time

import pytest

from pyengine.broker import Broker
from pyengine.client import MessageId
from pyengine.errors import (
    ConsumerBusyError,
    InvalidTopicNameError,
    InvalidTxnStatusError,
    NotAllowedError,
    TransactionConflictError,
)
from pyengine.protocol.commands import parse_message_metadata
from pyengine.storage.entry import split_headers_and_payload
from pyengine.transaction import TxnAction
from pyengine.transaction.pendingack import IndividualAck
from pyengine_kernels import Position
from tests.broker.helpers import SHORT_TXN_TIMEOUT_MS, GatedWriter, drain, failover_names, publish_batch, timed_out

T = "persistent://public/default/t"


async def test_produce_and_consume_in_order(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer("t")        # short name -> persistent://public/default/t
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        ids = [await producer.send(f"m{i}".encode(), key=f"k{i}", properties={"i": str(i)}) for i in range(20)]
        got = [await consumer.receive(timeout=2) for _ in range(20)]
        assert [m.data for m in got] == [f"m{i}".encode() for i in range(20)]
        assert [m.message_id for m in got] == ids
        assert got[3].partition_key == "k3" and got[3].properties == {"i": "3"}
        assert got[0].producer_name == producer.producer_name and got[0].topic == T


async def test_latest_subscription_sees_only_new_messages(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"old")
        consumer = await broker.subscribe(T, "s")            # latest
        await producer.send(b"new")
        assert [m.data for m in await drain(consumer)] == [b"new"]


async def test_unacked_messages_come_back_after_restart_acked_ones_do_not(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        for i in range(6):
            await producer.send(f"m{i}".encode())
        got = await drain(consumer)
        for message in got[:3]:
            await consumer.acknowledge(message)
    async with Broker.embedded(tmp_path) as broker:
        consumer = await broker.subscribe(T, "s")
        assert [m.data for m in await drain(consumer)] == [b"m3", b"m4", b"m5"]


async def test_negative_ack_redelivers_after_the_delay_with_a_higher_redelivery_count(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                          negative_ack_redelivery_delay_ms=300)
        await producer.send(b"x")
        first = await consumer.receive(timeout=2)
        assert first.redelivery_count == 0
        asked = time.monotonic()
        await consumer.negative_acknowledge(first)
        again = await consumer.receive(timeout=2)
        assert time.monotonic() - asked >= 0.3
        assert again.message_id == first.message_id and again.redelivery_count == 1
        at_once = await broker.subscribe(T, "now", initial_position="earliest", negative_ack_redelivery_delay_ms=0)
        await at_once.negative_acknowledge(await at_once.receive(timeout=2))
        # Exclusive (the default type): redelivered without a count, as Pulsar's single-active
        # dispatcher (RedeliveryTrackerDisabled) sends every message with redelivery count 0.
        assert (await at_once.receive(timeout=0.2)).redelivery_count == 0


async def test_negative_acks_wait_a_minute_by_default_as_in_pulsars_clients(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        await producer.send(b"x")
        await consumer.negative_acknowledge(await consumer.receive(timeout=2))
        assert await drain(consumer, timeout=0.3) == []
        await consumer.close()                       # its pending redelivery goes with it


@pytest.mark.parametrize("delay", [-1, 1.5, "10", True, None])
async def test_a_malformed_negative_ack_delay_is_refused(tmp_path, delay):
    async with Broker.embedded(tmp_path) as broker:
        with pytest.raises(ValueError, match="negative_ack_redelivery_delay_ms"):
            await broker.subscribe(T, "s", negative_ack_redelivery_delay_ms=delay)
        assert "s" not in (await broker.service.get_topic(T)).subscriptions


async def test_cumulative_ack_and_shared_refusal(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        for i in range(5):
            await producer.send(f"m{i}".encode())
        got = await drain(consumer)
        await consumer.acknowledge_cumulative(got[2])
        await consumer.redeliver_unacknowledged_messages()
        assert [m.data for m in await drain(consumer)] == [b"m3", b"m4"]
        shared = await broker.subscribe(T, "sh", consumer_type="shared", initial_position="earliest")
        message = await shared.receive(timeout=2)
        with pytest.raises(NotAllowedError):
            await shared.acknowledge_cumulative(message)


@pytest.mark.parametrize("in_txn", [False, True])
async def test_a_cumulative_ack_inside_a_batch_covers_the_batch_up_to_the_message(tmp_path, in_txn):
    """As the network path takes a cumulative ack with an ack set: what comes back after a
    restart is only what follows the message (a transaction that consumed half a batch and
    committed must not see that half again, or its outputs would be produced twice)."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        await producer.send(b"first")
        await publish_batch(broker, producer, [b"b%d" % i for i in range(70)])     # two ack-set words
        await producer.send(b"last")
        got = [await consumer.receive(timeout=5) for _ in range(72)]
        assert got[66].data == b"b65"
        txn = await broker.new_transaction() if in_txn else None
        await consumer.acknowledge_cumulative(got[66], txn=txn)
        if txn is not None:
            await txn.commit()
    async with Broker.embedded(tmp_path) as broker:
        consumer = await broker.subscribe(T, "s")
        again = [(await consumer.receive(timeout=5)).data for _ in range(5)]
        assert again + [m.data for m in await drain(consumer)] == [b"b66", b"b67", b"b68", b"b69", b"last"]


async def test_a_refused_txn_cumulative_ack_inside_a_batch_holds_nothing(tmp_path):
    """Found by an audit: it was two requests (the entries before the batch, then the batch's
    indexes); when the second conflicted the first stayed, logged, and a client committing
    after the failed ack (a raw EndTxn) acknowledged messages it was told were not. Several
    ids of one individual ack are one request too: a conflict of one reserves none."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        await producer.send(b"first")
        await publish_batch(broker, producer, [b"b0", b"b1", b"b2", b"b3"])
        got = await drain(consumer)
        assert [m.data for m in got] == [b"first", b"b0", b"b1", b"b2", b"b3"]
        holder = await broker.new_transaction()
        await consumer.acknowledge(got[2], txn=holder)                    # b1
        refused = await broker.new_transaction()
        with pytest.raises(TransactionConflictError):
            await consumer.acknowledge_cumulative(got[3], txn=refused)    # up to b2: b1 is taken
        subscription = broker.service.topics[T].subscriptions["s"]
        with pytest.raises(TransactionConflictError):
            await subscription.ack_with_transaction(None, refused.txn_id, acks=[
                IndividualAck(got[0].message_id.position), IndividualAck(got[2].message_id.position, 4)])
        assert str(refused.txn_id) not in subscription.pending_ack.stats()["transactions"]
        await broker.service.coordinator.end_transaction(refused.txn_id, TxnAction.COMMIT)
        await holder.abort()
    async with Broker.embedded(tmp_path) as broker:
        consumer = await broker.subscribe(T, "s")
        assert [m.data for m in await drain(consumer)] == [b"first", b"b0", b"b1", b"b2", b"b3"]

async def test_exclusive_subscription_refuses_a_second_consumer(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        await broker.subscribe(T, "s")
        with pytest.raises(ConsumerBusyError):
            await broker.subscribe(T, "s")
        with pytest.raises(ConsumerBusyError):
            await broker.subscribe(T, "s", consumer_type="shared")


async def test_shared_subscription_spreads_messages(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        a = await broker.subscribe(T, "s", consumer_type="shared", receiver_queue_size=5)
        b = await broker.subscribe(T, "s", consumer_type="shared", receiver_queue_size=5)
        for i in range(10):
            await producer.send(f"m{i}".encode())
        got_a, got_b = await drain(a), await drain(b)
        assert len(got_a) == 5 and len(got_b) == 5
        assert sorted(m.data for m in got_a + got_b) == sorted(f"m{i}".encode() for i in range(10))


async def test_failover_delivers_to_the_active_consumer_then_fails_over(tmp_path):
    # The handover delay has its own tests (test_failover_handover_delay.py): none here.
    async with Broker.embedded(tmp_path, active_consumer_failover_delay_time_ms=0) as broker:
        producer = await broker.create_producer(T)
        active, standby = failover_names(T)            # Pulsar's pick for this topic: the first
        first = await broker.subscribe(T, "s", consumer_type="failover", consumer_name=active)
        second = await broker.subscribe(T, "s", consumer_type="failover", consumer_name=standby)
        await producer.send(b"1")
        assert [m.data for m in await drain(first)] == [b"1"] and await drain(second) == []
        assert first.active and not second.active
        await first.close()
        assert [m.data for m in await drain(second)] == [b"1"]     # unacked: failed over
        assert second.active


async def test_key_shared_keeps_each_key_on_one_consumer_in_order(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumers = [await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name=f"c{i}")
                     for i in range(3)]
        for i in range(60):
            await producer.send(f"{i}".encode(), key=f"key-{i % 7}")
        by_key: dict[str, set[int]] = {}
        for index, consumer in enumerate(consumers):
            got = await drain(consumer)
            for message in got:
                by_key.setdefault(message.partition_key, set()).add(index)
            for key in {m.partition_key for m in got}:
                values = [int(m.data) for m in got if m.partition_key == key]
                assert values == sorted(values)
        assert all(len(owners) == 1 for owners in by_key.values())
        assert sum(len(v) for v in by_key.values()) == 7


async def test_a_key_shared_consumer_that_joins_gets_a_moved_key_once_its_old_messages_are_acked(tmp_path):
    """Pulsar 4.0's draining hashes (PIP-379): keys move to a new consumer, and a moved key
    reaches it only once the previous consumer has acknowledged what it holds of that key, so
    no key is ever delivered out of order across the two consumers."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        first = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="first")
        for i in range(20):
            await producer.send(b"old-%d" % i, key=f"key-{i % 10}")
        old = [await first.receive(timeout=5) for _ in range(20)]   # alone: every key is the first one's
        joined = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="joined")
        for i in range(20):
            await producer.send(b"new-%d" % i, key=f"key-{i % 10}")
        kept_by_first = await drain(first, timeout=1)  # its own keys go on
        assert await drain(joined) == []              # the moved keys wait: all still unacked at first
        for message in old[:-1]:
            await first.acknowledge(message)
        moved = await drain(joined, timeout=1)        # the moved keys with nothing unacked go on
        assert old[-1].partition_key not in {m.partition_key for m in moved}
        await first.acknowledge(old[-1])
        moved += await drain(joined, timeout=1)
        assert moved and kept_by_first                # the keys were split between the two
        assert {m.partition_key for m in moved}.isdisjoint(m.partition_key for m in kept_by_first)
        assert sorted(m.data for m in moved + kept_by_first) == sorted(b"new-%d" % i for i in range(20))


async def test_seek_and_reader_and_last_message_id(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        ids = [await producer.send(f"m{i}".encode()) for i in range(5)]
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        await drain(consumer)
        await consumer.seek(ids[2])          # as the official clients: a consumer resumes after the id
        assert [m.data for m in await drain(consumer)] == [b"m3", b"m4"]
        reader = await broker.create_reader(T, ids[3])          # as pulsar-client: after the id
        assert [m.data for m in await drain(reader)] == [b"m4"]
        inclusive = await broker.create_reader(T, ids[3], start_message_id_inclusive=True)
        assert [m.data for m in await drain(inclusive)] == [b"m3", b"m4"]
        assert await consumer.get_last_message_id() == ids[-1]


async def test_deduplication_stores_a_retried_send_once(tmp_path):
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        first = await producer.send(b"a", sequence_id=0)
        assert await producer.send(b"a", sequence_id=0) == MessageId(-1, -1)
        await producer.close()
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        assert producer.last_sequence_id == 0
        assert await producer.send(b"a", sequence_id=0) == MessageId(-1, -1)
        second = await producer.send(b"b")
        assert second > first
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        assert [m.data for m in await drain(consumer)] == [b"a", b"b"]


async def test_bad_names_and_arguments_are_refused(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        with pytest.raises(InvalidTopicNameError):
            await broker.create_producer("bogus://a/b/c")
        with pytest.raises(ValueError):
            await broker.subscribe(T, "s", initial_position="middle")
        with pytest.raises(ValueError):
            await broker.subscribe(T, "s", consumer_type="broadcast")
        producer = await broker.create_producer(T)
        with pytest.raises(TypeError):
            await producer.send("not bytes")


# --- transactions ---------------------------------------------------------------------------

async def test_committed_messages_appear_only_after_commit(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        txn = await broker.new_transaction()
        await producer.send(b"t1", txn=txn)
        await producer.send(b"plain-after-open-txn")        # held back behind the open txn
        assert await drain(consumer) == []
        await txn.commit()
        assert [m.data for m in await drain(consumer)] == [b"t1", b"plain-after-open-txn"]


async def test_a_transactional_message_carries_its_txn_id_and_fields_in_its_metadata(tmp_path):
    # The txn id fields are encoded once per transaction and appended to each message's
    # metadata: what is stored must parse as one MessageMetadata with everything set.
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        await (await broker.new_transaction()).abort()
        txn = await broker.new_transaction()                # not (0, 0): unset fields read as 0
        assert txn.txn_id.most_bits != 0
        sent = await producer.send(b"payload", key="k", properties={"a": "1"}, event_time=7, txn=txn)
        await txn.commit()
        topic = await broker.service.get_topic(T)
        entry = topic.ledger.read_entry(Position(sent.ledger_id, sent.entry_id))
        raw, payload = split_headers_and_payload(entry.data)
        metadata = parse_message_metadata(raw)
        assert payload == b"payload"
        assert metadata.HasField("txnid_most_bits") and metadata.HasField("txnid_least_bits")
        assert (metadata.txnid_most_bits, metadata.txnid_least_bits) == (txn.txn_id.most_bits, txn.txn_id.least_bits)
        assert (metadata.producer_name, metadata.sequence_id) == (producer.producer_name, 0)
        assert (metadata.partition_key, metadata.event_time) == ("k", 7)
        assert [(p.key, p.value) for p in metadata.properties] == [("a", "1")]
        assert (entry.txn_most, entry.txn_least) == (txn.txn_id.most_bits, txn.txn_id.least_bits)


async def test_a_commit_waits_for_the_sends_still_under_way_and_includes_them(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        txn = await broker.new_transaction()
        sends = [asyncio.ensure_future(producer.send(b"%d" % i, txn=txn)) for i in range(5)]
        await asyncio.sleep(0)               # each send is waiting for its group commit
        assert not any(send.done() for send in sends)
        await txn.commit()
        assert all(send.done() and send.exception() is None for send in sends)
        assert [m.data for m in await drain(consumer)] == [b"%d" % i for i in range(5)]


async def test_a_send_cancelled_under_way_makes_the_commit_abort(tmp_path):
    """Its entry may be stored or not: the transaction cannot commit it (as a failed send).
    The commit raises what pyengine.client's raises then: TransactionHasOperationFailed,
    caused by the cancellation (it raised PulsarError('CancelledError: ...') before)."""
    from pyengine.client.errors import TransactionHasOperationFailedError

    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        txn = await broker.new_transaction()
        await producer.send(b"stored", txn=txn)
        cancelled = asyncio.ensure_future(producer.send(b"cancelled", txn=txn))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(TransactionHasOperationFailedError, match="cancelled") as info:
            await txn.commit()
        assert isinstance(info.value.__cause__, asyncio.CancelledError)
        assert txn.state == "aborted"
        assert await drain(consumer) == []


async def test_a_failed_partition_registration_makes_the_commit_abort(tmp_path, monkeypatch):
    """An entry whose partition the coordinator does not know would never get its marker."""
    from pyengine.errors import PersistenceError

    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        txn = await broker.new_transaction()

        def refused(txn_id, partitions):
            future = asyncio.get_running_loop().create_future()
            future.set_exception(PersistenceError("the registration was not written"))
            return future

        monkeypatch.setattr(broker.service.coordinator, "register_produced_partitions", refused)
        with pytest.raises(PersistenceError):
            await producer.send(b"unregistered", txn=txn)
        monkeypatch.undo()
        with pytest.raises(PersistenceError, match="not written"):
            await txn.commit()
        assert txn.state == "aborted"
        assert await drain(consumer) == []


async def test_aborted_messages_never_appear_and_do_not_block(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        txn = await broker.new_transaction()
        await producer.send(b"aborted", txn=txn)
        await producer.send(b"plain")
        await txn.abort()
        assert [m.data for m in await drain(consumer)] == [b"plain"]
        with pytest.raises(InvalidTxnStatusError):
            await producer.send(b"late", txn=txn)


async def test_transactional_ack_is_applied_on_commit_and_released_on_abort(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await producer.send(b"m")
        message = await consumer.receive(timeout=2)
        aborted = await broker.new_transaction()
        await consumer.acknowledge(message, txn=aborted)
        other = await broker.new_transaction()
        with pytest.raises(TransactionConflictError):
            await consumer.acknowledge(message, txn=other)
        await other.abort()
        await aborted.abort()
        again = await consumer.receive(timeout=2)          # released by the abort: delivered again
        assert again.message_id == message.message_id
        committed = await broker.new_transaction()
        await consumer.acknowledge(again, txn=committed)
        await committed.commit()
        await consumer.redeliver_unacknowledged_messages()
        assert await drain(consumer) == []


async def test_consume_transform_produce_is_atomic_across_a_restart(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        source = await broker.create_producer("in")
        for i in range(10):
            await source.send(f"{i}".encode())
        consumer = await broker.subscribe("in", "s", initial_position="earliest")
        sink = await broker.create_producer("out")
        for _ in range(10):
            txn = await broker.new_transaction()
            message = await consumer.receive(timeout=2)
            await sink.send(message.data * 2, txn=txn)
            await consumer.acknowledge(message, txn=txn)
            if int(message.data) % 3 == 0:
                await txn.abort()
                await consumer.redeliver_unacknowledged_messages()
                break
            await txn.commit()
    async with Broker.embedded(tmp_path) as broker:
        out = await broker.subscribe("out", "check", initial_position="earliest")
        consumer = await broker.subscribe("in", "s")
        assert [m.data for m in await drain(out)] == []       # 0 % 3 == 0: the first txn aborted
        assert [m.data for m in await drain(consumer)] == [f"{i}".encode() for i in range(10)]


async def test_transaction_timeout_aborts_and_releases(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        txn = await broker.new_transaction(timeout_ms=SHORT_TXN_TIMEOUT_MS)
        await producer.send(b"expires", txn=txn)
        await producer.send(b"plain")
        await timed_out(txn)
        assert [m.data for m in await drain(consumer)] == [b"plain"]
        with pytest.raises(InvalidTxnStatusError):
            await txn.commit()


def test_embedding_does_not_load_the_http_stack(tmp_path):
    """aiohttp (the admin server, and calls between brokers sharing a metadata store) is
    imported only when used: it was a third of the embedding API's import time and a third of
    the objects every full garbage collection of an embedding application scanned."""
    import subprocess
    import sys

    code = ("import asyncio, sys\n"
            "from pyengine.broker import Broker\n"
            "async def main():\n"
            "    async with Broker.embedded(sys.argv[1]) as broker:\n"
            "        producer = await broker.create_producer('persistent://public/default/t')\n"
            "        await producer.send(b'x')\n"
            "asyncio.run(main())\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp'))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "data")], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


async def test_a_send_queued_behind_its_failed_registration_is_not_stored(tmp_path):
    """A txn's second send goes to the group commit after the one writing its partition's
    registration: when that commit fails, the second send fails too. Stored, it would be a
    message of a txn whose coordinator does not know the partition, never ended there."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        await producer.send(b"plain")                       # the topic exists before the gate
        earlier = await broker.new_transaction()
        await producer.send(b"aborted", txn=earlier)        # and takes transactions already
        await earlier.abort()
        txn = await broker.new_transaction()
        gate = GatedWriter(broker.service.env)
        try:
            first = asyncio.ensure_future(producer.send(b"first", txn=txn))
            await gate.next_commit()                        # the registration and "first", held
            second = asyncio.ensure_future(producer.send(b"second", txn=txn))
            await asyncio.sleep(0.05)                       # "second" queued for the next commit
            gate.let_through(OSError(5, "injected I/O error"))
        finally:
            gate.open()
        outcomes = await asyncio.gather(first, second, return_exceptions=True)
        assert all(isinstance(o, Exception) for o in outcomes), outcomes
        topic = await broker.service.get_topic(T)
        assert txn.txn_id not in {t for t, _ in topic.buffer.ongoing_txns()}
        assert broker.service.coordinator.get(txn.txn_id).partitions == []
        assert [m.data for m in await drain(consumer)] == [b"plain"]


async def test_an_ack_queued_behind_its_failed_registration_is_not_recorded(tmp_path):
    """As for sends: the pending-ack record of a transactional ack goes to the commit after
    its subscription's registration; when that commit fails, the ack fails too instead of
    leaving a reservation that no end of its txn would ever release."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        await producer.send(b"m")
        message = await consumer.receive(timeout=5)
        txn = await broker.new_transaction()
        gate = GatedWriter(broker.service.env)
        try:
            ack = asyncio.ensure_future(consumer.acknowledge(message, txn=txn))
            await gate.next_commit()                        # the registration, held
            await asyncio.sleep(0.05)                       # the ack's record queued behind it
            gate.let_through(OSError(5, "injected I/O error"))
        finally:
            gate.open()
        with pytest.raises(Exception, match="injected|not written"):
            await ack
        assert broker.service.coordinator.get(txn.txn_id).subscriptions == []
        other = await broker.new_transaction()
        await consumer.acknowledge(message, txn=other)      # not reserved by the failed one
        await other.commit()


async def test_an_abort_rewinds_a_consumer_that_acked_cumulatively_in_it(tmp_path):
    """As the network client's (and Java's) abort: the queue is dropped and everything
    unacknowledged comes again in order. The queued later messages came first before, and a
    cumulative ack of one of them acked the released ones unprocessed."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic = "persistent://public/default/rewind"
        producer = await broker.create_producer(topic)
        consumer = await broker.subscribe(topic, "sub", consumer_type="failover", initial_position="earliest")
        for i in range(6):
            await producer.send(b"%d" % i)
        txn = await broker.new_transaction()
        first = [await consumer.receive(timeout=5) for _ in range(2)]
        await asyncio.sleep(0.05)
        await consumer.acknowledge_cumulative(first[-1], txn=txn)
        await txn.abort()
        assert [(await consumer.receive(timeout=5)).data for _ in range(6)] == [b"%d" % i for i in range(6)]
