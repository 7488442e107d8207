"""A v5 transactional append still under way when its segment is deleted leaves no op record.

With a metadata store apart from the data dir (etcd, or one the caller passes), a txn's first
append to a segment writes its op record before the entry. The buffer's close did not wait
for appends under way: one whose op record was being written while the segment was deleted
wrote it after the deletion had cleared the segment's v5 state. The record then named a
segment that no longer existed: the GC sweep would store the abort of its txn for a segment
created again under the name, and a commit's header would wait for a participant that is
gone. Now the close waits for appends under way, and an append that finds its buffer closed
after a wait writes nothing more."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from pyengine.broker import Broker
from pyengine.errors import PulsarError
from pyengine.metadata.memory_store import MemoryMetadataStore
from pyengine.transaction.coordinator.metadata_records import IDX_WRITES, OP_PREFIX

from .conftest import Gate

SEGMENT = "segment://public/default/deleted-under-an-append/0000-ffff-0"


@contextlib.asynccontextmanager
async def segment_of_a_cluster(tmp_path):
    """A broker on a store the caller passes, a producer on a segment, an open v5 txn."""
    store = await MemoryMetadataStore().start()
    try:
        async with Broker.embedded(tmp_path, sync=False, metadata_store=store) as broker:
            await broker.service.get_topic(SEGMENT)
            producer = await broker.create_producer(SEGMENT)
            yield broker, store, producer, await broker.new_transaction(version=5)
    finally:
        await store.close()


async def delete_during(broker, gate: Gate, send: asyncio.Future) -> None:
    """Delete the segment while `send` is held at the gate; release it; the send fails."""
    await gate.held.wait()
    deletion = asyncio.ensure_future(broker.service.delete_topic(SEGMENT))
    await asyncio.sleep(0.05)
    gate.released.set()
    await deletion
    with pytest.raises(PulsarError):
        await send


async def test_an_op_record_being_written_during_the_deletion_goes_with_the_segment(tmp_path):
    async with segment_of_a_cluster(tmp_path) as (broker, store, producer, txn):
        gate, put = Gate(), store.put
        store.put = gate.wrap(put, lambda path, *rest: path.startswith(OP_PREFIX))
        send = asyncio.ensure_future(producer.send(b"under way", txn=txn))
        await delete_during(broker, gate, send)
        assert await store.range_query(IDX_WRITES, prefix=(SEGMENT,)) == []
        store.put = put
        await txn.abort()


async def test_an_append_waiting_for_its_header_when_the_segment_goes_writes_nothing(tmp_path):
    async with segment_of_a_cluster(tmp_path) as (broker, store, producer, txn):
        gate, headers = Gate(), broker.service.v5.headers
        headers.get = gate.wrap(headers.get)
        op_records_written = []
        put = store.put

        async def counting_put(path, *args, **kwargs):
            if path.startswith(OP_PREFIX):
                op_records_written.append(path)
            return await put(path, *args, **kwargs)

        store.put = counting_put
        send = asyncio.ensure_future(producer.send(b"under way", txn=txn))
        await delete_during(broker, gate, send)
        assert op_records_written == []
        assert await store.range_query(IDX_WRITES, prefix=(SEGMENT,)) == []
        del headers.get
        await txn.abort()
