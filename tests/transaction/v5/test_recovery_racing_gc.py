"""A participant recovering from the store while the coordinator's GC sweep collects a
finished transaction it holds records of (PIP-473 "Garbage collection": the sweep force-deletes
the op records of participants that never materialised, then the header).

The sweep's steps are ordered so that every moment is safe for a reader that looks at the
store in the right order: an abort is added to the segment's stored aborted set before its op
records go, and the op records go before the header. These tests run the sweep exactly between
the steps of a recovery and check that nothing committed is hidden, nothing aborted becomes
visible, and no pending ack is left hanging."""

from __future__ import annotations

import asyncio

from pyengine.protocol.pulsar_api_pb2 import CommandSubscribe
from pyengine.storage import ManagedLedger
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_records import (
    IDX_ACKS,
    IDX_WRITES,
    V5_COORDINATOR_ID,
    header_path,
)
from pyengine.transaction.pendingack import IndividualAck
from pyengine.transaction.pendingack.metadata_store import MetadataPendingAckHandle, MetadataPendingAckStore
from pyengine_kernels import Position

from .conftest import SEGMENT, eventually

COMMIT, ABORT = TxnAction.COMMIT, TxnAction.ABORT
SUB = "sub"


def visible(ledger, buffer) -> list[bytes]:
    horizon = buffer.max_read_position()
    return [bytes(e.data) for e in ledger.read_entries(Position.EARLIEST, 10**6, horizon) if not buffer.hides(e)]


def gc_around_range_query(v5, index: str, *, before: bool) -> list[int]:
    """Run the coordinator's GC sweep once, just before (or just after) the next range query
    of `index`: what a sweep on another broker may do while a participant recovers."""
    real = v5.store.range_query
    collected: list[int] = []

    async def range_query(name, *args, **kwargs):
        if name != index or collected:
            return await real(name, *args, **kwargs)
        if before:
            collected.append(await v5.coordinator.collect_garbage())
            return await real(name, *args, **kwargs)
        records = await real(name, *args, **kwargs)
        collected.append(await v5.coordinator.collect_garbage())
        return records

    v5.store.range_query = range_query
    return collected


async def test_an_abort_collected_as_the_buffer_recovers_stays_hidden(v5, clock):
    """The buffer read its stored aborted set, then the sweep recorded the abort there and
    deleted the op records, then the buffer queried its writes: it knew the txn from neither,
    so the aborted message became visible (and its next save dropped the abort for good)."""
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"aborted")
    await ledger.append(b"plain")
    await v5.restart()                                    # the segment is not loaded meanwhile
    await v5.coordinator.end_transaction(txn, ABORT)
    clock.now += 10_000
    collected = gc_around_range_query(v5, IDX_WRITES, before=True)
    ledger, buffer = await v5.buffer()
    assert collected == [1] and await v5.store.get(header_path(txn)) is None
    await buffer.wait_materialised()
    assert buffer.is_txn_aborted(txn)
    assert visible(ledger, buffer) == [b"plain"]


async def test_a_commit_collected_as_the_buffer_recovers_stays_visible(v5, clock):
    """The buffer found the committed txn's op records, then the sweep collected them and the
    header: the missing header was taken for an abort, hiding committed messages for good."""
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"committed")
    await v5.restart()
    await v5.coordinator.end_transaction(txn, COMMIT)
    clock.now += 10_000
    collected = gc_around_range_query(v5, IDX_WRITES, before=False)
    ledger, buffer = await v5.buffer()
    assert collected == [1] and await v5.store.get(header_path(txn)) is None
    await buffer.wait_materialised()
    assert not buffer.is_txn_aborted(txn)
    assert visible(ledger, buffer) == [b"committed"]
    await v5.restart()                                    # and it stays visible
    ledger, buffer = await v5.buffer()
    assert visible(ledger, buffer) == [b"committed"]


async def test_acks_of_an_abort_collected_during_replay_are_released(v5, clock):
    """The pending-ack handle loaded the aborted txn's ack records, then the sweep deleted them
    and the header: the handle waited for a decision on a header that no longer exists, so
    the acked messages stayed reserved (never redelivered) for good."""
    ledger = await ManagedLedger.open(v5.env, SEGMENT)
    v5.ledgers.append(ledger)
    positions = [await ledger.append(b"m%d" % i) for i in range(2)]
    cursor = await ledger.open_cursor(SUB, "earliest")
    handle = MetadataPendingAckHandle(cursor, MetadataPendingAckStore(v5.store, SEGMENT, SUB), v5.headers,
                                      subscription_type=CommandSubscribe.Shared)
    await handle.replay()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(txn, [IndividualAck(positions[0])])
    await handle.close()                                  # the subscription is not loaded meanwhile
    await v5.coordinator.end_transaction(txn, ABORT)
    clock.now += 10_000
    collected = gc_around_range_query(v5, IDX_ACKS, before=False)
    released: list[Position] = []
    handle = MetadataPendingAckHandle(cursor, MetadataPendingAckStore(v5.store, SEGMENT, SUB), v5.headers,
                                      subscription_type=CommandSubscribe.Shared,
                                      on_release=lambda positions, txn: released.extend(positions))
    await handle.replay()
    assert collected == [1] and await v5.store.get(header_path(txn)) is None
    await eventually(lambda: not handle.is_fully_pending(positions[0]), timeout=2.0)
    await handle.wait_materialised()
    assert not cursor.is_acked(positions[0])
    await asyncio.sleep(0)
    await handle.close()
