"""A broker restarted under a live client: producers resend what is pending with their sequence
ids (de-duplication keeps each message once), consumers subscribe again, transactions go on."""

import asyncio

import pytest

from pyengine.client import AlreadyClosedError, Client
from pyengine.client.handler import READY
from pyengine.client.producer import PartitionProducer

from .conftest import NetworkBroker, answer_registrations_when_set, drain

TOPIC = "persistent://public/default/restart"


@pytest.fixture
async def dedup_broker(tmp_path):
    async with NetworkBroker(tmp_path / "data", num_coordinators=2, deduplication_enabled=True) as broker:
        yield broker


async def test_pending_sends_are_stored_once_across_a_restart(dedup_broker, monkeypatch):
    async with Client(dedup_broker.url, operation_timeout_seconds=15) as client:
        producer = await client.create_producer(TOPIC, producer_name="resender")
        consumer = await client.subscribe(TOPIC, "sub", initial_position="earliest")
        # The broker stores the first 50 but their receipts are lost, as when it dies right
        # after writing: they stay pending and are sent again after the restart.
        receipts = PartitionProducer.on_send_receipt
        monkeypatch.setattr(PartitionProducer, "on_send_receipt", lambda self, receipt: None)
        lost = [producer.send_async(b"%d" % i) for i in range(50)]
        await asyncio.sleep(0.3)
        assert dedup_broker.service.topics[TOPIC].ledger.lac.entry_id == 49
        monkeypatch.setattr(PartitionProducer, "on_send_receipt", receipts)
        await dedup_broker.stop()
        later = [producer.send_async(b"%d" % i) for i in range(50, 100)]   # queued while down
        await asyncio.sleep(0.3)
        await dedup_broker.start()
        ids = await asyncio.wait_for(asyncio.gather(*lost, *later), 15)
        assert all(i.entry_id == -1 for i in ids[:50])          # duplicates: dropped by the broker
        assert producer.last_sequence_id == 99
        got = await drain(consumer)
        assert [int(m.data) for m in got] == list(range(100))
        assert [m.sequence_id for m in got] == list(range(100))


async def test_consumers_subscribe_again_and_get_the_unacked_messages(dedup_broker):
    async with Client(dedup_broker.url, operation_timeout_seconds=15) as client:
        producer = await client.create_producer(TOPIC)
        consumer = await client.subscribe(TOPIC, "again", initial_position="earliest")
        for i in range(10):
            await producer.send(b"%d" % i)
        first = [await consumer.receive(timeout=5) for _ in range(10)]
        for message in first[:4]:
            await consumer.acknowledge(message)
        await asyncio.sleep(0.05)
        await dedup_broker.restart()
        rest = await drain(consumer, timeout=3)
        assert [int(m.data) for m in rest] == list(range(4, 10))
        await producer.send(b"after")
        assert (await consumer.receive(timeout=5)).data == b"after"


async def test_transactions_continue_after_a_restart(dedup_broker):
    async with Client(dedup_broker.url, operation_timeout_seconds=15) as client:
        producer = await client.create_producer(TOPIC)
        watcher = await client.subscribe(TOPIC, "watch", initial_position="earliest")
        open_txn = await client.new_transaction()
        await producer.send(b"open", txn=open_txn)
        await dedup_broker.restart()
        # The transaction lives on in the restarted coordinator: it is not silently replaced.
        await open_txn.commit()
        txn = await client.new_transaction()
        await producer.send(b"new", txn=txn)
        await txn.commit()
        assert [(await watcher.receive(timeout=5)).data for _ in range(2)] == [b"open", b"new"]


async def test_close_during_an_outage_does_not_hang(dedup_broker):
    client = Client(dedup_broker.url, operation_timeout_seconds=1)
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "outage")
    await dedup_broker.stop()
    pending = producer.send_async(b"never")
    await asyncio.wait_for(client.close(), 5)
    with pytest.raises(AlreadyClosedError):
        await pending
    assert consumer._handlers[-1].state != READY


async def test_sends_waiting_for_their_registration_are_written_once_across_a_restart(dedup_broker, monkeypatch):
    """A txn's first sends wait for ADD_PARTITION_TO_TXN while the broker restarts: they are
    written once, after it, on the new connection, and a plain send behind them stays behind."""
    async with Client(dedup_broker.url, operation_timeout_seconds=15) as client:
        producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_publish_delay_ms=5)
        watcher = await client.subscribe(TOPIC, "blocked", initial_position="earliest")
        first = await client.new_transaction()       # the topic takes transactions before the test
        await producer.send(b"first", txn=first)
        await first.commit()
        registered = answer_registrations_when_set(client, monkeypatch)
        txn = await client.new_transaction()
        sent = [producer.send_async(b"t%d" % i, txn=txn) for i in range(3)]
        plain = producer.send_async(b"plain")
        await asyncio.sleep(0.1)
        assert not any(f.done() for f in [*sent, plain])
        await dedup_broker.restart()
        registered.set()
        ids = await asyncio.wait_for(asyncio.gather(*sent, plain), 15)
        assert ids == sorted(ids) and all(i.entry_id >= 0 for i in ids)
        await txn.commit()
        got = await drain(watcher, timeout=3)
        assert [m.data for m in got] == [b"first", b"t0", b"t1", b"t2", b"plain"]
