"""A v5 ack request of several op records is applied whole or not at all, also across a
restart: the metadata store has no multi-record write, so a request whose records were
written in part (a put failed, then deleting those already written failed too, or the broker
died between the puts) left records that the replay applied as acks of their own - acks the
consumer had been told failed."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import PersistenceError
from pyengine.metadata import MetadataStoreError
from pyengine.protocol.pulsar_api_pb2 import CommandSubscribe
from pyengine.storage import ManagedLedger
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_records import IDX_ACKS, V5_COORDINATOR_ID, op_prefix
from pyengine.transaction.pendingack import IndividualAck
from pyengine.transaction.pendingack.metadata_store import MetadataPendingAckHandle, MetadataPendingAckStore

from .conftest import SEGMENT, eventually
from .test_failed_writes import fail_once

SUB = "sub"


async def open_sub(v5, entries: int = 0, sub_type=CommandSubscribe.Shared):
    ledger = await ManagedLedger.open(v5.env, SEGMENT)
    v5.ledgers.append(ledger)
    positions = [await ledger.append(b"m%d" % i) for i in range(entries)]
    cursor = await ledger.open_cursor(SUB, "earliest")
    store = MetadataPendingAckStore(v5.store, SEGMENT, SUB, metrics=v5.metrics)
    handle = MetadataPendingAckHandle(cursor, store, v5.headers, subscription_type=sub_type)
    await handle.replay()
    return cursor, handle, positions


def nth_op_record_put_fails(v5, txn, n: int) -> None:
    puts = []
    fail_once(v5.store, "put", MetadataStoreError("the store is unreachable"),
              lambda path, *a, **k: path == op_prefix(txn) and puts.append(path) is None and len(puts) == n)


async def test_a_partly_written_request_whose_undoing_failed_is_not_applied_after_a_restart(v5, clock):
    cursor, handle, positions = await open_sub(v5, 3)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(txn, [IndividualAck(positions[0])])
    nth_op_record_put_fails(v5, txn, 2)
    fail_once(v5.store, "delete", MetadataStoreError("the store is still unreachable"),
              lambda path, *a, **k: path.startswith(op_prefix(txn)))
    with pytest.raises(PersistenceError):
        await handle.individual_ack(txn, [IndividualAck(positions[1]), IndividualAck(positions[2])])
    await handle.close()
    await v5.restart()                                  # before the txn's decision
    cursor, handle, _ = await open_sub(v5)
    assert not handle.is_fully_pending(positions[1])    # refused: nothing of it is held
    await v5.coordinator.end_transaction(txn, TxnAction.COMMIT)
    await eventually(lambda: cursor.is_acked(positions[0]))
    await handle.wait_materialised()
    assert not cursor.is_acked(positions[1]) and not cursor.is_acked(positions[2])
    assert await v5.store.range_query(IDX_ACKS, prefix=(SEGMENT, SUB)) == []
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 1
    await handle.close()


async def test_a_cumulative_ack_in_a_batch_written_in_part_is_not_applied_after_a_restart(v5):
    """Its cumulative part landed, its batch part did not: the replay held everything up to
    the cumulative position for the txn, which the consumer was told had failed."""
    cursor, handle, positions = await open_sub(v5, 3, CommandSubscribe.Exclusive)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    nth_op_record_put_fails(v5, txn, 2)
    fail_once(v5.store, "delete", MetadataStoreError("the store is still unreachable"),
              lambda path, *a, **k: path.startswith(op_prefix(txn)))
    with pytest.raises(PersistenceError):
        await handle.cumulative_ack_in_batch(txn, positions[1], IndividualAck(positions[2], 4, (0b1110,)))
    await handle.close()
    await v5.restart()
    cursor, handle, _ = await open_sub(v5, 0, CommandSubscribe.Exclusive)
    assert handle.cumulative_ack_of_txn is None
    await v5.coordinator.end_transaction(txn, TxnAction.COMMIT)
    await eventually(lambda: handle.metadata._paths == {})
    await handle.wait_materialised()
    assert cursor.mark_delete < positions[0]
    assert await v5.store.range_query(IDX_ACKS, prefix=(SEGMENT, SUB)) == []
    await handle.close()


async def test_a_whole_request_of_several_records_is_applied_after_a_restart(v5):
    cursor, handle, positions = await open_sub(v5, 3)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(txn, [IndividualAck(positions[1]), IndividualAck(positions[2])])
    await handle.close()
    await v5.restart()
    cursor, handle, _ = await open_sub(v5)
    assert handle.is_fully_pending(positions[1]) and handle.is_fully_pending(positions[2])
    await v5.coordinator.end_transaction(txn, TxnAction.COMMIT)
    await eventually(lambda: cursor.is_acked(positions[1]) and cursor.is_acked(positions[2]))
    await handle.wait_materialised()
    assert await v5.store.range_query(IDX_ACKS, prefix=(SEGMENT, SUB)) == []
    await handle.close()


async def test_a_request_straddling_the_decision_is_not_applied_in_part_after_a_restart(v5, clock):
    """Its first record landed before the commit, its second after: refused whole (the late-ack
    race), but a crash left its records. The replay dropped the late record only, and applied
    the other - part of an ack the consumer was told had failed."""
    cursor, handle, positions = await open_sub(v5, 3)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(txn, [IndividualAck(positions[0])])
    put, puts = v5.store.put, []

    async def commit_before_the_second_record(path, *args, **kwargs):
        if path == op_prefix(txn):
            puts.append(path)
            if len(puts) == 2:
                await v5.coordinator.end_transaction(txn, TxnAction.COMMIT)
        return await put(path, *args, **kwargs)

    v5.store.put = commit_before_the_second_record

    async def crashed_before_the_delete(seqs):
        raise RuntimeError("the broker died here")
    handle.metadata.delete_records = crashed_before_the_delete
    with pytest.raises(RuntimeError):
        await handle.individual_ack(txn, [IndividualAck(positions[1]), IndividualAck(positions[2])])
    v5.store.put = put
    await handle.close()
    await v5.restart()
    cursor, handle, _ = await open_sub(v5)
    await eventually(lambda: cursor.is_acked(positions[0]))
    await handle.wait_materialised()
    assert not cursor.is_acked(positions[1]) and not cursor.is_acked(positions[2])
    assert await v5.store.range_query(IDX_ACKS, prefix=(SEGMENT, SUB)) == []
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 1
    await handle.close()
