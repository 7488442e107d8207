"""v5 (PIP-473) writes that fail after memory already changed for them: a retry, a later
decision or a restart must reach what the store and the client were told, never more."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import PersistenceError, TransactionConflictError
from pyengine.metadata import MetadataStoreError
from pyengine.protocol.pulsar_api_pb2 import CommandSubscribe
from pyengine.storage import ManagedLedger, StorageError
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_records import IDX_ACKS, IDX_WRITES, V5_COORDINATOR_ID, op_prefix
from pyengine.transaction.pendingack import IndividualAck
from pyengine.transaction.pendingack.metadata_store import MetadataPendingAckHandle, MetadataPendingAckStore
from pyengine_kernels import Position

from .conftest import SEGMENT, eventually

COMMIT, ABORT = TxnAction.COMMIT, TxnAction.ABORT
SUB = "sub"


def visible(ledger, buffer) -> list[bytes]:
    horizon = buffer.max_read_position()
    return [bytes(e.data) for e in ledger.read_entries(Position.EARLIEST, 10**6, horizon) if not buffer.hides(e)]


def fail_once(target, name: str, error: Exception, when=lambda *args, **kwargs: True) -> list:
    """The next call of `target.name` that `when` accepts raises `error`; returns the calls failed."""
    real, failed = getattr(target, name), []

    async def failing(*args, **kwargs):
        if not failed and when(*args, **kwargs):
            failed.append(args)
            raise error
        return await real(*args, **kwargs)

    setattr(target, name, failing)
    return failed


def op_record_of(txn):
    return lambda path, *args, **kwargs: path == op_prefix(txn)


async def test_a_send_whose_op_record_failed_is_never_visible(v5):
    """The entry is appended, then its op record fails: the sender is told the send failed,
    yet the entry landed (LMDB: the record's failure does not fail the group commit; a
    separate store: the record is a write of its own). Its txn's commit made the failed send
    visible, live and after a restart."""
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"sent")
    failed = fail_once(v5.store, "put", MetadataStoreError("the store is unreachable for a moment"),
                       op_record_of(txn))
    with pytest.raises(PersistenceError, match="op record"):
        await buffer.append(txn, b"failed")
    assert failed
    await ledger.append(b"plain")
    await v5.coordinator.end_transaction(txn, COMMIT)
    await eventually(lambda: buffer.max_read_position() == ledger.lac)
    await buffer.wait_materialised()
    assert visible(ledger, buffer) == [b"sent", b"plain"]
    await v5.restart()
    ledger, buffer = await v5.buffer()
    assert visible(ledger, buffer) == [b"sent", b"plain"]


async def test_an_open_txns_entry_whose_op_record_failed_is_not_exposed_by_a_restart(v5):
    """LMDB: entry and op record share a group commit, and nothing else ties the entry to its
    txn. The record failed, the entry landed: after a restart no record named the txn here, so
    the entry of a txn still OPEN was delivered - and stayed so after the txn's abort."""
    if v5.backend.name != "lmdb":
        return          # a separate store records a txn's first entry here before appending it
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    fail_once(v5.store, "put", MetadataStoreError("metadata write failed"), op_record_of(txn))
    with pytest.raises(PersistenceError, match="op record"):
        await buffer.append(txn, b"failed")
    await ledger.append(b"plain")
    await v5.restart()
    ledger, buffer = await v5.buffer()
    assert visible(ledger, buffer) == [b"plain"]              # the txn is still OPEN
    await v5.coordinator.end_transaction(txn, ABORT)
    await ledger.append(b"after")
    assert visible(ledger, buffer) == [b"plain", b"after"]


async def test_a_late_write_whose_hiding_failed_to_save_stays_hidden_after_the_commit_is_materialised(v5):
    """A late write (after its txn's commit): saving its position as hidden fails. Memory hid
    it; the commit's materialisation then deleted its op record, the only other thing that
    hides it after a restart: the restart delivered a write its sender was told had failed."""
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"in-time")
    v5.headers._on_notification = lambda notification: None     # the commit is not seen yet
    await v5.coordinator.end_transaction(txn, COMMIT)
    failed = fail_once(ledger, "_put_topic_record", StorageError("the group commit failed"))
    with pytest.raises(Exception) as refused:
        await buffer.append(txn, b"late")
    assert failed and isinstance(refused.value, (TransactionConflictError, PersistenceError, StorageError))
    assert visible(ledger, buffer) == []
    await buffer.commit(txn, -1)                          # what the header says, materialised here
    await buffer.wait_materialised()
    assert visible(ledger, buffer) == [b"in-time"]
    assert await v5.store.range_query(IDX_WRITES, prefix=(SEGMENT,)) == []
    await v5.restart()
    ledger, buffer = await v5.buffer()
    assert visible(ledger, buffer) == [b"in-time"]


# --- pending acks ---------------------------------------------------------------------------

async def open_sub(v5, entries: int = 0):
    ledger = await ManagedLedger.open(v5.env, SEGMENT)
    v5.ledgers.append(ledger)
    positions = [await ledger.append(b"m%d" % i) for i in range(entries)]
    cursor = await ledger.open_cursor(SUB, "earliest")
    store = MetadataPendingAckStore(v5.store, SEGMENT, SUB, metrics=v5.metrics)
    handle = MetadataPendingAckHandle(cursor, store, v5.headers, subscription_type=CommandSubscribe.Shared)
    await handle.replay()
    return cursor, handle, positions


async def ack_records(v5):
    return await v5.store.range_query(IDX_ACKS, prefix=(SEGMENT, SUB))


async def test_an_ack_request_whose_undoing_failed_is_never_applied(v5, clock):
    """A request of two op records: the second fails, and deleting the first (all or nothing)
    fails too. The ack was refused and released here, but its first record stayed behind,
    known to nobody: the commit kept it (so the GC never collected the txn) and the next
    replay applied it - an ack the consumer was told had failed."""
    cursor, handle, positions = await open_sub(v5, 3)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(txn, [IndividualAck(positions[0])])
    puts = []
    fail_once(v5.store, "put", MetadataStoreError("the store is unreachable"),
              lambda path, *a, **k: path == op_prefix(txn) and puts.append(path) is None and len(puts) == 2)
    fail_once(v5.store, "delete", MetadataStoreError("the store is still unreachable"),
              lambda path, *a, **k: path.startswith(op_prefix(txn)))
    with pytest.raises(PersistenceError):
        await handle.individual_ack(txn, [IndividualAck(positions[1]), IndividualAck(positions[2])])
    assert not handle.is_fully_pending(positions[1])            # refused: nothing reserved
    await v5.coordinator.end_transaction(txn, COMMIT)
    await eventually(lambda: cursor.is_acked(positions[0]))
    await handle.wait_materialised()
    assert not cursor.is_acked(positions[1])
    assert await ack_records(v5) == []                          # the refused record went too
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 1
    await handle.close()
    await v5.restart()
    cursor, handle, _ = await open_sub(v5)
    await asyncio.sleep(0.1)                        # a decision found by the replay is applied soon
    await handle.wait_materialised()
    assert cursor.is_acked(positions[0]) and not cursor.is_acked(positions[1])
    await handle.close()


async def test_a_refused_late_ack_whose_delete_failed_goes_with_its_txn(v5, clock):
    """The late ack's record (after the commit) is refused, but deleting it fails: the
    handle forgot it at once, so the commit's materialisation left it, and the GC (which
    keeps a committed txn while ack records wait for their subscription) never collected
    the txn until a restart."""
    cursor, handle, positions = await open_sub(v5, 2)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(txn, [IndividualAck(positions[0])])
    v5.headers._on_notification = lambda notification: None     # the commit is not seen yet
    await v5.coordinator.end_transaction(txn, COMMIT)
    fail_once(v5.store, "delete", MetadataStoreError("the store is unreachable for a moment"),
              lambda path, *a, **k: path.startswith(op_prefix(txn)))
    with pytest.raises((TransactionConflictError, MetadataStoreError)):
        await handle.individual_ack(txn, [IndividualAck(positions[1])])
    assert len(await ack_records(v5)) == 2
    await handle.commit(txn, -1)                    # what the header says, applied here
    await handle.wait_materialised()
    assert cursor.is_acked(positions[0]) and not cursor.is_acked(positions[1])
    assert await ack_records(v5) == []
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 1
    await handle.close()


async def test_a_late_ack_record_whose_delete_failed_at_replay_goes_with_its_txn(v5, clock):
    """The replay drops a refused late ack's record (left by a crash) and deleting it fails:
    it stayed in the store until another restart, and kept the committed txn from the GC."""
    cursor, handle, positions = await open_sub(v5, 2)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(txn, [IndividualAck(positions[0])])
    v5.headers._on_notification = lambda notification: None     # the commit is not seen yet
    await v5.coordinator.end_transaction(txn, COMMIT)

    async def crashed_before_the_delete(seqs):
        raise RuntimeError("the broker died here")
    handle.metadata.delete_records = crashed_before_the_delete
    with pytest.raises(RuntimeError):
        await handle.individual_ack(txn, [IndividualAck(positions[1])])
    await handle.close()
    await v5.restart()
    fail_once(v5.store, "delete", MetadataStoreError("the store is unreachable for a moment"),
              lambda path, *a, **k: path.startswith(op_prefix(txn)))
    cursor, handle, _ = await open_sub(v5)
    await eventually(lambda: cursor.is_acked(positions[0]))
    await handle.wait_materialised()
    assert not cursor.is_acked(positions[1]) and handle.late_acks_rejected == 1
    assert await ack_records(v5) == []
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 1
    await handle.close()


async def test_op_records_whose_delete_failed_are_deleted_by_the_retry(v5, clock):
    """Materialising a commit, deleting the op records fails: they were forgotten before the
    deletes, so the retry deleted nothing. A late write's record (written after the commit)
    then kept the txn from the GC for good - it waits for its participant, which was done."""
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"in-time")
    v5.headers._on_notification = lambda notification: None     # the commit is not seen yet
    await v5.coordinator.end_transaction(txn, COMMIT)
    deletes = []
    fail_once(v5.store, "delete", MetadataStoreError("the store is unreachable for a moment"),
              lambda path, *a, **k: path.startswith(op_prefix(txn)) and deletes.append(path) is None
              and len(deletes) == 2)
    fail_once(v5.store, "delete", MetadataStoreError("the store is unreachable for a moment"),
              lambda path, *a, **k: path.startswith(op_prefix(txn)))
    with pytest.raises((TransactionConflictError, MetadataStoreError)):
        await buffer.append(txn, b"late")             # refused; deleting its record fails
    await buffer.commit(txn, -1)                      # deleting one of the records fails again
    await eventually(lambda: len(deletes) >= 2)
    await buffer.wait_materialised()                  # the retry included
    assert visible(ledger, buffer) == [b"in-time"]
    assert await v5.store.range_query(IDX_WRITES, prefix=(SEGMENT,)) == []
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 1
