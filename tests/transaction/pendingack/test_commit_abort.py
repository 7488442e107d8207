"""Commit and abort: what reaches the cursor, idempotency, atomicity, failed writes, low
watermarks."""

import asyncio

import pytest

from pyengine.errors import InvalidTxnStatusError, PersistenceError, TransactionConflictError
from pyengine.storage import StorageError
from pyengine.transaction.pendingack import IndividualAck
from pyengine_kernels import TxnId
from tests.transaction.pendingack.helpers import T1, T2, T3, acking, open_subscription


def batch(position, size, *indexes):
    return IndividualAck(position, size, tuple(acking(size, *indexes)))


def log_records(sub):
    return sum(len(chunk) for chunk in sub.handle.store.scan(100))


async def test_commit_applies_individual_and_batch_acks_to_the_cursor(env):
    sub = await open_subscription(env, 4)
    h, p = sub.handle, sub.positions
    await h.individual_ack(T1, [IndividualAck(p[0]), batch(p[2], 5, 0, 4)])
    await h.individual_ack(T1, [IndividualAck(p[3])])
    assert not sub.cursor.is_acked(p[0])                        # nothing before the commit
    assert await h.commit(T1, -1) == [p[0], p[2], p[3]]
    assert sub.cursor.mark_delete == p[0] and sub.cursor.is_acked(p[3])
    assert sub.cursor.batch_ack_set(p[2]) == acking(5, 0, 4)
    assert h.individual_ack_of_txn == {} and h.individual_ack_positions == {} and log_records(sub) == 0


async def test_a_cancelled_ack_caller_keeps_its_logged_ack_for_the_commit(env):
    sub = await open_subscription(env, 2)
    h, p = sub.handle, sub.positions
    ack = asyncio.ensure_future(h.individual_ack(T1, [IndividualAck(p[0])]))
    await asyncio.sleep(0)                               # reserved, its record being written
    ack.cancel()
    with pytest.raises(asyncio.CancelledError):
        await ack
    assert await asyncio.wait_for(h.commit(T1, -1), 5) == [p[0]]   # after the record, not stuck
    assert sub.cursor.is_acked(p[0]) and log_records(sub) == 0


async def test_committed_batch_indexes_complete_an_entry(env):
    sub = await open_subscription(env, 2)
    h, p = sub.handle, sub.positions[0]
    await sub.cursor.ack_batch_indexes(p, acking(3, 0), 3)
    await h.individual_ack(T1, [batch(p, 3, 1, 2)])
    await h.commit(T1, -1)
    assert sub.cursor.is_acked(p) and sub.cursor.batch_ack_set(p) is None


async def test_commit_and_abort_are_idempotent(env):
    sub = await open_subscription(env, 3)
    h, p = sub.handle, sub.positions
    assert await h.commit(TxnId(9, 9), -1) == []                  # never seen: success
    assert await h.abort(TxnId(9, 9), -1) == []
    await h.individual_ack(T1, [IndividualAck(p[0])])
    assert await h.commit(T1, -1) == [p[0]]
    assert await h.commit(T1, -1) == []
    await h.cumulative_ack(T2, p[2])
    assert await h.abort(T2, -1) == [p[2]]
    assert await h.abort(T2, -1) == []
    assert sub.cursor.mark_delete == p[0]


async def test_abort_returns_the_positions_and_frees_exactly_its_batch_indexes(env):
    sub = await open_subscription(env, 3)
    h, p = sub.handle, sub.positions
    await h.individual_ack(T1, [batch(p[0], 8, 0, 1), IndividualAck(p[2])])
    await h.individual_ack(T2, [batch(p[0], 8, 2, 3)])
    assert await h.abort(T1, -1) == [p[0], p[2]]
    assert h.individual_ack_positions[p[0]].ack_set == tuple(acking(8, 2, 3))
    assert T1 not in h.individual_ack_of_txn and p[2] not in h.individual_ack_positions
    await h.individual_ack(T3, [batch(p[0], 8, 0, 1), IndividualAck(p[2])])   # free again
    with pytest.raises(TransactionConflictError):
        await h.individual_ack(T3, [batch(p[0], 8, 3)])
    assert await h.abort(T2, -1) == [p[0]]
    assert h.individual_ack_positions[p[0]].ack_set == tuple(acking(8, 0, 1))
    assert await h.abort(T3, -1) == [p[0], p[2]]
    assert h.individual_ack_positions == {} and log_records(sub) == 0
    assert not any(sub.cursor.is_acked(position) for position in p)


async def test_repeated_commit_while_the_first_is_in_flight_waits_for_it(env):
    sub = await open_subscription(env, 2)
    h, p = sub.handle, sub.positions
    await h.individual_ack(T1, [IndividualAck(p[0])])
    first, second = await asyncio.gather(h.commit(T1, -1), h.commit(T1, -1))
    assert first == second == [p[0]]
    await h.individual_ack(T2, [IndividualAck(p[1])])
    commit = asyncio.ensure_future(h.commit(T2, -1))
    await asyncio.sleep(0)
    with pytest.raises(InvalidTxnStatusError, match="being committed"):
        await h.abort(T2, -1)
    with pytest.raises(InvalidTxnStatusError, match="ending"):
        await h.individual_ack(T2, [IndividualAck(p[1])])
    assert await commit == [p[1]]


async def test_commit_waits_for_the_txns_acks_still_being_logged(env):
    sub = await open_subscription(env, 2)
    h, p = sub.handle, sub.positions
    ack = asyncio.ensure_future(h.individual_ack(T1, [IndividualAck(p[1])]))
    await asyncio.sleep(0)
    assert await h.commit(T1, -1) == [p[1]]
    await ack
    assert sub.cursor.is_acked(p[1]) and log_records(sub) == 0


async def test_a_failed_log_write_leaves_no_trace(env):
    sub = await open_subscription(env, 3)
    h, p = sub.handle, sub.positions
    original = env._write_batch

    def failing(writes):
        raise OSError(5, "simulated I/O error")

    env._write_batch = failing
    with pytest.raises(PersistenceError, match="simulated"):
        await h.individual_ack(T1, [IndividualAck(p[0]), batch(p[1], 4, 1)])
    with pytest.raises(PersistenceError):
        await h.cumulative_ack(T2, p[2])
    with pytest.raises(PersistenceError):
        await h.cumulative_ack_in_batch(T3, p[0], batch(p[1], 4, 0))
    assert h.individual_ack_positions == {} and h.cumulative_ack_of_txn is None
    assert h.stats()["transactions"] == {}
    env._write_batch = original
    await h.individual_ack(T1, [IndividualAck(p[0]), batch(p[1], 4, 1)])      # a retry works
    await h.cumulative_ack(T1, p[2])
    assert log_records(sub) == 2


async def test_a_failed_commit_keeps_the_txn_and_a_repeated_commit_completes_it(env, reopen):
    sub = await open_subscription(env, 3)
    h, p = sub.handle, sub.positions
    await h.individual_ack(T1, [IndividualAck(p[1])])
    original = env._write_batch

    def failing(writes):
        raise OSError(28, "simulated disk full")

    env._write_batch = failing
    with pytest.raises(PersistenceError):
        await h.commit(T1, -1)
    assert T1 in h.individual_ack_of_txn and log_records(sub) == 1
    env._write_batch = original
    # The cursor's memory already holds the ack; the repeat must still write it.
    assert await h.commit(T1, -1) == [p[1]]
    await env.drain()
    again = await open_subscription(reopen(env))
    assert again.cursor.is_acked(p[1]) and again.handle.individual_ack_of_txn == {}
    assert log_records(again) == 0


async def test_commit_lands_in_one_write_transaction_crash_inside_it(env, reopen):
    """A crash while the commit's LMDB transaction is open (cursor written, records not yet
    deleted) leaves neither: the records stay and the cursor keeps its old state."""
    sub = await open_subscription(env, 4)
    h, p = sub.handle, sub.positions
    await h.individual_ack(T1, [IndividualAck(p[0]), batch(p[1], 3, 2)])
    raw = env._env

    def crash_before_commit(writes):
        with raw.begin(write=True) as txn:
            for write in writes:
                write(txn)
            raise SystemError("simulated crash before the LMDB commit")

    env._write_batch = crash_before_commit
    with pytest.raises(PersistenceError):
        await h.commit(T1, -1)
    after = await open_subscription(reopen(env))
    assert not after.cursor.is_acked(p[0]) and after.cursor.batch_ack_set(p[1]) is None
    assert set(after.handle.individual_ack_of_txn[T1]) == {p[0], p[1]}
    assert await after.handle.commit(T1, -1) == [p[0], p[1]]   # the coordinator tells us again
    assert after.cursor.mark_delete == p[0] and after.cursor.batch_ack_set(p[1]) == acking(3, 2)


@pytest.mark.parametrize("close_when", ["queued", "handed_to_writer"])
async def test_commit_is_all_or_nothing_when_the_env_closes_right_after_submit(env, reopen, close_when):
    """Close the environment right after commit submitted its writes: while they are still
    queued nothing is written; once the batch is with the writer, close waits for it and
    everything is. Never the cursor without the deletion or the other way round."""
    sub = await open_subscription(env, 4)
    h, p = sub.handle, sub.positions
    await h.individual_ack(T1, [IndividualAck(p[0]), IndividualAck(p[2]), batch(p[1], 3, 0)])
    await h.cumulative_ack(T1, p[0])
    loop = asyncio.get_running_loop()
    swallowed = []
    loop.set_exception_handler(lambda _loop, context: swallowed.append(context))
    commit = asyncio.ensure_future(h.commit(T1, -1))
    reached = (lambda: env._pending) if close_when == "queued" else (lambda: env._flushing)
    for _ in range(100):
        if reached():
            break
        await asyncio.sleep(0)
    assert reached()
    env.close()
    await asyncio.sleep(0.05)
    commit.cancel()
    loop.set_exception_handler(None)
    after = await open_subscription(reopen())
    applied = after.cursor.is_acked(p[0])
    assert applied == (close_when == "handed_to_writer")
    assert after.cursor.is_acked(p[2]) == applied
    assert (after.cursor.batch_ack_set(p[1]) == acking(3, 0)) == applied
    assert (log_records(after) == 0) == applied
    assert (T1 in after.handle.individual_ack_of_txn) == (not applied)
    assert (after.handle.cumulative_ack_of_txn == (T1, p[0])) == (not applied)
    assert await after.handle.commit(T1, -1) == ([] if applied else [p[0], p[1], p[2], p[0]])
    assert after.cursor.mark_delete == p[0] and after.cursor.is_acked(p[2])


async def test_an_ack_by_a_txn_below_the_low_watermark_is_refused(env):
    sub = await open_subscription(env, 3)
    h, p = sub.handle, sub.positions
    await h.individual_ack(TxnId(1, 5), [IndividualAck(p[0])])
    await h.commit(TxnId(1, 5), 5)
    for late in (TxnId(1, 5), TxnId(1, 4)):
        with pytest.raises(InvalidTxnStatusError, match="already ended"):
            await h.individual_ack(late, [IndividualAck(p[1])])
    await h.individual_ack(TxnId(1, 6), [IndividualAck(p[1])])
    await h.individual_ack(TxnId(2, 1), [IndividualAck(p[2])])  # another coordinator


async def test_the_low_watermark_aborts_txns_that_acked_after_their_end(env):
    released = []
    sub = await open_subscription(env, 4, on_release=lambda positions, *, txn: released.append((positions, txn)))
    h, p = sub.handle, sub.positions
    await h.individual_ack(TxnId(1, 2), [IndividualAck(p[1])])   # its end never reaches us
    await h.individual_ack(TxnId(1, 7), [IndividualAck(p[2])])
    await h.individual_ack(TxnId(2, 1), [IndividualAck(p[3])])
    await h.individual_ack(TxnId(1, 3), [IndividualAck(p[0])])
    assert await h.commit(TxnId(1, 3), 3) == [p[0]]
    # With the aborted txn: only its messages are the subscription's to give back (a commit
    # under way, whose acks the handle no longer holds, is not aborted).
    assert released == [([p[1]], TxnId(1, 2))]
    assert set(h.individual_ack_of_txn) == {TxnId(1, 7), TxnId(2, 1)}
    assert not sub.cursor.is_acked(p[1]) and log_records(sub) == 2


async def test_stats(env):
    sub = await open_subscription(env, 4)
    h, p = sub.handle, sub.positions
    await h.individual_ack(T1, [IndividualAck(p[0]), batch(p[1], 3, 0)])
    await h.individual_ack(T2, [batch(p[1], 3, 1)])
    stats = h.stats()
    assert stats["state"] == "ready"
    assert stats["pending_individual_positions"] == 2
    assert stats["pending_cumulative_ack"] is None
    assert stats["transactions"] == {
        "(1,1)": {"individual_positions": 2, "cumulative_position": None, "log_records": 1},
        "(1,2)": {"individual_positions": 1, "cumulative_position": None, "log_records": 1},
    }
    assert stats["log_records"] == 2
    await h.abort(T1, -1)
    await h.abort(T2, -1)
    await h.cumulative_ack(T3, p[2])
    stats = h.stats()
    assert stats["pending_cumulative_ack"] == {"txn": "(1,3)", "position": str(p[2])}
    assert stats["transactions"] == {
        "(1,3)": {"individual_positions": 0, "cumulative_position": str(p[2]), "log_records": 1}}


async def test_env_failure_at_submit_is_a_persistence_error(env):
    sub = await open_subscription(env, 2)
    h, p = sub.handle, sub.positions

    def closed(*args, **kwargs):
        raise StorageError("the storage environment is closed")

    env.submit = closed
    with pytest.raises(PersistenceError):
        await h.individual_ack(T1, [IndividualAck(p[0])])
    assert h.individual_ack_positions == {}
    del env.submit


async def test_an_end_looks_only_at_the_txns_under_the_low_watermark(env, monkeypatch):
    """Found by an audit: each commit or abort sorted every transaction holding acks on the
    subscription (1000 commits took 7.4 s with 20,000 others open). As Pulsar's
    handleLowWaterMark, an end now looks at the oldest transactions only: those at or under
    the low watermark."""
    from pyengine.transaction.pendingack.state import PendingAckState

    sub = await open_subscription(env, 1200, per_ledger=10_000)
    h, p = sub.handle, sub.positions
    await asyncio.gather(*(h.individual_ack(TxnId(1, 1000 + i), [IndividualAck(p[i])]) for i in range(1000)))
    mine = [TxnId(1, i + 1) for i in range(100)]
    await asyncio.gather(*(h.individual_ack(t, [IndividualAck(p[1000 + i])]) for i, t in enumerate(mine)))
    looked_at = []                       # every transaction an end examines, however it does
    holds, txns = PendingAckState.holds, PendingAckState.txns
    monkeypatch.setattr(PendingAckState, "holds", lambda state, txn: looked_at.append(txn) or holds(state, txn))
    monkeypatch.setattr(PendingAckState, "txns", lambda state: looked_at.extend(txns(state)) or txns(state))
    for txn in mine:                     # each end moves the low watermark to itself
        await h.commit(txn, txn.least_bits)
    assert len(looked_at) <= len(mine)   # each one once (the 1000 open above it: never)
    assert all(sub.cursor.is_acked(p[1000 + i]) for i in range(100))
    assert len(h.individual_ack_of_txn) == 1000


async def test_the_low_watermark_aborts_replayed_txns_too(env):
    sub = await open_subscription(env, 3)
    await sub.handle.individual_ack(TxnId(1, 2), [IndividualAck(sub.positions[1])])
    await sub.handle.individual_ack(TxnId(1, 9), [IndividualAck(sub.positions[2])])
    await sub.ledger.close()
    released = []
    after = await open_subscription(env, on_release=lambda positions, *, txn: released.append((positions, txn)))
    await after.handle.individual_ack(TxnId(1, 3), [IndividualAck(after.positions[0])])
    await after.handle.commit(TxnId(1, 3), 3)
    assert released == [([after.positions[1]], TxnId(1, 2))]
    assert set(after.handle.individual_ack_of_txn) == {TxnId(1, 9)}
