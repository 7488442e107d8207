"""One test per known Pulsar pending-ack bug that this implementation avoids."""

import asyncio
import time

import pytest

from pyengine.errors import ServiceNotReadyError, TransactionConflictError
from pyengine.transaction.pendingack import IndividualAck, PendingAckReplayError
from pyengine.transaction.pendingack.handle import HandleState
from pyengine_kernels import TxnId
from tests.transaction.pendingack.helpers import (
    EXCLUSIVE,
    FAILOVER,
    KEY_SHARED,
    SHARED,
    T1,
    T2,
    T3,
    acking,
    batch,
    open_subscription,
)


async def test_pulsar_19581_complementary_ack_sets_make_a_batch_undeliverable(env):
    """Cursor acks {0,1,2} plus pending acks {3,4} cover a 5-message batch: Pulsar still
    dispatched it (duplicates while transactions were open)."""
    sub = await open_subscription(env, 2)
    p, q = sub.positions
    await sub.cursor.ack_batch_indexes(p, acking(5, 0, 1, 2), 5)
    await sub.handle.individual_ack(T1, [batch(p, 5, 3, 4)])
    assert sub.handle.is_fully_pending(p, 5)
    assert sub.handle.pending_ack_set(p) == []
    # Two transactions covering a batch between them: the same.
    await sub.handle.individual_ack(T1, [batch(q, 5, 0, 4)])
    assert not sub.handle.is_fully_pending(q, 5)
    await sub.handle.individual_ack(T2, [batch(q, 5, 1, 2, 3)])
    assert sub.handle.is_fully_pending(q, 5)


async def test_pulsar_16032_a_third_txn_can_ack_a_batch_index_after_commit_and_abort(env):
    """Pulsar stored the request's position object and later mutated the cursor's ack set
    through it, so after txn1 committed and txn2 aborted, txn3 could not ack the index txn2
    had released."""
    sub = await open_subscription(env, 1)
    (p,) = sub.positions
    request = [0, 0]
    request[:] = acking(8, 0)
    await sub.handle.individual_ack(T1, [IndividualAck(p, 8, request)])
    await sub.handle.commit(T1, -1)
    request[:] = acking(8, 1)
    await sub.handle.individual_ack(T2, [IndividualAck(p, 8, request)])
    await sub.handle.abort(T2, -1)
    await sub.handle.individual_ack(T3, [batch(p, 8, 1)])
    with pytest.raises(TransactionConflictError):
        await sub.handle.individual_ack(T3, [batch(p, 8, 0)])
    assert sub.cursor.batch_ack_set(p) == acking(8, 0)
    await sub.handle.commit(T3, -1)
    assert sub.cursor.batch_ack_set(p) == acking(8, 0, 1)


@pytest.mark.parametrize("sub_type", [EXCLUSIVE, FAILOVER, SHARED, KEY_SHARED])
async def test_pulsar_15832_batch_conflicts_are_detected_on_every_subscription_type(env, sub_type):
    """Pulsar took the batch size as 1 unless the subscription acked individually, so batch
    conflicts went unnoticed on Exclusive/Failover."""
    sub = await open_subscription(env, 1, sub_type=sub_type)
    (p,) = sub.positions
    await sub.handle.individual_ack(T1, [batch(p, 10, 7)])
    with pytest.raises(TransactionConflictError, match="pending ack status"):
        await sub.handle.individual_ack(T2, [batch(p, 10, 6, 7)])
    await sub.cursor.ack_batch_indexes(p, acking(10, 9), 10)
    with pytest.raises(TransactionConflictError, match="already acked before"):
        await sub.handle.individual_ack(T2, [batch(p, 10, 9)])


async def test_pulsar_10306_abort_releases_the_pending_acks(env, reopen):
    """An app died before committing; after the timeout abort, reprocessing failed with
    'TransactionConflictException ... in pending ack status'."""
    sub = await open_subscription(env, 2)
    p = sub.positions
    await sub.handle.individual_ack(T1, [IndividualAck(p[0]), batch(p[1], 4, 0, 1)])
    assert await sub.handle.abort(T1, -1) == [p[0], p[1]]        # the coordinator's timeout
    after = await open_subscription(reopen(env))                   # also across a restart
    assert after.handle.individual_ack_positions == {}
    await after.handle.individual_ack(T2, [IndividualAck(p[0]), batch(p[1], 4, 0, 1)])
    assert await after.handle.commit(T2, -1) == [p[0], p[1]]


BAD_SEQUENCE = 2490


async def reopened_with_a_corrupt_record(env, reopen):
    """A subscription with 2,500 pending-ack records, one of them (BAD_SEQUENCE) not
    decodable, opened again without replaying; and a list of the replay's chunk reads."""
    sub = await open_subscription(env, 2500)
    await asyncio.gather(*(sub.handle.store.append_individual(T1, [IndividualAck(position)])[1]
                           for position in sub.positions))
    key, db = sub.handle.store._key(BAD_SEQUENCE), env.db("pending_ack")
    await env.submit(lambda txn: txn.put(key, b"\xff\xff\xff", db=db))
    after = await open_subscription(reopen(env), replay=False)
    reads = []
    real_read = after.handle.store._read_chunk
    after.handle.store._read_chunk = lambda *args: reads.append(args) or real_read(*args)
    return after, reads


async def test_pulsar_26369_a_replay_that_cannot_progress_fails_at_once(env, reopen):
    """Pulsar's pending-ack replay could loop forever without a log line (#26369). Here a
    record that cannot be decoded ends the replay at once, in one pass, naming the record."""
    after, reads = await reopened_with_a_corrupt_record(env, reopen)
    started = time.monotonic()
    with pytest.raises(PendingAckReplayError, match=f"pending-ack/sub: record {BAD_SEQUENCE} cannot be decoded"):
        await asyncio.wait_for(after.handle.replay(), timeout=10)
    assert time.monotonic() - started < 10
    assert len(reads) == BAD_SEQUENCE // 1000 + 1              # one pass, no retry
    assert after.handle.state is HandleState.ERROR


async def test_pulsar_26374_a_read_error_is_reported_after_one_attempt(env, reopen):
    """Read errors Pulsar did not classify were retried at once, forever (#26374, ~1000
    reads/s). Here a read error fails the replay after one attempt."""
    after, reads = await reopened_with_a_corrupt_record(env, reopen)

    def broken(*args):
        reads.append(args)
        raise OSError(5, "BookieHandleNotAvailable-like read error")

    after.handle.store._read_chunk = broken
    with pytest.raises(PendingAckReplayError, match="cannot read the records from the start"):
        await asyncio.wait_for(after.handle.replay(), timeout=10)
    assert len(reads) == 1


async def test_pulsar_13654_after_a_failed_replay_every_call_is_answered_at_once(env, reopen):
    """A subscribe never got its answer when pending-ack initialisation failed (#13654). Here a
    handle whose replay failed answers every later call at once with an error."""
    after, _ = await reopened_with_a_corrupt_record(env, reopen)
    with pytest.raises(PendingAckReplayError):
        await asyncio.wait_for(after.handle.replay(), timeout=10)
    with pytest.raises(ServiceNotReadyError, match="PendingAckHandle not replay error!"):
        await asyncio.wait_for(after.handle.individual_ack(T3, [IndividualAck(after.positions[2])]), timeout=1)


async def test_pulsar_19449_after_a_restart_a_message_acked_before_is_a_clean_conflict(env, reopen):
    """After a broker restart transactional consumers kept failing with 'already acked
    before' because acked messages were delivered again. Here the dispatcher is told the
    entry is done, a stray ack of it is one clean conflict, and the rest keeps flowing."""
    sub = await open_subscription(env, 3)
    p = sub.positions
    await sub.handle.individual_ack(T1, [IndividualAck(p[0]), batch(p[1], 3, 0)])
    await sub.handle.commit(T1, -1)
    after = await open_subscription(reopen(env))
    h = after.handle
    assert h.is_fully_pending(p[0])                               # not delivered again
    assert not h.is_fully_pending(p[1], 3) and h.pending_ack_set(p[1]) is None
    with pytest.raises(TransactionConflictError, match="already acked before"):
        await h.individual_ack(T2, [IndividualAck(p[0])])
    with pytest.raises(TransactionConflictError, match="already acked before"):
        await h.individual_ack(T2, [batch(p[1], 3, 0)])
    await h.individual_ack(T2, [batch(p[1], 3, 1, 2), IndividualAck(p[2])])
    await h.commit(T2, -1)
    assert after.cursor.mark_delete == p[2]


async def test_pulsar_7981_batch_index_acks_in_transactions(env, reopen):
    """#7981 / PR #8037: pending ack tracked whole positions only, so a transaction could not
    ack single messages of a batch. Here three txns ack disjoint indexes of one 6-message batch:
    each index is reserved by its txn (across a restart too), a commit acks exactly its indexes
    on the cursor, an abort releases them for another txn, and the entry is done once every
    index is acked."""
    sub = await open_subscription(env, 2, sub_type=SHARED)
    p, q = sub.positions
    t4 = TxnId(1, 4)
    await sub.handle.individual_ack(T1, [batch(p, 6, 0, 1)])
    await sub.handle.individual_ack(T2, [batch(p, 6, 2, 3)])
    await sub.handle.individual_ack(T3, [batch(p, 6, 4, 5)])
    assert sub.handle.is_fully_pending(p, 6)
    await sub.handle.commit(T1, -1)
    assert sub.cursor.batch_ack_set(p) == acking(6, 0, 1)
    await sub.handle.abort(T2, -1)
    assert sub.cursor.batch_ack_set(p) == acking(6, 0, 1)          # 2 and 3 are free again
    assert not sub.handle.is_fully_pending(p, 6)

    after = await open_subscription(reopen(env), sub_type=SHARED)   # T3's reservation survives
    h = after.handle
    with pytest.raises(TransactionConflictError, match="pending ack status"):
        await h.individual_ack(t4, [batch(p, 6, 4)])
    with pytest.raises(TransactionConflictError, match="already acked before"):
        await h.individual_ack(t4, [batch(p, 6, 1)])
    await h.individual_ack(t4, [batch(p, 6, 2, 3)])
    assert h.is_fully_pending(p, 6)
    await h.commit(t4, -1)
    assert after.cursor.batch_ack_set(p) == acking(6, 0, 1, 2, 3)
    assert after.cursor.mark_delete < p
    await h.commit(T3, -1)
    assert after.cursor.mark_delete == p                             # every index acked: the entry is done
    assert after.cursor.batch_ack_set(q) is None
