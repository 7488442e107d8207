"""MetadataPendingAckStore / MetadataPendingAckHandle (PIP-473) on memory, lmdb and etcd:
ack op records, commit and abort driven by the header watch, the late-ack race, conflicts,
replay, and a restart mid-materialisation."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import NotAllowedError, ServiceNotReadyError, TransactionConflictError
from pyengine.metadata import MetadataStoreError
from pyengine.protocol.pulsar_api_pb2 import CommandSubscribe
from pyengine.storage import ManagedLedger
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_records import IDX_ACKS, V5_COORDINATOR_ID, OpRecord, op_prefix, txn_key
from pyengine.transaction.pendingack import IndividualAck, PendingAckReplayError
from pyengine.transaction.pendingack.metadata_store import MetadataPendingAckHandle, MetadataPendingAckStore
from pyengine_kernels import Position, TxnId

from .conftest import SEGMENT, eventually

SUB = "sub"
COMMIT, ABORT = TxnAction.COMMIT, TxnAction.ABORT


class Sub:
    def __init__(self):
        self.acked: list[Position] = []
        self.released: list[Position] = []
        self.decided: list[tuple[TxnId, bool]] = []        # each decision reported, with its txn

    def on_acked(self, positions: list[Position], *, txn: TxnId) -> None:
        self.acked.extend(positions)
        self.decided.append((txn, True))

    def on_release(self, positions: list[Position], *, txn: TxnId) -> None:
        self.released.extend(positions)
        self.decided.append((txn, False))


async def open_sub(v5, entries: int = 0, sub_type=CommandSubscribe.Shared):
    ledger = await ManagedLedger.open(v5.env, SEGMENT)
    v5.ledgers.append(ledger)
    positions = list(await asyncio.gather(*(ledger.append(b"m%d" % i) for i in range(entries))))
    cursor = await ledger.open_cursor(SUB, "earliest")
    seen = Sub()
    store = MetadataPendingAckStore(v5.store, SEGMENT, SUB, metrics=v5.metrics)
    handle = MetadataPendingAckHandle(cursor, store, v5.headers, subscription_type=sub_type,
                                      on_release=seen.on_release, on_acked=seen.on_acked)
    await handle.replay()
    return ledger, cursor, handle, positions, seen


async def ack_records(v5):
    return await v5.store.range_query(IDX_ACKS, prefix=(SEGMENT, SUB))


async def test_commit_applies_the_acks_when_the_header_turns(v5):
    ledger, cursor, handle, positions, seen = await open_sub(v5, 3)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(txn, [IndividualAck(positions[0]), IndividualAck(positions[2])])
    assert len(await ack_records(v5)) == 2
    assert handle.is_fully_pending(positions[0]) and not cursor.is_acked(positions[0])
    await v5.coordinator.end_transaction(txn, COMMIT)
    await eventually(lambda: cursor.is_acked(positions[0]) and cursor.is_acked(positions[2]))
    await handle.wait_materialised()
    assert seen.acked == [positions[0], positions[2]]
    assert await ack_records(v5) == [] and not cursor.is_acked(positions[1])
    await handle.close()


async def test_a_commit_of_some_indexes_of_a_batch_does_not_report_the_entry_acked(v5):
    # on_acked takes the entries out of flight: reported after a part of a batch, the batch's
    # other messages would never be delivered again.
    ledger, cursor, handle, positions, seen = await open_sub(v5, 1)
    part = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(part, [IndividualAck(positions[0], 3, (0b110,))])      # index 0
    await v5.coordinator.end_transaction(part, COMMIT)
    await eventually(lambda: cursor.batch_ack_set(positions[0]) is not None)
    await handle.wait_materialised()
    assert seen.acked == [] and not cursor.is_acked(positions[0])
    # Still reported, with its txn: the subscription drops what the txn's acks reserved.
    assert seen.decided == [(part, True)]
    rest = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(rest, [IndividualAck(positions[0], 3, (0b001,))])      # indexes 1, 2
    await v5.coordinator.end_transaction(rest, COMMIT)
    await eventually(lambda: cursor.is_acked(positions[0]))
    await handle.wait_materialised()
    assert seen.acked == [positions[0]]
    await handle.close()


async def test_abort_drops_the_acks_and_redelivers(v5):
    ledger, cursor, handle, positions, seen = await open_sub(v5, 2, CommandSubscribe.Exclusive)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.cumulative_ack(txn, positions[1])
    await v5.coordinator.end_transaction(txn, ABORT)
    await eventually(lambda: seen.released == [positions[1]])
    await handle.wait_materialised()
    assert seen.decided == [(txn, False)]
    assert not cursor.is_acked(positions[0]) and await ack_records(v5) == []
    assert not handle.is_fully_pending(positions[0])
    await handle.close()


async def test_conflicts_are_the_v4_rules(v5):
    ledger, cursor, handle, positions, seen = await open_sub(v5, 2)
    t1 = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    t2 = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(t1, [IndividualAck(positions[0])])
    with pytest.raises(TransactionConflictError):
        await handle.individual_ack(t2, [IndividualAck(positions[0]), IndividualAck(positions[1])])
    assert len(await ack_records(v5)) == 1           # the refused request wrote nothing
    assert not handle.is_fully_pending(positions[1])
    await handle.close()


async def test_a_cumulative_ack_inside_a_batch_is_one_request(v5):
    """Its two parts (the entries before the batch, the batch's indexes) are op records of
    one request: a conflict of either writes neither; accepted, both come back at replay."""
    ledger, cursor, handle, positions, seen = await open_sub(v5, 3, CommandSubscribe.Exclusive)
    t1 = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    t2 = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(t1, [IndividualAck(positions[2], 4, (0b1101,))])         # index 1
    with pytest.raises(TransactionConflictError):
        await handle.cumulative_ack_in_batch(t2, positions[1], IndividualAck(positions[2], 4, (0b1000,)))
    assert len(await ack_records(v5)) == 1 and handle.cumulative_ack_of_txn is None
    await handle.cumulative_ack_in_batch(t2, positions[1], IndividualAck(positions[2], 4, (0b1110,)))
    assert len(await ack_records(v5)) == 3
    await handle.close()
    await v5.restart()
    ledger, cursor, handle, _, seen = await open_sub(v5, 0, CommandSubscribe.Exclusive)
    assert handle.cumulative_ack_of_txn == (t2, positions[1])
    assert handle.pending_ack_set(positions[2]) == [0b1100]
    await v5.coordinator.end_transaction(t2, COMMIT)
    await eventually(lambda: cursor.mark_delete == positions[1])
    await handle.wait_materialised()
    assert cursor.batch_ack_set(positions[2]) == [0b1110]
    await handle.close()

async def test_ack_in_an_ended_or_unknown_txn_is_a_conflict(v5):
    ledger, cursor, handle, positions, seen = await open_sub(v5, 2)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await v5.coordinator.end_transaction(txn, COMMIT)
    with pytest.raises(TransactionConflictError, match="COMMITTED"):
        await handle.individual_ack(txn, [IndividualAck(positions[0])])
    with pytest.raises(TransactionConflictError, match="unknown"):
        await handle.individual_ack(TxnId(V5_COORDINATOR_ID, 10**9), [IndividualAck(positions[0])])
    with pytest.raises(NotAllowedError, match="v4"):     # not a conflict: the wrong design
        await handle.individual_ack(TxnId(1, 1), [IndividualAck(positions[0])])
    with pytest.raises(TypeError):
        await handle.individual_ack("txn", [IndividualAck(positions[0])])
    assert await ack_records(v5) == []
    await handle.close()


async def test_late_ack_race_reserves_nothing(v5):
    """The watch has not delivered the commit yet (cached OPEN): the ack's record lands after
    the decision, so it is refused and never applied to the cursor."""
    ledger, cursor, handle, positions, seen = await open_sub(v5, 2)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(txn, [IndividualAck(positions[0])])
    v5.headers._on_notification = lambda notification: None
    await v5.coordinator.end_transaction(txn, COMMIT)
    with pytest.raises(TransactionConflictError, match="ended before"):
        await handle.individual_ack(txn, [IndividualAck(positions[1])])
    assert handle.late_acks_rejected == 1
    assert len(await ack_records(v5)) == 1
    await handle.commit(txn, -1)
    assert cursor.is_acked(positions[0]) and not cursor.is_acked(positions[1])
    assert not handle.is_fully_pending(positions[1])
    await handle.close()


async def test_a_refused_late_ack_left_by_a_crash_is_not_applied_at_replay(v5, monkeypatch):
    """Found by an audit: the late ack's record is written, then refused and deleted; killed
    in between (or the delete failing), the replay applied it as part of the commit and the
    message it was told was not acknowledged was never delivered again (PIP-473: a restart
    reaches the same decision)."""
    ledger, cursor, handle, positions, seen = await open_sub(v5, 2)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(txn, [IndividualAck(positions[0])])
    v5.headers._on_notification = lambda notification: None         # the commit is not seen yet
    await v5.coordinator.end_transaction(txn, COMMIT)

    async def crashed_before_the_delete(seqs):
        raise MetadataStoreError("the broker died here")
    monkeypatch.setattr(handle.metadata, "delete_records", crashed_before_the_delete)
    with pytest.raises(MetadataStoreError):
        await handle.individual_ack(txn, [IndividualAck(positions[1])])
    assert len(await ack_records(v5)) == 2                    # the refused one is still stored
    await handle.close()
    await v5.restart()
    ledger, cursor, handle, _, seen = await open_sub(v5)
    await eventually(lambda: cursor.is_acked(positions[0]))
    await handle.wait_materialised()
    assert not cursor.is_acked(positions[1]) and not handle.is_fully_pending(positions[1])
    assert handle.late_acks_rejected == 1 and await ack_records(v5) == []
    await handle.close()


async def test_replay_and_restart_mid_materialisation(v5):
    ledger, cursor, handle, positions, seen = await open_sub(v5, 3)
    open_txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    committed = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(open_txn, [IndividualAck(positions[0])])
    await handle.individual_ack(committed, [IndividualAck(positions[1], 4, (0b0011,))])
    v5.headers._on_notification = lambda notification: None         # dies before materialising
    await v5.coordinator.end_transaction(committed, COMMIT)
    await handle.close()
    await v5.restart()
    ledger, cursor, handle, _, seen = await open_sub(v5)
    await eventually(lambda: cursor.batch_ack_set(positions[1]) is not None)
    await handle.wait_materialised()
    assert handle.is_fully_pending(positions[0])               # the open txn's reservation is back
    assert [r.partition_key for r in await ack_records(v5)] == [txn_key(open_txn)]
    await v5.coordinator.end_transaction(open_txn, COMMIT)
    await eventually(lambda: cursor.is_acked(positions[0]))
    await handle.close()


async def test_a_failed_replay_refuses_calls(v5):
    await v5.store.put(op_prefix(TxnId(V5_COORDINATOR_ID, 1)),
                       OpRecord("ack", SEGMENT, Position(1, 0), SUB, batch_size=0).encode(), sequential=True)
    ledger = await ManagedLedger.open(v5.env, SEGMENT)
    v5.ledgers.append(ledger)
    cursor = await ledger.open_cursor(SUB, "earliest")
    handle = MetadataPendingAckHandle(cursor, MetadataPendingAckStore(v5.store, SEGMENT, SUB), v5.headers,
                                      subscription_type=CommandSubscribe.Shared)
    with pytest.raises(PendingAckReplayError, match="cannot be decoded"):
        await handle.replay()
    with pytest.raises(ServiceNotReadyError):
        await handle.individual_ack(TxnId(V5_COORDINATOR_ID, 1), [IndividualAck(Position(1, 0))])


async def test_an_ack_conditional_on_a_failed_write_is_not_recorded(v5):
    """`after` (a registration the record must not exist without): the metadata store cannot
    be ordered with it, so the record waits for it, and is not written if it failed."""
    ledger, cursor, handle, positions, seen = await open_sub(v5, 2)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    loop = asyncio.get_running_loop()
    registration = loop.create_future()
    acked = asyncio.ensure_future(handle.individual_ack(txn, [IndividualAck(positions[0])], after=registration))
    await asyncio.sleep(0.05)
    assert await ack_records(v5) == [] and not acked.done()     # waits for the registration
    registration.set_exception(OSError(5, "injected I/O error"))
    with pytest.raises(Exception, match="injected"):
        await acked
    assert await ack_records(v5) == [] and not handle.is_fully_pending(positions[0])
    registered = loop.create_future()
    registered.set_result(None)
    await handle.individual_ack(txn, [IndividualAck(positions[0])], after=registered)
    assert len(await ack_records(v5)) == 1
    await handle.close()


async def test_a_commits_ack_records_go_only_once_its_acks_are_on_the_cursor(v5, monkeypatch):
    """The records were deleted while the cursor's write was still in flight (on etcd the two
    are unrelated writes): a crash between them lost committed acks, so the messages came
    again after a commit."""
    ledger, cursor, handle, positions, seen = await open_sub(v5, 2)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(txn, [IndividualAck(positions[0])])
    persisting, land = asyncio.Event(), asyncio.Event()
    real_persist = cursor.persist

    def held_persist():
        async def persist():
            persisting.set()
            await land.wait()
            await real_persist()
        return asyncio.ensure_future(persist())

    monkeypatch.setattr(cursor, "persist", held_persist)
    await v5.coordinator.end_transaction(txn, COMMIT)
    await asyncio.wait_for(persisting.wait(), 5)
    await asyncio.sleep(0.05)
    assert len(await ack_records(v5)) == 1           # still there while the cursor's write is not
    land.set()
    await handle.wait_materialised()
    assert cursor.is_acked(positions[0]) and await ack_records(v5) == []
    await handle.close()


async def test_materialising_outlasts_a_long_store_outage(v5, monkeypatch):
    """Materialisation gave up after 50 attempts 0.1 s apart: after a longer outage an aborted
    txn's acks stayed reserved (its messages never delivered again) and its header was never
    collected. It now retries, backing off, until the store answers."""
    ledger, cursor, handle, positions, seen = await open_sub(v5, 1)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await handle.individual_ack(txn, [IndividualAck(positions[0])])
    failures = 0
    real_delete = v5.store.delete

    async def down(path, *args, **kwargs):
        nonlocal failures
        if path.startswith(op_prefix(txn)) and failures < 60:
            failures += 1
            raise MetadataStoreError("the metadata store is unreachable")
        return await real_delete(path, *args, **kwargs)

    monkeypatch.setattr(v5.store, "delete", down)
    sleeps = []
    real_sleep = asyncio.sleep

    async def fast_sleep(delay, *args):                # the backoff, without the wait
        sleeps.append(delay)
        await real_sleep(0)

    from pyengine.transaction.pendingack import metadata_store
    monkeypatch.setattr(metadata_store.asyncio, "sleep", fast_sleep)
    await v5.coordinator.end_transaction(txn, ABORT)
    await eventually(lambda: seen.released == [positions[0]], timeout=10)
    assert failures == 60 and max(sleeps) == 5.0
    assert not handle.is_fully_pending(positions[0]) and await ack_records(v5) == []
    await handle.close()
