"""Review findings on v5 (PIP-473) transactions under metadata-store failures: failed or
racing header CAS, a watch lost and a failed re-read after it, failed op-record deletes."""

from __future__ import annotations

import pytest

from pyengine.metadata import MetadataStoreError
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_coordinator import MetadataTransactionCoordinator
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID, header_path

from .conftest import eventually
from .test_header_watch_reopen import PROMPTLY_S, visible, while_the_watch_is_down

LOCAL = pytest.mark.parametrize("backend_name", ["memory", "lmdb"])     # (etcd: slower, same code)


@LOCAL
async def test_a_timeout_sweep_counts_only_the_aborts_it_decided(v5, clock, monkeypatch):
    """A txn past its deadline that another broker's sweep (or its client) aborted between
    this sweep's index query and its CAS was counted as aborted by this sweep too (its re-read
    found ABORTED, the answer of a retried END_TXN): two brokers' sweeps reported two timeouts
    of one txn, and logged it timed out though the client aborted it."""
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 1000)
    other = MetadataTransactionCoordinator(v5.store, clock=clock)
    await other.start(sweep=False)
    clock.now += 2000
    real = v5.store.range_query
    first = True

    async def query_then_other_sweep(*args, **kwargs):
        nonlocal first
        found = await real(*args, **kwargs)
        if first:                       # (the other broker shares the store object here)
            first = False
            assert await other.sweep_timeouts() == 1      # the other broker's sweep decides first
        return found

    monkeypatch.setattr(v5.store, "range_query", query_then_other_sweep)
    try:
        assert await v5.coordinator.sweep_timeouts() == 0
    finally:
        await other.close()
    assert v5.coordinator.stats()["timed_out_total"] == 0


class _FailingOnce:
    """The store's `get`, failing once on `path` (the store still flaky); `failures` left."""

    def __init__(self, get, path) -> None:
        self.get, self.path, self.failures = get, path, 1

    async def __call__(self, path):
        if path == self.path and self.failures:
            self.failures -= 1
            raise MetadataStoreError("etcd is unreachable")
        return await self.get(path)


@LOCAL
async def test_a_commit_lost_with_the_watch_whose_re_read_failed_is_still_seen(v5, monkeypatch):
    """The header watch broke, the txn committed meanwhile (its notification lost with the
    watch), and the resync's re-read of the header after the reopen failed (the store still
    flaky): the failure was logged and the txn left cached OPEN, so its committed entries stayed
    invisible until the deadline re-read - up to the txn's timeout (hours), never sooner."""
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)   # the clock never moves
    await buffer.append(txn, b"t")
    flaky_get = _FailingOnce(v5.store.get, header_path(txn))

    async def commit_then_flaky():
        await v5.coordinator.end_transaction(txn, TxnAction.COMMIT)
        monkeypatch.setattr(v5.store, "get", flaky_get)

    await while_the_watch_is_down(v5, monkeypatch, commit_then_flaky)
    await eventually(lambda: flaky_get.failures == 0, timeout=PROMPTLY_S)
    await eventually(lambda: visible(ledger, buffer) == [b"t"], timeout=PROMPTLY_S)


@LOCAL
async def test_a_commit_whose_op_record_delete_failed_is_counted_once(v5, monkeypatch):
    """A commit's materialisation that failed deleting the op records is retried whole, and
    each try counted the commit again: the buffer's `committed_total` grew by one per retry."""
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"t")
    real = v5.store.delete
    failures = 2

    async def flaky_delete(path, *args, **kwargs):
        nonlocal failures
        if path.startswith("/txn-op/") and failures:
            failures -= 1
            raise MetadataStoreError("etcd is unreachable")
        return await real(path, *args, **kwargs)

    monkeypatch.setattr(v5.store, "delete", flaky_delete)
    await v5.coordinator.end_transaction(txn, TxnAction.COMMIT)
    await eventually(lambda: failures == 0 and not buffer._ops, timeout=3)
    await buffer.wait_materialised()
    assert visible(ledger, buffer) == [b"t"]
    assert buffer.stats()["committed_total"] == 1


@pytest.mark.parametrize("backend_name", ["memory"])         # a separate store: the GC cannot place aborts
async def test_an_abort_the_gc_recorded_is_trimmed_with_its_entries(v5, clock):
    """The GC sweep records the abort of a txn whose participant had not materialised it at
    the end of the segment (Position.LATEST: it cannot know the entries' positions on a
    separate store). Recovery moves it to the LAC, but a running buffer merging the stored set
    while saving another abort took it as it was: at LATEST, it outlived every trim, one
    aborted-set entry kept for good (in memory and stored) per such txn."""
    from pyengine.storage import ManagedLedgerConfig

    ledger, buffer = await v5.buffer(config=ManagedLedgerConfig(max_entries_per_ledger=2))
    late = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    other = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(late, b"late")
    await buffer.append(other, b"other")
    v5.headers.unsubscribe(late, buffer._on_decided)           # its decision is slow to arrive
    await v5.coordinator.end_transaction(late, TxnAction.ABORT)
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 1         # stores the abort, at LATEST
    await v5.coordinator.end_transaction(other, TxnAction.ABORT)
    await eventually(lambda: buffer.is_txn_aborted(other))
    await buffer.wait_materialised()
    buffer._on_decided(late, None)                             # the header is gone, it learns
    await buffer.wait_materialised()
    assert buffer.is_txn_aborted(late)
    last = await ledger.append(b"p1")
    await ledger.append(b"p2")                                 # a new ledger: the first can go
    cursor = await ledger.open_cursor("all", "earliest")
    await cursor.ack_cumulative(last)
    ledger.set_retention(0, -1)
    assert await ledger.trim(now_ms=1 << 62)
    await eventually(lambda: buffer._trimming is not None and buffer._trimming.done())
    assert buffer.aborted.items() == []


@LOCAL
async def test_a_decided_header_collected_during_an_outage_whose_re_read_failed_leaves_the_cache(
        v5, clock, monkeypatch):
    """The resync after a reopened watch re-reads the cached decided headers to drop those the
    GC collected meanwhile; one whose re-read failed was skipped and stayed cached for good (its
    deletion was told only to the broken watch): one entry per such txn for the broker's life."""
    _ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"c")
    await v5.coordinator.end_transaction(txn, TxnAction.COMMIT)
    await eventually(lambda: buffer.ongoing_txns() == [])
    await buffer.wait_materialised()
    assert v5.headers.cached(txn).header.state.final
    clock.now += 10_000
    flaky_get = _FailingOnce(v5.store.get, header_path(txn))

    async def collect_then_flaky():
        assert await v5.coordinator.collect_garbage() == 1
        monkeypatch.setattr(v5.store, "get", flaky_get)

    await while_the_watch_is_down(v5, monkeypatch, collect_then_flaky)
    await eventually(lambda: flaky_get.failures == 0, timeout=PROMPTLY_S)
    await eventually(lambda: v5.headers.cached(txn) is None, timeout=PROMPTLY_S)
