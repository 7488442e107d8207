"""The header cache's resync after its watch fails and is reopened, against the reads of
headers that straddle it: a decision whose notification the broken watch lost must still
reach every participant as soon as the watch is back, not at the deadline re-read (here the
txns time out in 60 s and the test clock never moves, so that re-read never comes).

Windows covered, each held open deterministically:
* a participant's first read of a header is in flight across the failure and the reopen
  (transaction buffer recovery, pending-ack replay);
* the read ended during the outage and the participant subscribes only after the reopen."""

from __future__ import annotations

import asyncio

from pyengine.metadata import MetadataStoreError
from pyengine.protocol.pulsar_api_pb2 import CommandSubscribe
from pyengine.storage import ManagedLedger
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer.metadata_buffer import MetadataTransactionBuffer
from pyengine.transaction.coordinator.metadata_records import (
    V5_COORDINATOR_ID,
    OpRecord,
    buffer_path,
    header_path,
    op_prefix,
    txn_key,
)
from pyengine.transaction.pendingack import IndividualAck
from pyengine.transaction.pendingack.metadata_store import MetadataPendingAckHandle, MetadataPendingAckStore
from pyengine_kernels import AbortedTxnSet, Position, TxnId

from .conftest import SEGMENT, V5, eventually

IN = "segment://public/default/v5-in/0000-ffff-0"
PROMPTLY_S = 1.0           # far below the deadline re-read, which never comes here


class HeldRead:
    """The next read of `path` from the store gets its record, then waits for `release()`
    before returning it (the metadata store answered; the answer is still on its way)."""

    def __init__(self, v5: V5, path: str, monkeypatch) -> None:
        self.answered = asyncio.Event()
        self._released = asyncio.Event()
        real = v5.store.get
        armed = True

        async def get(wanted: str):
            nonlocal armed
            if wanted != path or not armed:
                return await real(wanted)
            armed = False
            record = await real(wanted)
            self.answered.set()
            await self._released.wait()
            return record

        monkeypatch.setattr(v5.store, "get", get)

    def release(self) -> None:
        self._released.set()


async def while_the_watch_is_down(v5: V5, monkeypatch, outage) -> None:
    """The header watch breaks, `outage()` runs (the notifications of what it does are lost
    with the watch), then the watch is reopened and the cache has resynced."""
    over = asyncio.Event()
    reopen = v5.store.range_watch

    async def reopen_after_the_outage(*args, **kwargs):
        await over.wait()
        return await reopen(*args, **kwargs)

    monkeypatch.setattr(v5.store, "range_watch", reopen_after_the_outage)
    broken = v5.headers._watch
    broken._fail(MetadataStoreError("connection to the metadata store lost"))
    await outage()
    over.set()
    await eventually(lambda: v5.headers._watch is not broken, timeout=2)
    await asyncio.sleep(0.02)                   # the resync's own re-reads: a few store round trips


async def commit_while_the_watch_is_down(v5: V5, txn: TxnId, monkeypatch) -> None:
    await while_the_watch_is_down(v5, monkeypatch, lambda: v5.coordinator.end_transaction(txn, TxnAction.COMMIT))


def visible(ledger: ManagedLedger, buffer: MetadataTransactionBuffer) -> list[bytes]:
    horizon = buffer.max_read_position()
    return [bytes(e.data) for e in ledger.read_entries(Position.EARLIEST, 100, horizon) if not buffer.hides(e)]


async def new_buffer(v5: V5) -> tuple[ManagedLedger, MetadataTransactionBuffer]:
    """A buffer for SEGMENT, not recovered yet."""
    ledger = await ManagedLedger.open(v5.env, SEGMENT)
    v5.ledgers.append(ledger)
    buffer = MetadataTransactionBuffer(ledger, v5.store, v5.headers, metrics=v5.metrics)
    v5.buffers.append(buffer)
    return ledger, buffer


async def test_buffer_recovery_reading_a_header_across_a_watch_reopen_sees_the_commit(v5, monkeypatch):
    _ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"t")
    await v5.restart()                          # an empty cache: recovery reads the header
    ledger, buffer = await new_buffer(v5)
    held = HeldRead(v5, header_path(txn), monkeypatch)
    recovering = asyncio.create_task(buffer.recover())
    await held.answered.wait()                  # OPEN, not returned yet
    await commit_while_the_watch_is_down(v5, txn, monkeypatch)
    held.release()
    await recovering
    await eventually(lambda: visible(ledger, buffer) == [b"t"], timeout=PROMPTLY_S)
    assert v5.headers.rechecks_resolved == 0    # not the deadline re-read


async def test_buffer_recovery_subscribing_after_the_reopen_to_a_header_read_before_sees_the_commit(
        v5, monkeypatch):
    """Recovery read the header (OPEN, cached) and waits on its aborted set while the watch
    fails, the txn commits and the watch is reopened; it subscribes only afterwards."""
    _ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"t")
    await v5.restart()
    ledger, buffer = await new_buffer(v5)
    held = HeldRead(v5, buffer_path(SEGMENT), monkeypatch)
    recovering = asyncio.create_task(buffer.recover())
    await held.answered.wait()
    assert not v5.headers.cached(txn).header.state.final and txn not in v5.headers.watched()
    await commit_while_the_watch_is_down(v5, txn, monkeypatch)
    held.release()
    await recovering
    await eventually(lambda: visible(ledger, buffer) == [b"t"], timeout=PROMPTLY_S)
    assert v5.headers.rechecks_resolved == 0


async def test_pending_ack_replay_reading_a_header_across_a_watch_reopen_sees_the_commit(v5, monkeypatch):
    source = await ManagedLedger.open(v5.env, IN)
    v5.ledgers.append(source)
    consumed = await source.append(b"input")
    cursor = await source.open_cursor("sub", "earliest")
    acks = MetadataPendingAckHandle(cursor, MetadataPendingAckStore(v5.store, IN, "sub", metrics=v5.metrics),
                                    v5.headers, subscription_type=CommandSubscribe.Shared)
    await acks.replay()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await acks.individual_ack(txn, [IndividualAck(consumed)])
    await acks.close()
    await v5.restart()

    source = await ManagedLedger.open(v5.env, IN)
    v5.ledgers.append(source)
    cursor = await source.open_cursor("sub", "earliest")
    acks = MetadataPendingAckHandle(cursor, MetadataPendingAckStore(v5.store, IN, "sub", metrics=v5.metrics),
                                    v5.headers, subscription_type=CommandSubscribe.Shared)
    held = HeldRead(v5, header_path(txn), monkeypatch)
    replaying = asyncio.create_task(acks.replay())
    await held.answered.wait()
    await commit_while_the_watch_is_down(v5, txn, monkeypatch)
    held.release()
    await replaying
    try:
        await eventually(lambda: cursor.is_acked(consumed), timeout=PROMPTLY_S)
        assert v5.headers.rechecks_resolved == 0
    finally:
        await acks.close()


async def collect_while_the_watch_is_down(v5: V5, txn: TxnId, action: TxnAction, clock, monkeypatch) -> None:
    """`txn` ends with `action`, the retention passes and the GC sweep collects it (op records,
    then the header), all while the watch is down: the participant learns only that the
    header is gone."""
    async def end_and_collect() -> None:
        await v5.coordinator.end_transaction(txn, action)
        clock.now += 10_000
        assert await v5.coordinator.collect_garbage() == 1
        assert await v5.store.get(header_path(txn)) is None

    await while_the_watch_is_down(v5, monkeypatch, end_and_collect)


async def test_a_commit_collected_while_the_watch_was_down_stays_visible(v5, clock, monkeypatch):
    """A missing header was taken for an abort on the live path (recovery told a collected
    commit apart already): the committed message was hidden for good, and the abort was saved."""
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"committed")
    await ledger.append(b"plain")
    await collect_while_the_watch_is_down(v5, txn, TxnAction.COMMIT, clock, monkeypatch)
    await eventually(lambda: visible(ledger, buffer) == [b"committed", b"plain"], timeout=PROMPTLY_S)
    await buffer.wait_materialised()
    assert not buffer.is_txn_aborted(txn)
    stored = await v5.store.get(buffer_path(SEGMENT))
    assert stored is None or txn not in AbortedTxnSet.from_bytes(stored.value)


async def test_an_abort_collected_while_the_watch_was_down_stays_hidden(v5, clock, monkeypatch):
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"aborted")
    await ledger.append(b"plain")
    await collect_while_the_watch_is_down(v5, txn, TxnAction.ABORT, clock, monkeypatch)
    await eventually(lambda: visible(ledger, buffer) == [b"plain"], timeout=PROMPTLY_S)
    await buffer.wait_materialised()
    assert buffer.is_txn_aborted(txn)


async def test_a_save_of_the_aborted_set_keeps_the_aborts_the_gc_recorded(v5):
    """The GC sweep records an abort in a segment's stored set for a buffer that never
    materialised it (the step it takes before deleting the op records); the buffer's next save
    of its own set wrote over it, and a restart then took the collected abort for a commit."""
    ledger, buffer = await v5.buffer()
    missed = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    position = await buffer.append(missed, b"missed-abort")
    await v5.coordinator._record_abort(SEGMENT, missed, position)     # the sweep's step
    other = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(other, b"other-abort")
    await v5.coordinator.end_transaction(other, TxnAction.ABORT)
    await eventually(lambda: buffer.is_txn_aborted(other), timeout=PROMPTLY_S)
    await buffer.wait_materialised()                # its save of the set
    stored = AbortedTxnSet.from_bytes((await v5.store.get(buffer_path(SEGMENT))).value)
    assert missed in stored and other in stored


async def test_a_decision_notified_while_the_buffer_recovers_is_applied(v5, monkeypatch):
    """Recovery subscribed to an open txn, then awaited the store (here: checking the op records
    of a txn with no header); the commit notified meanwhile was dropped, as the buffer was not
    ready, and the read horizon stayed behind the committed entry until a reload."""
    _ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"t")
    await v5.restart()
    headless = TxnId(V5_COORDINATOR_ID, 10**9)                # an op record with no header
    await v5.store.put(op_prefix(headless), OpRecord("write", SEGMENT, Position(10**6, 0)).encode(),
                       sequential=True, partition_key=txn_key(headless))
    ledger, buffer = await new_buffer(v5)
    real_any_exists = buffer._any_exists

    async def commit_meanwhile(paths):
        if txn in v5.headers.watched():                       # recovery subscribed to it already
            await v5.coordinator.end_transaction(txn, TxnAction.COMMIT)
            await asyncio.sleep(0.05)                         # its notification arrives
        return await real_any_exists(paths)

    monkeypatch.setattr(buffer, "_any_exists", commit_meanwhile)
    await buffer.recover()
    await eventually(lambda: visible(ledger, buffer) == [b"t"], timeout=PROMPTLY_S)
