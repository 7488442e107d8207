"""De-duplication records a producer's sequence id only with its stored entry: a send whose
entry was never written must not come back, after a restart, as "already published" - its
retry would be answered as a duplicate and the message silently lost (Pulsar's
MessageDeduplication records a sequence id as persisted only once its entry is added)."""

import asyncio

from pyengine.broker import Broker
from pyengine.broker.topic import Producer
from pyengine.storage.errors import StorageError
from tests.broker.helpers import GatedWriter, drain

T = "persistent://public/default/dedup-failed-writes"


async def test_sends_failed_behind_a_failed_commit_are_stored_when_retried_after_a_restart(tmp_path):
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        gate = GatedWriter(broker.service.env)
        first = asyncio.ensure_future(producer.send(b"m0", sequence_id=0))
        await gate.next_commit()                        # m0's commit is being written
        second = asyncio.ensure_future(producer.send(b"m1", sequence_id=1))    # queued behind it
        await asyncio.sleep(0)
        gate.let_through(StorageError("the disk failed"))
        outcomes = await asyncio.gather(first, second, return_exceptions=True)
        assert all(isinstance(outcome, Exception) for outcome in outcomes), outcomes
        gate.open()
        await broker.service.env.barrier()              # whatever else was queued is written
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        assert producer.last_sequence_id == -1          # nothing of "p" was stored
        retried = [await producer.send(b"m0", sequence_id=0), await producer.send(b"m1", sequence_id=1)]
        assert all(message_id.entry_id >= 0 for message_id in retried), retried
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        assert [m.data for m in await drain(consumer)] == [b"m0", b"m1"]


async def test_a_send_refused_at_once_is_not_recorded(tmp_path):
    # The transaction buffer refuses a send of a txn it saw end (Apache's "Transaction ... has
    # been ended"): the future fails before anything is queued for it.
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        txn = await broker.new_transaction()
        await producer.send(b"t0", sequence_id=0, txn=txn)
        await txn.abort()
        topic = broker.service.topics[T]
        attached: Producer = producer._producer
        refused = topic.publish(attached, b"ignored", sequence_id=1, txn=txn.txn_id)
        assert isinstance(refused.exception(), Exception)
        await broker.service.env.barrier()
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        assert producer.last_sequence_id == 0
        assert (await producer.send(b"m1", sequence_id=1)).entry_id >= 0
