"""A deleted v5 topic leaves no transaction state behind: its stored aborted set
(`/txn-buffer/<segment>`) went on forever before (found by an audit, PIP-473 GC)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.protocol.pulsar_api_pb2 import CommandSubscribe
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_records import IDX_ACKS, V5_COORDINATOR_ID, buffer_path, header_path
from pyengine.transaction.pendingack import IndividualAck
from pyengine.transaction.pendingack.metadata_store import MetadataPendingAckHandle, MetadataPendingAckStore

from .conftest import SEGMENT as V5_SEGMENT
from .conftest import eventually

SEGMENT = "segment://public/default/gone/0000-ffff-0"

# Stores apart from the data dir only: on LMDB the metadata store goes with the data dir (the
# scenario cannot occur there), so this test runs on the memory and etcd stores.
SEPARATE_STORES = pytest.mark.parametrize("backend_name", ["memory", "etcd"])


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


async def test_a_txn_open_when_its_segment_was_deleted_holds_back_no_segment_created_again(tmp_path):
    """Its op record outlived the segment: the segment created again under the name loaded it,
    and nothing written there was readable until that txn ended (up to its timeout)."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(SEGMENT)
        txn = await broker.new_transaction(version=5)
        await producer.send(b"in a txn left open", txn=txn)
        await producer.close()
        await broker.service.delete_topic(SEGMENT)
        producer = await broker.create_producer(SEGMENT)
        await producer.send(b"plain")
        topic = broker.service.topics[SEGMENT]
        assert topic.buffer.ongoing_txns() == []
        assert topic.buffer.max_read_position() == topic.ledger.lac
        consumer = await broker.subscribe(SEGMENT, "sub", initial_position="earliest")
        assert (await consumer.receive(timeout=2)).data == b"plain"


async def test_the_abort_of_a_txn_open_when_its_segment_was_deleted_is_not_stored_for_it(tmp_path):
    """The GC sweep stored the abort in the deleted segment's aborted set again, for good."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(SEGMENT)
        txn = await broker.new_transaction(version=5)
        await producer.send(b"in a txn left open", txn=txn)
        await producer.close()
        await broker.service.delete_topic(SEGMENT)
        await txn.abort()
        coordinator = broker.service.v5.coordinator
        coordinator.retention_ms = 0
        await asyncio.sleep(0.01)
        await coordinator.collect_garbage()     # (or its background sweep did)
        assert await broker.service.metadata.get(header_path(txn.txn_id)) is None
        assert await broker.service.metadata.get(buffer_path(SEGMENT)) is None
        assert await coordinator.count_op_records() == 0


@SEPARATE_STORES
async def test_a_segment_created_again_after_a_crash_in_its_deletion_loads_nothing_of_the_old_one(v5):
    """A crash after the segment's data went but before its metadata-store state did (or the
    segment gone with a data dir): the segment created again elsewhere, whose new ledger has
    the same positions, took the old pending acks (a commit then acked its new message) and
    waited on the old open txn."""
    ledger, buffer, cursor, handle = await open_segment(v5)
    old = await ledger.append(b"old")
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"in the txn")
    await handle.individual_ack(txn, [IndividualAck(old)])
    aborted = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(aborted, b"aborted")
    await v5.coordinator.end_transaction(aborted, TxnAction.ABORT)
    await eventually(lambda: buffer.is_txn_aborted(aborted))
    await buffer.wait_materialised()
    await handle.close()
    store = v5.store
    await v5.stop()
    await v5.start(store=store)                 # another data dir (broker), the same store
    ledger, buffer, cursor, handle = await open_segment(v5)
    first = await ledger.append(b"new 0")
    await ledger.append(b"new 1")
    assert first == old
    assert buffer.ongoing_txns() == [] and buffer.max_read_position() == ledger.lac
    assert not handle.is_fully_pending(first) and await store.get(buffer_path(V5_SEGMENT)) is None
    assert await store.range_query(IDX_ACKS, prefix=(V5_SEGMENT,)) == []
    await v5.coordinator.end_transaction(txn, TxnAction.COMMIT)
    await asyncio.sleep(0.1)
    assert not cursor.is_acked(first)
    await handle.close()


async def open_segment(v5):
    ledger, buffer = await v5.buffer(V5_SEGMENT)
    cursor = await ledger.open_cursor("sub", "earliest")
    store = MetadataPendingAckStore(v5.store, V5_SEGMENT, "sub", metrics=v5.metrics)
    handle = MetadataPendingAckHandle(cursor, store, v5.headers, subscription_type=CommandSubscribe.Shared)
    await handle.replay()
    return ledger, buffer, cursor, handle
