"""An embedded broker whose metadata store is shared (a cluster's: etcd, or a store the caller
passes to several brokers) attaches to existing segments only, as the wire does.

Before, the embedding API created a missing `segment://` topic on first use whatever the store.
A broker of a cluster that did so for a segment served by another broker held an empty copy of
it, and an empty segment's recovery takes it for one created again under its name: it cleared
the segment's v5 state in the shared store (the op records of its open transactions), so the
real segment's open transaction no longer held back its read horizon, and the transaction's
entry was readable before its decision."""

import pytest

from pyengine.broker import Broker
from pyengine.errors import TopicNotFoundError
from pyengine.metadata.memory_store import MemoryMetadataStore
from pyengine.transaction.coordinator.metadata_records import IDX_WRITES

SEGMENT = "segment://public/default/shared/0000-ffff-0"


async def write_records(store) -> int:
    return len(await store.range_query(IDX_WRITES, prefix=(SEGMENT,)))


async def test_a_cluster_broker_makes_no_copy_of_a_segment_it_does_not_serve(tmp_path):
    store = await MemoryMetadataStore().start()
    try:
        async with Broker.embedded(tmp_path / "a", sync=False, metadata_store=store) as a, \
                Broker.embedded(tmp_path / "b", sync=False, metadata_store=store) as b:
            await a.service.get_topic(SEGMENT)      # made by its controller, served by `a`
            producer = await a.create_producer(SEGMENT)
            txn = await a.new_transaction(version=5)
            await producer.send(b"undecided", txn=txn)
            assert await write_records(store) == 1
            with pytest.raises(TopicNotFoundError, match="does not exist on this broker"):
                await b.create_producer(SEGMENT)
            with pytest.raises(TopicNotFoundError):
                await b.subscribe(SEGMENT, "sub", initial_position="earliest")
            assert SEGMENT not in b.service.topics and not b.service.topic_exists(SEGMENT)
            assert await write_records(store) == 1  # the open txn's record is still there
            topic = a.service.topics[SEGMENT]
            assert topic.buffer.max_read_position() < topic.ledger.lac       # still held back
            await txn.abort()
    finally:
        await store.close()


@pytest.mark.parametrize("metadata_store", ["lmdb", "memory"])
async def test_a_broker_with_its_own_store_makes_a_segment_on_first_use(tmp_path, metadata_store):
    async with Broker.embedded(tmp_path, sync=False, metadata_store=metadata_store) as broker:
        producer = await broker.create_producer(SEGMENT)
        await producer.send(b"m")
        assert broker.service.topic_exists(SEGMENT)
