"""LogTransactionMetadataStore: ids, the status machine, trimming, recovery, low watermark."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from core_ext.poskeys import pack_i64
from pyengine.errors import (
    InvalidTopicNameError,
    InvalidTxnStatusError,
    NotAllowedError,
    PersistenceError,
    ServiceNotReadyError,
    TransactionNotFoundError,
)
from pyengine.storage import StorageEnvironment
from pyengine.storage.errors import CorruptRecordError, StorageError
from pyengine.transaction import TxnStatus
from pyengine.transaction.coordinator import log_records as records
from pyengine.transaction.coordinator.log_store import LEGAL_TRANSITIONS, LogTransactionMetadataStore
from pyengine_kernels import TxnId
from tests.broker.helpers import GatedWriter

S = TxnStatus
HOUR = 3_600_000


async def open_store(env, clock, cid: int = 0, **kwargs) -> LogTransactionMetadataStore:
    store = LogTransactionMetadataStore(env, cid, clock=clock, **kwargs)
    await store.recover()
    return store


async def restart(store, reopen, env, clock, **kwargs) -> tuple[LogTransactionMetadataStore, StorageEnvironment]:
    await store.close()
    fresh_env = reopen(env)
    return await open_store(fresh_env, clock, store.coordinator_id, **kwargs), fresh_env


async def drive_to(store: LogTransactionMetadataStore, status: TxnStatus) -> TxnId:
    """A new txn moved to `status` along the legal path."""
    txn = (await store.new_transaction(60_000)).txn_id
    path = {
        S.OPEN: [],
        S.COMMITTING: [(S.COMMITTING, S.OPEN)],
        S.COMMITTED: [(S.COMMITTING, S.OPEN), (S.COMMITTED, S.COMMITTING)],
        S.ABORTING: [(S.ABORTING, S.OPEN)],
        S.ABORTED: [(S.ABORTING, S.OPEN), (S.ABORTED, S.ABORTING)],
        S.TIME_OUT: [(S.ABORTING, S.OPEN), (S.TIME_OUT, S.ABORTING)],
    }[status]
    for new, expected in path:
        await store.update_status(txn, new, expected, timed_out=status == S.TIME_OUT and new == S.ABORTING)
    assert store.get(txn).status == status
    return txn


def coordinator_records(env, cid: int) -> list[tuple[int, records.TxnLogRecord | int]]:
    prefix = pack_i64(cid)
    out = []
    with env.read() as txn:
        cursor = txn.cursor(db=env.db("txn_log"))
        if cursor.set_range(prefix):
            for key, raw in cursor.iternext():
                if key[:8] != prefix:
                    break
                sequence = records.log_sequence(key)
                out.append((sequence, records.decode_header(raw) if sequence == records.HEADER_SEQUENCE
                            else records.TxnLogRecord.FromString(raw)))
    return out


# --- ids ---------------------------------------------------------------------------------

async def test_txn_ids_are_the_coordinator_id_and_a_sequence_from_zero(env, clock):
    store = await open_store(env, clock, cid=7)
    metas = [await store.new_transaction(1000) for _ in range(3)]
    assert [m.txn_id for m in metas] == [TxnId(7, 0), TxnId(7, 1), TxnId(7, 2)]
    assert all(m.status == S.OPEN and m.start_ms == clock() and m.timeout_ms == 1000 for m in metas)
    await store.close()


async def test_ids_are_never_reused_after_every_record_is_trimmed_and_purged(env, clock, reopen):
    store = await open_store(env, clock, finished_retention_ms=10)
    for _ in range(3):
        await drive_to(store, S.COMMITTED)
    clock.advance(10)
    assert await store.purge_finished() == 3
    assert [r for _, r in coordinator_records(env, 0)] == [3]      # only the header is left
    store, env = await restart(store, reopen, env, clock, finished_retention_ms=10)
    assert (await store.new_transaction(1000)).txn_id == TxnId(0, 3)
    await store.close()


async def test_coordinators_share_the_database_without_seeing_each_other(env, clock, reopen):
    a, b = await open_store(env, clock, cid=0), await open_store(env, clock, cid=1)
    ta = await drive_to(a, S.OPEN)
    tb = await drive_to(b, S.COMMITTED)
    await a.add_produced_partitions(ta, ["t"])
    assert ta == TxnId(0, 0) and tb == TxnId(1, 0)
    with pytest.raises(TransactionNotFoundError):
        a.get(tb)
    await a.close()
    await b.close()
    env = reopen(env)
    a, b = await open_store(env, clock, cid=0), await open_store(env, clock, cid=1)
    assert a.get(ta).partitions == ["t"] and b.get(tb).status == S.COMMITTED
    assert a.live_transactions()[0].txn_id == ta and b.live_transactions() == []
    await a.close()
    await b.close()


# --- the status machine ------------------------------------------------------------------

STATUSES = list(S)
REACHABLE = [S.OPEN, S.COMMITTING, S.COMMITTED, S.ABORTING, S.ABORTED, S.TIME_OUT]


@pytest.mark.parametrize("current", REACHABLE, ids=lambda s: s.name)
async def test_every_update_from_every_status(env, clock, current):
    """For each (expected, new): a repeat of the current status is a no-op success; a wrong
    `expected` fails with "expected X but is Y"; only the legal moves succeed."""
    store = await open_store(env, clock)
    for expected, new in itertools.product(STATUSES, STATUSES):
        txn = await drive_to(store, current)
        if new == current:
            assert (await store.update_status(txn, new, expected)).status == current
        elif expected != current:
            with pytest.raises(InvalidTxnStatusError, match=f"expected {expected.name} but is {current.name}"):
                await store.update_status(txn, new, expected)
        elif (expected, new) in LEGAL_TRANSITIONS:
            assert (await store.update_status(txn, new, expected)).status == new
            assert store.get(txn).status == new
            continue
        else:
            with pytest.raises(InvalidTxnStatusError, match=f"from {expected.name} to {new.name}"):
                await store.update_status(txn, new, expected)
        assert store.get(txn).status == current
    await store.close()


def test_the_legal_moves_are_exactly_pulsars_plus_the_timeout():
    assert LEGAL_TRANSITIONS == {(S.OPEN, S.COMMITTING), (S.COMMITTING, S.COMMITTED), (S.OPEN, S.ABORTING),
                                 (S.ABORTING, S.ABORTED), (S.ABORTING, S.TIME_OUT)}


async def test_timed_out_marks_only_the_abort_decision(env, clock):
    store = await open_store(env, clock)
    txn = await drive_to(store, S.OPEN)
    with pytest.raises(ValueError, match="OPEN -> ABORTING"):
        await store.update_status(txn, S.COMMITTING, S.OPEN, timed_out=True)
    meta = await store.update_status(txn, S.ABORTING, S.OPEN, timed_out=True)
    assert meta.timed_out and meta.status == S.ABORTING
    await store.close()


async def test_add_on_a_txn_that_is_not_open(env, clock):
    store = await open_store(env, clock)
    for status in (S.COMMITTING, S.ABORTING, S.COMMITTED, S.ABORTED, S.TIME_OUT):
        txn = await drive_to(store, status)
        with pytest.raises(InvalidTxnStatusError, match=f"expected OPEN but is {status.name}"):
            await store.add_produced_partitions(txn, ["t"])
        with pytest.raises(InvalidTxnStatusError, match=f"expected OPEN but is {status.name}"):
            await store.add_acked_subscriptions(txn, [("t", "s")])
    await store.close()


async def test_unknown_txns(env, clock):
    store = await open_store(env, clock, cid=2)
    await drive_to(store, S.OPEN)
    for txn in (TxnId(2, 1), TxnId(2, 1 << 40), TxnId(3, 0)):
        with pytest.raises(TransactionNotFoundError):
            store.get(txn)
        with pytest.raises(TransactionNotFoundError):
            await store.add_produced_partitions(txn, ["t"])
        with pytest.raises(TransactionNotFoundError):
            await store.add_acked_subscriptions(txn, [("t", "s")])
        with pytest.raises(TransactionNotFoundError):
            await store.update_status(txn, S.COMMITTING, S.OPEN)
    await store.close()


async def test_partitions_and_subscriptions_are_kept_once_in_order(env, clock, reopen):
    store = await open_store(env, clock)
    txn = await drive_to(store, S.OPEN)
    await store.add_produced_partitions(txn, ["b", "a", "b"])
    await store.add_produced_partitions(txn, ["a", "c"])
    await store.add_produced_partitions(txn, [])
    await store.add_acked_subscriptions(txn, [("t", "s"), ("t", "s2")])
    await store.add_acked_subscriptions(txn, [("t", "s")])
    ops = [r.op for _, r in coordinator_records(env, 0) if not isinstance(r, int)]
    assert ops == [records.NEW, records.ADD_PARTITION, records.ADD_PARTITION, records.ADD_SUBSCRIPTION]
    store, env = await restart(store, reopen, env, clock)
    meta = store.get(txn)
    assert meta.partitions == ["b", "a", "c"]
    assert meta.subscriptions == [("t", "s"), ("t", "s2")]
    await store.close()


async def test_concurrent_repeats_write_once(env, clock):
    store = await open_store(env, clock)
    txn = await drive_to(store, S.OPEN)
    await asyncio.gather(store.add_produced_partitions(txn, ["t"]), store.add_produced_partitions(txn, ["t"]))
    metas = await asyncio.gather(store.update_status(txn, S.COMMITTING, S.OPEN),
                                 store.update_status(txn, S.COMMITTING, S.OPEN))
    assert [m.status for m in metas] == [S.COMMITTING, S.COMMITTING]
    metas = await asyncio.gather(store.update_status(txn, S.COMMITTED, S.COMMITTING),
                                 store.update_status(txn, S.COMMITTED, S.COMMITTING))
    assert [m.status for m in metas] == [S.COMMITTED, S.COMMITTED]
    finished = [r for _, r in coordinator_records(env, 0) if not isinstance(r, int)]
    assert [r.op for r in finished] == [records.FINISHED]
    await store.close()


async def test_a_repeat_of_a_move_whose_write_fails_fails_too(env, clock, reopen):
    """A repeated OPEN -> COMMITTING answers only once the first one's record is durable: when
    that write fails, the repeat fails with it and the txn is OPEN (answered COMMITTING, its
    caller would tell participants of a decision that was never written)."""
    store = await open_store(env, clock)
    txn = await drive_to(store, S.OPEN)
    gate = GatedWriter(env)
    try:
        first = asyncio.ensure_future(store.update_status(txn, S.COMMITTING, S.OPEN))
        await gate.next_commit()                                   # its record is being written
        repeat = asyncio.ensure_future(store.update_status(txn, S.COMMITTING, S.OPEN))
        await asyncio.sleep(0)
        gate.let_through(OSError(5, "injected I/O error"))
    finally:
        gate.open()
    outcomes = await asyncio.gather(first, repeat, return_exceptions=True)
    assert all(isinstance(o, (StorageError, PersistenceError)) for o in outcomes), outcomes
    assert store.get(txn).status is S.OPEN
    store, env = await restart(store, reopen, env, clock)
    assert store.get(txn).status is S.OPEN
    await store.close()


async def test_a_cancelled_caller_does_not_fail_the_write_a_repeat_waits_on(env, clock, reopen):
    store = await open_store(env, clock)
    txn = await drive_to(store, S.OPEN)
    first = asyncio.ensure_future(store.add_produced_partitions(txn, ["t"]))
    await asyncio.sleep(0)                               # its record is submitted
    repeat = asyncio.ensure_future(store.add_produced_partitions(txn, ["t"]))   # waits on that write
    await asyncio.sleep(0)
    first.cancel()
    await repeat
    assert first.cancelled()
    store, env = await restart(store, reopen, env, clock)
    assert store.get(txn).partitions == ["t"]           # durable, written once
    await store.close()


# --- malformed input ---------------------------------------------------------------------

async def test_malformed_arguments(env, clock):
    store = await open_store(env, clock)
    txn = await drive_to(store, S.OPEN)
    for bad in (0, -1, -(1 << 62)):
        with pytest.raises(NotAllowedError, match="timeout"):
            await store.new_transaction(bad)
    for bad in ("1000", 1.5, None, True):
        with pytest.raises(TypeError, match="timeout_ms"):
            await store.new_transaction(bad)
    with pytest.raises(TypeError, match="TxnId"):
        store.get((0, 0))
    with pytest.raises(TypeError, match="partitions"):
        await store.add_produced_partitions(txn, "topic")
    with pytest.raises(TypeError, match="str"):
        await store.add_produced_partitions(txn, [b"topic"])
    with pytest.raises(InvalidTopicNameError):
        await store.add_produced_partitions(txn, [""])
    with pytest.raises(TypeError, match="pair"):
        await store.add_acked_subscriptions(txn, ["t/s"])
    with pytest.raises(TypeError, match="pair"):
        await store.add_acked_subscriptions(txn, [("t", "s", "x")])
    with pytest.raises(ValueError, match="subscription name"):
        await store.add_acked_subscriptions(txn, [("t", "")])
    with pytest.raises(TypeError, match="TxnStatus"):
        await store.update_status(txn, "COMMITTING", S.OPEN)
    with pytest.raises(ValueError, match="unknown transaction status"):
        await store.update_status(txn, 5, S.OPEN)
    with pytest.raises(TypeError, match="timed_out"):
        await store.update_status(txn, S.ABORTING, S.OPEN, timed_out=1)
    assert store.get(txn).partitions == [] and store.get(txn).status == S.OPEN
    with pytest.raises(ValueError):
        LogTransactionMetadataStore(env, -1)
    with pytest.raises(TypeError):
        LogTransactionMetadataStore(env, "0")
    await store.close()


async def test_not_ready_before_recover_and_after_close(env, clock):
    store = LogTransactionMetadataStore(env, 0, clock=clock)
    with pytest.raises(ServiceNotReadyError):
        await store.new_transaction(1000)
    await store.recover()
    with pytest.raises(ServiceNotReadyError):
        await store.recover()
    await store.close()
    with pytest.raises(ServiceNotReadyError):
        store.get(TxnId(0, 0))


# --- trimming and retention --------------------------------------------------------------

async def test_ending_replaces_the_op_records_by_one_finished_record(env, clock):
    store = await open_store(env, clock)
    txn = await drive_to(store, S.OPEN)
    await store.add_produced_partitions(txn, ["a"])
    await store.add_acked_subscriptions(txn, [("a", "s")])
    await store.update_status(txn, S.ABORTING, S.OPEN)
    clock.advance(5)
    await store.update_status(txn, S.ABORTED, S.ABORTING)
    logged = coordinator_records(env, 0)
    assert logged[0] == (records.HEADER_SEQUENCE, 1)
    [(_, finished)] = logged[1:]
    assert finished.op == records.FINISHED and finished.txn_least == 0
    assert S(finished.new_status) == S.ABORTED and finished.modified_ms == clock()
    meta = store.get(txn)
    assert (meta.status, meta.partitions, meta.last_modified_ms) == (S.ABORTED, [], clock())
    await store.close()


async def test_finished_txns_are_forgotten_after_the_retention(env, clock, reopen):
    store = await open_store(env, clock, finished_retention_ms=HOUR)
    txn = await drive_to(store, S.COMMITTED)
    clock.advance(HOUR - 1)
    assert store.get(txn).status == S.COMMITTED
    assert (await store.update_status(txn, S.COMMITTED, S.COMMITTING)).status == S.COMMITTED
    assert await store.purge_finished() == 0
    store, env = await restart(store, reopen, env, clock, finished_retention_ms=HOUR)
    assert store.get(txn).status == S.COMMITTED
    clock.advance(1)
    with pytest.raises(TransactionNotFoundError):
        store.get(txn)       # even before the purge deleted the record
    with pytest.raises(TransactionNotFoundError):
        await store.update_status(txn, S.COMMITTED, S.COMMITTING)
    assert await store.purge_finished() == 1
    assert [r for _, r in coordinator_records(env, 0)] == [1]
    await store.close()


async def test_recovery_purges_what_expired_while_down(env, clock, reopen):
    store = await open_store(env, clock, finished_retention_ms=HOUR)
    for _ in range(5):
        await drive_to(store, S.ABORTED)
    live = await drive_to(store, S.OPEN)
    clock.advance(HOUR)
    store, env = await restart(store, reopen, env, clock, finished_retention_ms=HOUR)
    assert [r.op for _, r in coordinator_records(env, 0)[1:]] == [records.NEW]
    assert store.get(live).status == S.OPEN
    await store.close()


# --- recovery ----------------------------------------------------------------------------

async def test_recovery_restores_every_live_txn(env, clock, reopen):
    store = await open_store(env, clock)
    txns = {status: await drive_to(store, status) for status in REACHABLE}
    await store.add_produced_partitions(txns[S.OPEN], ["p1", "p2"])
    await store.add_acked_subscriptions(txns[S.OPEN], [("p1", "s")])
    timed = await drive_to(store, S.OPEN)
    await store.update_status(timed, S.ABORTING, S.OPEN, timed_out=True)
    before = {txn: store.get(txn) for txn in [*txns.values(), timed]}
    store, env = await restart(store, reopen, env, clock)
    after = {txn: store.get(txn) for txn in before}
    assert after == before
    assert {m.txn_id for m in store.live_transactions()} == {txns[S.OPEN], txns[S.COMMITTING],
                                                             txns[S.ABORTING], timed}
    assert store.get(timed).timed_out
    assert (await store.new_transaction(10)).txn_id == TxnId(0, 7)
    await store.close()


async def test_recover_returns_the_live_txns(env, clock, reopen):
    store = await open_store(env, clock)
    open_txn = await drive_to(store, S.OPEN)
    committing = await drive_to(store, S.COMMITTING)
    await drive_to(store, S.COMMITTED)
    await store.close()
    env = reopen(env)
    store = LogTransactionMetadataStore(env, 0, clock=clock)
    live = await store.recover()
    assert [(m.txn_id, m.status) for m in live] == [(open_txn, S.OPEN), (committing, S.COMMITTING)]
    await store.close()


async def test_a_corrupt_record_fails_recovery_loudly(env, clock, reopen):
    store = await open_store(env, clock)
    await drive_to(store, S.OPEN)
    await store.close()
    key = records.log_key(records.coordinator_prefix(0), 0)
    env.write_now(lambda txn: txn.put(key, b"\xff\xff garbage", db=env.db("txn_log")))
    env = reopen(env)
    with pytest.raises(CorruptRecordError, match="transaction log 0"):
        await LogTransactionMetadataStore(env, 0, clock=clock).recover()


async def test_records_of_unknown_txns_are_dropped_on_recovery(env, clock, reopen):
    key = records.log_key(records.coordinator_prefix(0), 5)
    value = records.add_partitions_record(0, 3, ["t"], clock())
    env.write_now(lambda txn: txn.put(key, value, db=env.db("txn_log")))
    store = await open_store(env, clock)
    assert coordinator_records(env, 0) == []
    assert (await store.new_transaction(10)).txn_id == TxnId(0, 4)    # never reuses a seen id
    await store.close()


# --- low watermark -----------------------------------------------------------------------

async def test_low_watermark(env, clock, reopen):
    store = await open_store(env, clock)
    assert store.low_watermark() == -1               # no txn yet: txn 0 is not covered
    t0, t1, t2 = [(await store.new_transaction(1000)).txn_id for _ in range(3)]
    assert store.low_watermark() == -1
    await store.update_status(t0, S.COMMITTING, S.OPEN)
    assert store.low_watermark() == -1               # decided is not ended
    await store.update_status(t0, S.COMMITTED, S.COMMITTING)
    assert store.low_watermark() == 0
    await store.update_status(t2, S.ABORTING, S.OPEN)
    await store.update_status(t2, S.ABORTED, S.ABORTING)
    assert store.low_watermark() == 0
    store, env = await restart(store, reopen, env, clock)
    assert store.low_watermark() == 0
    await store.update_status(t1, S.ABORTING, S.OPEN)
    await store.update_status(t1, S.ABORTED, S.ABORTING)
    assert store.low_watermark() == 2
    t3 = (await store.new_transaction(1000)).txn_id
    assert t3 == TxnId(0, 3) and store.low_watermark() == 2
    await store.close()


# --- storage failures --------------------------------------------------------------------

class FailingEnvironment(StorageEnvironment):
    """Fails every group commit while `failing` is set."""

    failing = False

    def _write_batch(self, writes):
        if self.failing:
            raise StorageError("injected write failure")
        return super()._write_batch(writes)


async def test_a_failed_write_leaves_no_trace(data_dir, clock):
    env = FailingEnvironment(data_dir)
    try:
        store = await open_store(env, clock)
        txn = await drive_to(store, S.OPEN)
        env.failing = True
        with pytest.raises(PersistenceError, match="injected"):
            await store.new_transaction(1000)
        assert store.low_watermark() == -1
        with pytest.raises(PersistenceError):
            await store.add_produced_partitions(txn, ["t"])
        with pytest.raises(PersistenceError):
            await store.update_status(txn, S.COMMITTING, S.OPEN)
        assert store.get(txn).status == S.OPEN
        assert store.get(txn).partitions == []
        env.failing = False
        await store.update_status(txn, S.COMMITTING, S.OPEN)
        env.failing = True
        with pytest.raises(PersistenceError):
            await store.update_status(txn, S.COMMITTED, S.COMMITTING)
        assert store.get(txn).status == S.COMMITTING and store.low_watermark() == -1
        env.failing = False
        await store.update_status(txn, S.COMMITTED, S.COMMITTING)
        assert (await store.new_transaction(1000)).txn_id == TxnId(0, 2)   # 1 was lost, not reused
        assert store.low_watermark() == 1
        await store.close()
    finally:
        env.close()


async def test_a_failed_registration_fails_the_ones_queued_behind_it(env, clock, reopen):
    """A txn's op records chain: one whose write fails takes its txn's later ones with it, so
    the txn's latest write stands for all its registrations (a broker's transactional append
    is written conditional on it: ServerConnection._publish_in_txn)."""
    store = await open_store(env, clock)
    txn, other = await drive_to(store, S.OPEN), await drive_to(store, S.OPEN)
    gate = GatedWriter(env)
    try:
        first = store.register_produced_partitions(txn, ["a"])
        await gate.next_commit()                                   # "a" is being written
        second = store.register_produced_partitions(txn, ["b"])   # queued behind it
        unrelated = store.register_produced_partitions(other, ["c"])
        gate.let_through(OSError(5, "injected I/O error"))
    finally:
        gate.open()
    outcomes = await asyncio.gather(first, second, unrelated, return_exceptions=True)
    assert [isinstance(o, StorageError) for o in outcomes] == [True, True, False]
    assert (store.get(txn).partitions, store.get(other).partitions) == ([], ["c"])
    store, env = await restart(store, reopen, env, clock)
    assert (store.get(txn).partitions, store.get(other).partitions) == ([], ["c"])
    await store.close()


async def test_finished_records_beyond_the_cap_are_purged_oldest_first(env, clock, reopen):
    store = await open_store(env, clock, finished_max_records=3)
    ended = [await drive_to(store, status) for status in (S.COMMITTED, S.ABORTED, S.TIME_OUT, S.COMMITTED, S.ABORTED)]
    assert store.status_counts()[S.COMMITTED] == 2
    assert await store.purge_finished() == 2
    for txn in ended[:2]:
        with pytest.raises(TransactionNotFoundError):
            store.get(txn)
    assert [store.get(txn).status for txn in ended[2:]] == [S.TIME_OUT, S.COMMITTED, S.ABORTED]
    counts = store.status_counts()
    assert {s: n for s, n in counts.items() if n} == {S.TIME_OUT: 1, S.COMMITTED: 1, S.ABORTED: 1}
    store, env = await restart(store, reopen, env, clock, finished_max_records=3)
    assert store.status_counts() == counts
    await store.close()


async def test_status_counts_follow_undone_writes(data_dir, clock):
    env = FailingEnvironment(data_dir)
    try:
        store = await open_store(env, clock)
        txn = await drive_to(store, S.COMMITTING)
        await drive_to(store, S.ABORTED)
        env.failing = True
        with pytest.raises(PersistenceError):
            await store.update_status(txn, S.COMMITTED, S.COMMITTING)
        env.failing = False
        assert {s: n for s, n in store.status_counts().items() if n} == {S.COMMITTING: 1, S.ABORTED: 1}
        await store.close()
    finally:
        env.close()


async def test_submit_final_status_finishes_at_once_and_returns_the_records_write(data_dir, clock):
    """The coordinator's terminal record, which no caller waits for: the txn is finished when
    the call returns; a failed write makes it what it was again (as a failed update_status)."""
    env = FailingEnvironment(data_dir)
    try:
        store = await open_store(env, clock)
        txn = await drive_to(store, S.OPEN)
        await store.add_produced_partitions(txn, ["a"])
        await store.update_status(txn, S.COMMITTING, S.OPEN)
        env.failing = True
        written = store.submit_final_status(txn, S.COMMITTED, S.COMMITTING)
        assert store.get(txn).status == S.COMMITTED
        with pytest.raises(StorageError):
            await written
        assert store.get(txn).status == S.COMMITTING and store.get(txn).partitions == ["a"]
        env.failing = False
        written = store.submit_final_status(txn, S.COMMITTED, S.COMMITTING)
        assert await written is None
        [(_, finished)] = coordinator_records(env, 0)[1:]
        assert finished.op == records.FINISHED and S(finished.new_status) == S.COMMITTED
        with pytest.raises(InvalidTxnStatusError, match="already finished"):
            store.submit_final_status(txn, S.COMMITTED, S.COMMITTING)
        other = await drive_to(store, S.ABORTING)
        for new, expected, match in ((S.COMMITTED, S.COMMITTING, "expected COMMITTING but is ABORTING"),
                                     (S.COMMITTING, S.OPEN, "final status"),
                                     (S.COMMITTED, S.ABORTING, "final status")):
            with pytest.raises(InvalidTxnStatusError, match=match):
                store.submit_final_status(other, new, expected)
        with pytest.raises(TransactionNotFoundError):
            store.submit_final_status(TxnId(0, 99), S.ABORTED, S.ABORTING)
        with pytest.raises(TypeError):
            store.submit_final_status("0:1", S.ABORTED, S.ABORTING)
        with pytest.raises(ValueError):
            store.submit_final_status(other, 42, S.ABORTING)
        assert store.get(other).status == S.ABORTING
        await store.close()
        with pytest.raises(ServiceNotReadyError):
            store.submit_final_status(other, S.ABORTED, S.ABORTING)
    finally:
        env.close()


async def test_partition_registered_only_once_durable_and_while_open(env, clock):
    store = await open_store(env, clock)
    txn = await drive_to(store, S.OPEN)
    assert not store.partition_registered(txn, "a")
    pending = store.register_produced_partitions(txn, ["a"])
    assert not store.partition_registered(txn, "a")          # queued, not durable yet
    await pending
    assert store.partition_registered(txn, "a") and not store.partition_registered(txn, "b")
    later = store.register_acked_subscriptions(txn, [("a", "s")])
    assert not store.partition_registered(txn, "a")          # a write of the txn still in flight
    await later
    assert store.partition_registered(txn, "a")
    assert not store.partition_registered(TxnId(1, txn.least_bits), "a")    # another coordinator's
    await store.update_status(txn, S.ABORTING, S.OPEN)
    assert not store.partition_registered(txn, "a")
    await store.close()
