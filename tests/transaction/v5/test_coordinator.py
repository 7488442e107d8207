"""The v5 coordinator (PIP-473) and its data model, on memory, lmdb and etcd."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import (
    InvalidTxnStatusError,
    NotAllowedError,
    ServiceNotReadyError,
    TransactionCoordinatorNotFoundError,
    TransactionNotFoundError,
)
from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator.metadata_coordinator import MetadataTransactionCoordinator
from pyengine.transaction.coordinator.metadata_records import (
    IDX_DEADLINE,
    IDX_FINAL,
    IDX_WRITES,
    V5_COORDINATOR_ID,
    CorruptTxnRecordError,
    HeaderState,
    OpRecord,
    TxnHeader,
    header_path,
    op_prefix,
    parse_txn_key,
    txn_key,
)
from pyengine_kernels import Position, TxnId

from .conftest import SEGMENT

V5 = V5_COORDINATOR_ID


def test_records_round_trip_and_reject_garbage():
    header = TxnHeader(HeaderState.OPEN, 2000, 1000)
    assert TxnHeader.decode(header.encode()) == header
    final = TxnHeader(HeaderState.ABORTED, 2000, 1000, 1500)
    assert TxnHeader.decode(final.encode()) == final
    write = OpRecord("write", SEGMENT, Position(3, 4))
    assert OpRecord.decode(write.encode()) == write
    ack = OpRecord("ack", SEGMENT, Position(3, 4), "sub", False, 8, (0b1011,))
    assert OpRecord.decode(ack.encode()) == ack
    for bad in (b"", b"{", b"[]", b'{"state":"MAYBE","timeout_ms":1,"created_ms":1}',
                b'{"state":"OPEN","timeout_ms":"1","created_ms":1}', b'{"state":"OPEN"}'):
        with pytest.raises(CorruptTxnRecordError, match="/txn/x"):
            TxnHeader.decode(bad, "/txn/x")
    for bad in (b"{}", b'{"kind":"write","segment":1,"position":[1,2]}',
                b'{"kind":"ack","segment":"s","position":[1,2]}', b'{"kind":"x","segment":"s","position":[1,2]}',
                b'{"kind":"write","segment":"s","position":[1]}', b'{"kind":"write","segment":"s","position":[1,-2]}'):
        with pytest.raises(CorruptTxnRecordError):
            OpRecord.decode(bad, "/txn-op/x/1")
    assert parse_txn_key(txn_key(TxnId(V5, 42))) == TxnId(V5, 42)
    for bad in ("", "5", "a-1", "1-", "-1"):
        with pytest.raises(CorruptTxnRecordError):
            parse_txn_key(bad)


async def test_new_txn_is_one_open_header_with_its_deadline(v5, clock):
    txn = await v5.coordinator.new_transaction(V5, 5000)
    assert txn.most_bits == V5
    record = await v5.store.get(header_path(txn))
    assert record.partition_key == txn_key(txn)
    assert TxnHeader.decode(record.value) == TxnHeader(HeaderState.OPEN, clock.now + 5000, clock.now)
    assert [r.path for r in await v5.store.range_query(IDX_DEADLINE)] == [header_path(txn)]
    # add-partition / add-subscription are no-ops: nothing is written
    revision = (await v5.store.list_prefix("/")).revision
    await v5.coordinator.add_produced_partitions(txn, [SEGMENT])
    await v5.coordinator.add_acked_subscriptions(txn, [(SEGMENT, "sub")])
    assert (await v5.store.list_prefix("/")).revision == revision
    meta = await v5.coordinator.get(txn)
    assert (meta.status, meta.timeout_ms, meta.start_ms) == (TxnStatus.OPEN, 5000, clock.now)


async def test_end_is_one_cas_and_retries_are_idempotent(v5, clock):
    txn = await v5.coordinator.new_transaction(V5, 5000)
    clock.now += 10
    assert await v5.coordinator.end_transaction(txn, TxnAction.COMMIT) is TxnStatus.COMMITTED
    header = TxnHeader.decode((await v5.store.get(header_path(txn))).value)
    assert (header.state, header.finalized_ms) == (HeaderState.COMMITTED, clock.now)
    assert v5.metrics.header_cas_total == {"ok": 1, "conflict": 0, "reject": 0}
    # a client retrying after a lost answer: the same decision succeeds, nothing written
    revision = (await v5.store.list_prefix("/")).revision
    assert await v5.coordinator.end_transaction(txn, TxnAction.COMMIT) is TxnStatus.COMMITTED
    assert (await v5.store.list_prefix("/")).revision == revision
    with pytest.raises(InvalidTxnStatusError, match="COMMITTED"):
        await v5.coordinator.end_transaction(txn, TxnAction.ABORT)
    assert v5.metrics.header_cas_total["reject"] == 1
    assert [r.path for r in await v5.store.range_query(IDX_FINAL, prefix=("COMMITTED",))] == [header_path(txn)]
    assert await v5.store.range_query(IDX_DEADLINE) == []


async def test_concurrent_commit_and_abort_exactly_one_wins(v5):
    for _ in range(5):
        txn = await v5.coordinator.new_transaction(V5, 5000)
        results = await asyncio.gather(v5.coordinator.end_transaction(txn, TxnAction.COMMIT),
                                       v5.coordinator.end_transaction(txn, TxnAction.ABORT),
                                       return_exceptions=True)
        wins = [r for r in results if isinstance(r, TxnStatus)]
        assert len(wins) == 1, results
        assert isinstance([r for r in results if not isinstance(r, TxnStatus)][0], InvalidTxnStatusError)
        header = TxnHeader.decode((await v5.store.get(header_path(txn))).value)
        assert header.state.status is wins[0]


async def test_two_coordinators_on_one_store_never_share_an_id(backend, v5, clock):
    if backend.name == "etcd":
        other_store = await backend.new().start()     # another broker of the cluster
    else:
        other_store = v5.store                  # local backends: one store per data set
    other = MetadataTransactionCoordinator(other_store, clock=clock, id_block=3)
    await other.start(sweep=False)
    v5.coordinator.id_block = 2
    ids = await asyncio.gather(*[c.new_transaction(V5, 1000) for _ in range(10)
                                 for c in (v5.coordinator, other)])
    assert len(set(ids)) == 20
    await other.close()


async def test_malformed_input_is_refused_with_clear_errors(v5):
    c = v5.coordinator
    with pytest.raises(TransactionCoordinatorNotFoundError):
        await c.new_transaction(3, 1000)
    for timeout in (0, -1, c.max_timeout_ms + 1):
        with pytest.raises(NotAllowedError):
            await c.new_transaction(V5, timeout)
    with pytest.raises(TypeError):
        await c.new_transaction(V5, "1000")
    with pytest.raises(TypeError):
        await c.end_transaction("txn", TxnAction.COMMIT)
    with pytest.raises(ValueError):
        await c.end_transaction(TxnId(V5, 1), 7)
    with pytest.raises(TransactionCoordinatorNotFoundError):
        await c.end_transaction(TxnId(1, 1), TxnAction.COMMIT)          # a v4 txn id
    with pytest.raises(TransactionNotFoundError):
        await c.end_transaction(TxnId(V5, 10**9), TxnAction.COMMIT)
    with pytest.raises(TypeError):
        await c.add_produced_partitions(TxnId(V5, 1), "not-a-list")
    with pytest.raises(TransactionNotFoundError):
        await c.get(TxnId(V5, 10**9))
    # a corrupt header is reported with its path, not taken for OPEN
    await v5.store.put(header_path(TxnId(V5, 77)), b"garbage")
    with pytest.raises(CorruptTxnRecordError, match="/txn/"):
        await c.end_transaction(TxnId(V5, 77), TxnAction.COMMIT)
    with pytest.raises(ValueError):
        MetadataTransactionCoordinator(v5.store, retention_ms=-1)
    closed = MetadataTransactionCoordinator(v5.store)
    with pytest.raises(ServiceNotReadyError):
        await closed.new_transaction(V5, 1000)


async def test_timeout_sweep_aborts_exactly_the_expired(v5, clock):
    short = await v5.coordinator.new_transaction(V5, 1000)
    long = await v5.coordinator.new_transaction(V5, 60_000)
    done = await v5.coordinator.new_transaction(V5, 1000)
    await v5.coordinator.end_transaction(done, TxnAction.COMMIT)
    assert await v5.coordinator.sweep_timeouts() == 0
    clock.now += 1000
    assert await v5.coordinator.sweep_timeouts() == 1
    states = {t: TxnHeader.decode((await v5.store.get(header_path(t))).value).state for t in (short, long, done)}
    assert states == {short: HeaderState.ABORTED, long: HeaderState.OPEN, done: HeaderState.COMMITTED}
    assert v5.coordinator.stats()["timed_out_total"] == 1
    with pytest.raises(InvalidTxnStatusError):
        await v5.coordinator.end_transaction(short, TxnAction.COMMIT)


async def test_gc_deletes_headers_past_retention_and_forces_out_orphan_ops(v5, clock):
    committed = await v5.coordinator.new_transaction(V5, 60_000)
    aborted = await v5.coordinator.new_transaction(V5, 60_000)
    still_open = await v5.coordinator.new_transaction(V5, 60_000)
    # a participant that crashed before cleaning up left op records of both
    for txn in (committed, aborted, still_open):
        await v5.store.put(op_prefix(txn), OpRecord("write", SEGMENT, Position(1, 0)).encode(), sequential=True,
                           partition_key=txn_key(txn))
    await v5.coordinator.end_transaction(committed, TxnAction.COMMIT)
    clock.now += 500
    await v5.coordinator.end_transaction(aborted, TxnAction.ABORT)
    clock.now += 600                              # committed is past the 1000 ms retention, aborted not
    assert await v5.coordinator.collect_garbage() == 1
    assert await v5.store.get(header_path(committed)) is None
    assert len(await v5.store.list_prefix(op_prefix(committed))) == 0
    assert await v5.store.get(header_path(aborted)) is not None
    clock.now += 1000
    assert await v5.coordinator.collect_garbage() == 1
    assert v5.coordinator.orphans_collected == 2
    # zero headers and zero op records of finished txns left; the open one untouched
    assert [r.path for r in await v5.store.list_prefix("/txn/")] == [header_path(still_open)]
    assert [r.partition_key for r in await v5.store.list_prefix("/txn-op/")] == [txn_key(still_open)]
    assert [r.path for r in await v5.store.range_query(IDX_WRITES)] == \
        [r.path for r in await v5.store.list_prefix("/txn-op/")]
    assert v5.metrics.outstanding_op_records == 1
    with pytest.raises(TransactionNotFoundError):
        await v5.coordinator.end_transaction(committed, TxnAction.COMMIT)


async def test_cold_start_reads_nothing_but_the_indexes(v5, clock):
    """A second coordinator on the same store serves the txns of the first at once."""
    txn = await v5.coordinator.new_transaction(V5, 1000)
    successor = MetadataTransactionCoordinator(v5.store, clock=clock)
    await successor.start(sweep=False)
    clock.now += 2000
    assert await successor.sweep_timeouts() == 1
    assert (await successor.get(txn)).status is TxnStatus.ABORTED
    await successor.close()
