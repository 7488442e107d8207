"""A failed send of a producer must not make de-duplication forget the later sends of that
producer still being written: before, the failure set the producer's highest pushed sequence id
back to its highest stored one, so a retry of a later send still in flight was taken as new and
stored a second time (Pulsar resets highestSequencedPushed only once no write is pending).

Here the first transactional send on the topic fails (the topic could not be marked
transactional) while a plain send of the same producer, queued in the next group commit, goes
on; that plain send retried while in flight must be answered by the original, not stored again."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.errors import PersistenceError
from pyengine.storage.errors import StorageError
from tests.broker.helpers import GatedWriter

T = "persistent://public/default/dedup-failed-send-in-flight"


async def test_a_retry_of_a_send_in_flight_is_not_stored_twice_after_an_earlier_send_failed(tmp_path):
    async with Broker.embedded(tmp_path, deduplication_enabled=True, sync=False) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        await producer.send(b"m0", sequence_id=0)
        txn = await broker.new_transaction()
        topic = broker.service.topics[T]
        attached = producer._producer
        gate = GatedWriter(broker.service.env)
        try:
            # Sequence id 1, in a txn: waits for the topic's transactional mark (a commit, held).
            in_txn = topic.publish(attached, b"t1", sequence_id=1, txn=txn.txn_id)
            await gate.next_commit()
            plain = topic.publish(attached, b"m2", sequence_id=2)     # queued in the next commit
            gate.let_through(StorageError("the disk failed"))       # the mark fails: so does t1
            with pytest.raises(PersistenceError):
                await in_txn
            assert not plain.done()
            retried = topic.publish(attached, b"m2", sequence_id=2)   # m2 is still being written
        finally:
            gate.open()
        first, again = await asyncio.gather(plain, retried)
        assert again == first
        stored = topic.ledger.read_entries(topic.ledger.first_position(), 100)
        assert len(stored) == 2, [e.position for e in stored]       # m0 and m2 once
