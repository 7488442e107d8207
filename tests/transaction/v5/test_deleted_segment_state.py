"""A deleted v5 topic leaves no transaction state behind: its stored aborted set
(`/txn-buffer/<segment>`) went on forever before (found by an audit, PIP-473 GC)."""

from __future__ import annotations

from pyengine.broker import Broker
from pyengine.transaction.coordinator.metadata_records import buffer_path

SEGMENT = "segment://public/default/gone/0000-ffff-0"


async def test_deleting_a_segment_removes_its_stored_aborted_set(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(SEGMENT)
        txn = await broker.new_transaction(version=5)
        await producer.send(b"aborted", txn=txn)
        await txn.abort()
        store = broker.service.metadata
        topic = broker.service.topics[SEGMENT]
        await topic.buffer.wait_materialised()
        assert await store.get(buffer_path(SEGMENT)) is not None
        await producer.close()
        await broker.service.delete_topic(SEGMENT)
        assert await store.get(buffer_path(SEGMENT)) is None
