"""MetadataTransactionBuffer (PIP-473) on memory, lmdb and etcd: appends with op records,
the read horizon, watch-driven materialisation, sealed segments, the late-write race,
recovery from the store, and dropped notifications recovered by the deadline re-read."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from pyengine.errors import NotAllowedError, TransactionConflictError
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer import BufferState
from pyengine.transaction.coordinator.metadata_records import (
    IDX_WRITES,
    V5_COORDINATOR_ID,
    OpRecord,
    buffer_path,
    header_path,
    op_prefix,
    txn_key,
)
from pyengine_kernels import AbortedTxnSet, Position, TxnId

from .conftest import SEGMENT, eventually

COMMIT, ABORT = TxnAction.COMMIT, TxnAction.ABORT

# Stores apart from the data dir only: on LMDB an entry and its op record are one write transaction
# (the scenario cannot occur there), so these tests run on the memory and etcd stores.
SEPARATE_STORES = pytest.mark.parametrize("backend_name", ["memory", "etcd"])


def visible(ledger, buffer) -> list[bytes]:
    horizon = buffer.max_read_position()
    return [bytes(e.data) for e in ledger.read_entries(Position.EARLIEST, 10**6, horizon) if not buffer.hides(e)]


async def ops_of(store, segment=SEGMENT) -> list:
    return await store.range_query(IDX_WRITES, prefix=(segment,))


def drop_notifications(v5) -> None:
    """The header watch loses everything from now on (a dropped connection, a bug)."""
    v5.headers._on_notification = lambda notification: None


async def test_commit_makes_a_txn_visible_atomically(v5):
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"t1")
    await ledger.append(b"plain")
    await buffer.append(txn, b"t2")
    assert visible(ledger, buffer) == []                 # held back by the open txn's first entry
    assert [r.partition_key for r in await ops_of(v5.store)] == [f"{txn.most_bits}-{txn.least_bits}"] * 2
    await v5.coordinator.end_transaction(txn, COMMIT)
    await eventually(lambda: buffer.max_read_position() == ledger.lac)
    assert visible(ledger, buffer) == [b"t1", b"plain", b"t2"]
    await eventually(lambda: not buffer._materialising)
    assert await ops_of(v5.store) == []                   # the participant cleaned up after itself
    assert v5.metrics.op_writes_total == 2 and v5.metrics.outstanding_op_records == 0


async def test_abort_hides_the_txn_for_good(v5, clock):
    ledger, buffer = await v5.buffer()
    aborted = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    kept = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(aborted, b"a")
    await buffer.append(kept, b"k")
    await v5.coordinator.end_transaction(aborted, ABORT)
    await eventually(lambda: buffer.is_txn_aborted(aborted))
    assert visible(ledger, buffer) == []                  # kept is still open
    await v5.coordinator.end_transaction(kept, COMMIT)
    await eventually(lambda: visible(ledger, buffer) == [b"k"])
    await buffer.wait_materialised()
    assert await v5.store.get(buffer_path(SEGMENT)) is not None
    # headers and op records are collected; the aborted set outlives them (restart included)
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 2
    await v5.restart()
    ledger, buffer = await v5.buffer()
    assert buffer.is_txn_aborted(aborted) and not buffer.is_txn_aborted(kept)
    assert visible(ledger, buffer) == [b"k"]


async def test_sealed_segment_commits_and_aborts_at_once_without_writing(v5):
    ledger, buffer = await v5.buffer()
    commit = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    abort = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(commit, b"c")
    await buffer.append(abort, b"a")
    sealed_at = await ledger.terminate()                  # a split or merge seals the segment
    started = time.perf_counter()
    await v5.coordinator.end_transaction(commit, COMMIT)
    await v5.coordinator.end_transaction(abort, ABORT)
    await eventually(lambda: buffer.is_txn_aborted(abort) and buffer.max_read_position() == sealed_at)
    assert time.perf_counter() - started < 1.0
    assert ledger.lac == sealed_at                        # nothing was written to the segment
    assert visible(ledger, buffer) == [b"c"]
    with pytest.raises(Exception):
        await buffer.append(await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 1000), b"late")


async def test_send_after_the_decision_is_a_conflict(v5):
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"in")
    await v5.coordinator.end_transaction(txn, COMMIT)
    with pytest.raises(TransactionConflictError, match="COMMITTED"):
        await buffer.append(txn, b"after")
    with pytest.raises(TransactionConflictError, match="unknown"):
        await buffer.append(TxnId(V5_COORDINATOR_ID, 10**9), b"never-created")


async def test_late_write_race_loses_and_stays_invisible(v5):
    """The header watch has not told this broker yet: the cached header says OPEN while the
    commit already landed. The op record lands after the decision: conflict, and the entry is
    hidden (also after a restart) although its txn committed."""
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"in-time")
    drop_notifications(v5)
    await v5.coordinator.end_transaction(txn, COMMIT)
    with pytest.raises(TransactionConflictError):
        await buffer.append(txn, b"late")
    assert buffer.stats()["late_writes_rejected"] == 1
    await buffer.commit(txn, -1)                          # what the header says, materialised here
    assert visible(ledger, buffer) == [b"in-time"]
    await v5.restart()
    ledger, buffer = await v5.buffer()
    assert visible(ledger, buffer) == [b"in-time"]


async def test_late_write_after_abort_is_a_conflict_and_aborted(v5):
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"in-time")
    drop_notifications(v5)
    await v5.coordinator.end_transaction(txn, ABORT)
    with pytest.raises(TransactionConflictError):
        await buffer.append(txn, b"late")
    await buffer.abort(txn, -1)
    await ledger.append(b"plain")
    assert visible(ledger, buffer) == [b"plain"]


async def test_recovery_from_the_store_holds_the_horizon_then_follows_the_watch(v5):
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await ledger.append(b"before")
    await buffer.append(txn, b"t")
    await ledger.append(b"after")
    await v5.restart()
    ledger, buffer = await v5.buffer()
    assert visible(ledger, buffer) == [b"before"]
    assert [t for t, _ in buffer.ongoing_txns()] == [txn]
    await v5.coordinator.end_transaction(txn, COMMIT)
    await eventually(lambda: visible(ledger, buffer) == [b"before", b"t", b"after"])


async def test_restart_mid_materialisation_finishes_it(v5):
    """Decisions whose notification never arrived before the stop (the participant died
    mid-way): recovery reads the final headers and materialises them."""
    ledger, buffer = await v5.buffer()
    committed = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    aborted = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(committed, b"c")
    await buffer.append(aborted, b"a")
    drop_notifications(v5)
    await v5.coordinator.end_transaction(committed, COMMIT)
    await v5.coordinator.end_transaction(aborted, ABORT)
    await asyncio.sleep(0.05)
    assert visible(ledger, buffer) == []                  # nothing materialised
    await v5.restart()
    ledger, buffer = await v5.buffer()
    await buffer.wait_materialised()
    assert visible(ledger, buffer) == [b"c"] and buffer.is_txn_aborted(aborted)
    assert await ops_of(v5.store) == []


async def test_dropped_notifications_are_recovered_by_the_deadline_reread(v5, clock):
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 5_000)
    await buffer.append(txn, b"t")
    drop_notifications(v5)
    await v5.coordinator.end_transaction(txn, COMMIT)
    await asyncio.sleep(0.2)                              # several re-read intervals: not expired yet
    assert visible(ledger, buffer) == []
    clock.now += 5_000                                    # the deadline passes: the header is re-read
    await eventually(lambda: visible(ledger, buffer) == [b"t"], timeout=2)
    assert v5.headers.rechecks_resolved >= 1


async def test_v4_txns_and_malformed_appends_are_refused(v5):
    ledger, buffer = await v5.buffer()
    with pytest.raises(NotAllowedError, match="v4"):
        await buffer.append(TxnId(0, 1), b"x")
    with pytest.raises(TypeError):
        buffer.append("txn", b"x")
    with pytest.raises(TypeError):
        buffer.append(TxnId(V5_COORDINATOR_ID, 1), "text")
    with pytest.raises(ValueError):
        buffer.append(TxnId(V5_COORDINATOR_ID, 1), b"x", num_messages=0)
    with pytest.raises(TypeError):
        buffer.is_txn_aborted((1, 2))
    assert ledger.lac.entry_id == -1                      # nothing was stored


async def test_recovery_reports_corrupt_op_records(v5):
    from pyengine.errors import ServiceNotReadyError

    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"t")
    await v5.restart()
    # an op record indexed for this segment whose header cannot be read
    await v5.store.put(f"/txn/{txn.most_bits}-{txn.least_bits}", b"garbage")
    with pytest.raises(ServiceNotReadyError, match="cannot recover"):
        await v5.buffer()


async def test_many_txns_interleaved_keep_the_horizon_at_the_oldest_open(v5):
    ledger, buffer = await v5.buffer()
    txns = [await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000) for _ in range(3)]
    for round_ in range(2):
        for i, txn in enumerate(txns):
            await buffer.append(txn, f"{i}.{round_}".encode())
    await v5.coordinator.end_transaction(txns[1], COMMIT)
    await asyncio.sleep(0.02)
    assert visible(ledger, buffer) == []
    await v5.coordinator.end_transaction(txns[0], ABORT)
    await eventually(lambda: visible(ledger, buffer) == [b"1.0"])
    await v5.coordinator.end_transaction(txns[2], COMMIT)
    await eventually(lambda: visible(ledger, buffer) == [b"1.0", b"2.0", b"1.1", b"2.1"])
    assert buffer.state is BufferState.READY
    await buffer.wait_materialised()            # the op records go after the decision is applied
    assert len(await v5.store.list_prefix(op_prefix(txns[0]))) == 0


async def test_lmdb_entry_and_op_record_are_one_write_transaction(v5, monkeypatch):
    if v5.backend.name != "lmdb":
        return                                  # the other backends are separate stores
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await v5.env.barrier()
    batches = []
    original = type(v5.env)._write_batch

    def recording(env, writes):
        batches.append(len([w for w in writes if w is not None]))
        return original(env, writes)

    monkeypatch.setattr(type(v5.env), "_write_batch", recording)
    await buffer.append(txn, b"t")
    assert batches == [2]                       # the entry and the op record, one commit


async def test_trimmed_ledgers_take_their_aborts_with_them(v5):
    from pyengine.storage import ManagedLedgerConfig
    from pyengine_kernels import AbortedTxnSet

    ledger, buffer = await v5.buffer(config=ManagedLedgerConfig(max_entries_per_ledger=2))   # trimmed below
    old = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    old_position = await buffer.append(old, b"old")
    await v5.coordinator.end_transaction(old, ABORT)
    await eventually(lambda: buffer.is_txn_aborted(old))
    for i in range(3):
        await ledger.append(b"p%d" % i)
    recent = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(recent, b"recent")
    await v5.coordinator.end_transaction(recent, ABORT)
    await eventually(lambda: buffer.is_txn_aborted(recent))
    await buffer.wait_materialised()
    cursor = await ledger.open_cursor("all", "earliest")
    await cursor.ack_cumulative(ledger.lac)
    ledger.set_retention(0, -1)
    await ledger.trim(now_ms=1 << 62)
    assert old_position.ledger_id not in ledger.ledgers
    await eventually(lambda: buffer._trimming is not None and buffer._trimming.done())
    assert not buffer.is_txn_aborted(old) and buffer.is_txn_aborted(recent)
    stored = AbortedTxnSet.from_bytes((await v5.store.get(buffer_path(SEGMENT))).value)
    assert old not in stored and recent in stored


async def test_separate_store_records_a_txns_first_entry_before_appending_it(v5, monkeypatch):
    """etcd / memory: a crash between the two writes must not leave an entry no op record ties
    to its txn, so the first entry of a txn on a segment is recorded first (at a lower bound of
    its position); LMDB writes both in one commit instead."""
    from pyengine.errors import PersistenceError
    from pyengine.storage import StorageError

    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await ledger.append(b"plain")

    def crash(*args, **kwargs):
        raise StorageError("the process died here")

    monkeypatch.setattr(ledger, "append_entry", crash)
    with pytest.raises(PersistenceError):
        await buffer.append(txn, b"t")
    records = await ops_of(v5.store)
    if v5.backend.name == "lmdb":
        assert records == []
    else:
        assert [json.loads(r.value)["position"] for r in records] == [[ledger.lac.ledger_id, ledger.lac.entry_id + 1]]
    monkeypatch.undo()
    await buffer.append(txn, b"t")                      # later writes: one record each, as on LMDB
    assert len(await ops_of(v5.store)) == (1 if v5.backend.name == "lmdb" else 2)


async def test_an_abort_its_segment_never_saw_survives_the_garbage_collection(v5, clock):
    """The segment is not loaded when its txn is aborted and collected: the collector records
    the abort in the segment's stored aborted set before it deletes the op records, as the
    buffer would have (without, the restarted segment showed the aborted message)."""
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"aborted")
    await v5.restart()                                    # the segment is not loaded again
    await v5.coordinator.end_transaction(txn, ABORT)
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 1
    assert await ops_of(v5.store) == [] and await v5.store.get(header_path(txn)) is None
    ledger, buffer = await v5.buffer()
    assert buffer.is_txn_aborted(txn) and visible(ledger, buffer) == []


async def test_a_commit_its_segment_never_saw_is_collected_and_stays_visible(v5, clock):
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"committed")
    await v5.restart()
    await v5.coordinator.end_transaction(txn, COMMIT)
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 1
    ledger, buffer = await v5.buffer()
    assert visible(ledger, buffer) == [b"committed"]


async def test_committed_acks_their_subscription_never_applied_keep_the_txn_from_collection(v5, clock):
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    ack = OpRecord("ack", SEGMENT, Position(1, 0), subscription="sub")
    await v5.store.put(op_prefix(txn), ack.encode(), sequential=True, partition_key=txn_key(txn))
    await v5.coordinator.end_transaction(txn, COMMIT)
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 0    # the acks still wait for their cursor
    assert len(await v5.store.list_prefix(op_prefix(txn))) == 1
    assert await v5.store.get(header_path(txn)) is not None


async def test_a_late_write_whose_hiding_was_never_saved_is_hidden_by_recovery(v5):
    """A crash after a late write's op record landed but before its position was saved as
    hidden: recovery sees that the op record came after the commit and hides it itself."""
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"in-time")
    drop_notifications(v5)
    await v5.coordinator.end_transaction(txn, COMMIT)

    async def crash(*_args, **_kwargs):
        raise RuntimeError("the broker died here")

    ledger.set_property = crash
    with pytest.raises(RuntimeError, match="died"):
        await buffer.append(txn, b"late")
    await v5.restart()
    ledger, buffer = await v5.buffer()
    await buffer.wait_materialised()
    assert visible(ledger, buffer) == [b"in-time"]
    await v5.restart()                                    # and it stays hidden for good
    ledger, buffer = await v5.buffer()
    assert visible(ledger, buffer) == [b"in-time"]


async def test_a_late_write_after_an_abort_is_not_forgotten_by_a_trim(v5):
    """A write lands after its txn's abort (the cached header still said OPEN): refused, hidden
    by the abort. Its op record must stay until the abort is saved at a position covering it:
    deleted at once, a stop before the abort was materialised left the abort known only at the
    txn's earlier entry, and trimming that entry's ledger forgot the abort while the late entry
    (in a later ledger) was still there: it became visible."""
    from pyengine.storage import ManagedLedgerConfig

    config = ManagedLedgerConfig(max_entries_per_ledger=2)
    ledger, buffer = await v5.buffer(config=config)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    first = await buffer.append(txn, b"in-time")
    await ledger.append(b"p0")                            # the next entry opens a new ledger
    drop_notifications(v5)
    await v5.coordinator.end_transaction(txn, ABORT)
    with pytest.raises(TransactionConflictError):
        await buffer.append(txn, b"late")
    late = ledger.lac
    assert late.ledger_id != first.ledger_id
    await v5.restart()                                    # before the abort was materialised
    ledger, buffer = await v5.buffer(config=config)
    await buffer.wait_materialised()
    await ledger.append(b"p1")
    assert buffer.is_txn_aborted(txn) and visible(ledger, buffer) == [b"p0", b"p1"]
    cursor = await ledger.open_cursor("all", "earliest")
    await cursor.ack_cumulative(Position(first.ledger_id, first.entry_id + 1))
    ledger.set_retention(0, -1)
    await ledger.trim(now_ms=1 << 62)                     # the first ledger only
    assert first.ledger_id not in ledger.ledgers and late.ledger_id in ledger.ledgers
    await asyncio.sleep(0.05)                             # (a trimmed aborted set is saved in the background)
    assert buffer.is_txn_aborted(txn) and visible(ledger, buffer) == [b"p1"]
    await v5.restart()
    ledger, buffer = await v5.buffer(config=config)
    assert visible(ledger, buffer) == [b"p1"]


async def test_a_late_write_after_an_abort_on_a_segment_the_txn_never_wrote_to_stays_hidden(v5):
    """The late write is the txn's only entry on this segment: its op record is all that ties
    the entry to the txn until the abort is saved here. Deleted at once, a stop before the
    abort was materialised left an entry of a txn the segment did not know: visible."""
    other, other_buffer = await v5.buffer("segment://public/default/v5/other-0")
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await other_buffer.append(txn, b"elsewhere")          # caches the header (OPEN) on this broker
    drop_notifications(v5)
    await v5.coordinator.end_transaction(txn, ABORT)
    with pytest.raises(TransactionConflictError):
        await buffer.append(txn, b"late")
    data_dir, store = v5.data_dir, v5.store
    await v5.stop()
    if v5.backend.name == "lmdb":                         # the Spark source reads the same records
        from spark_udfs.state import capture_state

        assert txn in capture_state(data_dir, [SEGMENT])[SEGMENT].aborted_set()
    await v5.start(data_dir=data_dir, store=store)
    ledger, buffer = await v5.buffer()
    await buffer.wait_materialised()
    assert buffer.is_txn_aborted(txn) and visible(ledger, buffer) == []


async def test_a_late_write_after_an_abort_is_hidden_after_the_garbage_collection(v5, clock):
    """The segment's broker stops before it materialised the abort, and the collector gets
    there first: it records the abort from the op records left, the late write's included."""
    other, other_buffer = await v5.buffer("segment://public/default/v5/other-0")
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await other_buffer.append(txn, b"elsewhere")
    drop_notifications(v5)
    await v5.coordinator.end_transaction(txn, ABORT)
    with pytest.raises(TransactionConflictError):
        await buffer.append(txn, b"late")
    await v5.restart()
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 1
    ledger, buffer = await v5.buffer()
    assert buffer.is_txn_aborted(txn) and visible(ledger, buffer) == []


async def test_an_abort_whose_saving_failed_once_is_still_saved(v5):
    """Saving the aborted set fails once: the retry must save it before the op records go,
    or a restart finds neither and shows the aborted entry."""
    from pyengine.metadata import MetadataStoreError

    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"aborted")
    put, failures = v5.store.put, []

    async def failing_once(path, *args, **kwargs):
        if path == buffer_path(SEGMENT) and not failures:
            failures.append(path)
            raise MetadataStoreError("the store is unreachable for a moment")
        return await put(path, *args, **kwargs)

    v5.store.put = failing_once
    await v5.coordinator.end_transaction(txn, ABORT)
    await eventually(lambda: failures and not buffer._materialising and not buffer._ops)
    v5.store.put = put
    await v5.restart()
    ledger, buffer = await v5.buffer()
    assert buffer.is_txn_aborted(txn) and visible(ledger, buffer) == []


@SEPARATE_STORES
async def test_an_abort_recovered_from_a_reservation_is_not_forgotten_by_a_trim(v5):
    """A separate store records a txn's first entry on a segment before appending it, at a
    lower bound of its position: after a reopen, in the previous ledger. An abort recovery
    materialised at that bound was dropped by the trim of that ledger, and the aborted entry
    (in the next one) became visible."""
    from pyengine.storage import ManagedLedgerConfig

    config = ManagedLedgerConfig(max_entries_per_ledger=100)
    ledger, buffer = await v5.buffer(config=config)
    plain = await ledger.append(b"p0")
    await v5.restart()                          # the reopened segment appends to a new ledger
    ledger, buffer = await v5.buffer(config=config)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    aborted = await buffer.append(txn, b"aborted")
    await ledger.append(b"p1")
    assert aborted.ledger_id != plain.ledger_id
    drop_notifications(v5)
    await v5.coordinator.end_transaction(txn, ABORT)
    await v5.restart()                          # before the abort was materialised
    ledger, buffer = await v5.buffer(config=config)
    await buffer.wait_materialised()
    cursor = await ledger.open_cursor("all", "earliest")
    await cursor.ack_cumulative(plain)
    ledger.set_retention(0, -1)
    assert await ledger.trim(now_ms=1 << 62) == [plain.ledger_id]
    await asyncio.sleep(0.05)                   # (a trimmed aborted set is saved in the background)
    assert buffer.is_txn_aborted(txn) and visible(ledger, buffer) == [b"p1"]
    await v5.restart()
    ledger, buffer = await v5.buffer(config=config)
    assert visible(ledger, buffer) == [b"p1"]


@SEPARATE_STORES
async def test_an_abort_the_garbage_collection_recorded_from_a_reservation_is_not_forgotten_by_a_trim(v5, clock):
    """The same bound, met by the GC sweep of a txn whose segment was not loaded: the abort
    was stored at the reservation (in the previous ledger), and the trim of that ledger made
    the aborted entry visible."""
    from pyengine.storage import ManagedLedgerConfig

    config = ManagedLedgerConfig(max_entries_per_ledger=100)
    ledger, buffer = await v5.buffer(config=config)
    plain = await ledger.append(b"p0")
    await v5.restart()                          # the reopened segment appends to a new ledger
    ledger, buffer = await v5.buffer(config=config)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    aborted = await buffer.append(txn, b"aborted")
    p1 = await ledger.append(b"p1")
    assert aborted.ledger_id != plain.ledger_id
    await v5.restart()                          # the segment is not loaded again
    await v5.coordinator.end_transaction(txn, ABORT)
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 1
    assert await ops_of(v5.store) == []
    ledger, buffer = await v5.buffer(config=config)
    cursor = await ledger.open_cursor("all", "earliest")
    await cursor.ack_cumulative(plain)
    ledger.set_retention(0, -1)
    assert await ledger.trim(now_ms=1 << 62) == [plain.ledger_id]
    await asyncio.sleep(0.05)                   # (a trimmed aborted set is saved in the background)
    assert buffer.is_txn_aborted(txn) and visible(ledger, buffer) == [b"p1"]
    await v5.restart()
    ledger, buffer = await v5.buffer(config=config)
    assert visible(ledger, buffer) == [b"p1"]
    # and it goes with the aborted entry's ledger (not kept for good at the end)
    await ledger.append(b"p2")
    cursor = await ledger.open_cursor("all")
    await cursor.ack_cumulative(p1)
    ledger.set_retention(0, -1)
    assert aborted.ledger_id in await ledger.trim(now_ms=1 << 62)
    await eventually(lambda: buffer._trimming is not None and buffer._trimming.done())
    assert txn not in AbortedTxnSet.from_bytes((await v5.store.get(buffer_path(SEGMENT))).value)


@SEPARATE_STORES
async def test_an_abort_recovered_from_concurrent_reservations_is_not_forgotten_by_a_trim(v5):
    """Two sends of one txn in flight at once both found no record of it on the segment: both
    wrote a reservation (a lower bound), and recovery took the later of the two for the
    abort's position, in the ledger before the entries."""
    from pyengine.storage import ManagedLedgerConfig

    config = ManagedLedgerConfig(max_entries_per_ledger=100)
    ledger, buffer = await v5.buffer(config=config)
    plain = await ledger.append(b"p0")
    await v5.restart()                          # the reopened segment appends to a new ledger
    ledger, buffer = await v5.buffer(config=config)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    first, second = await asyncio.gather(buffer.append(txn, b"a1"), buffer.append(txn, b"a2"))
    await ledger.append(b"p1")
    assert first.ledger_id != plain.ledger_id
    drop_notifications(v5)
    await v5.coordinator.end_transaction(txn, ABORT)
    await v5.restart()                          # before the abort was materialised
    ledger, buffer = await v5.buffer(config=config)
    await buffer.wait_materialised()
    cursor = await ledger.open_cursor("all", "earliest")
    await cursor.ack_cumulative(plain)
    ledger.set_retention(0, -1)
    assert await ledger.trim(now_ms=1 << 62) == [plain.ledger_id]
    await asyncio.sleep(0.05)                   # (a trimmed aborted set is saved in the background)
    assert buffer.is_txn_aborted(txn) and visible(ledger, buffer) == [b"p1"]
