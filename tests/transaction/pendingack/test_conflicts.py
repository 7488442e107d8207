"""Conflict rules of transactional acks: each kind, and that a refused request leaves nothing."""

import pytest

from pyengine.errors import NotAllowedError, TransactionConflictError
from pyengine.transaction.pendingack import IndividualAck
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


def log_records(sub):
    return sum(len(chunk) for chunk in sub.handle.store.scan(100))


async def test_individual_ack_of_a_message_acked_on_the_cursor_conflicts(env):
    sub = await open_subscription(env, 4)
    p = sub.positions
    await sub.cursor.ack([p[2]])
    with pytest.raises(TransactionConflictError, match="already acked before"):
        await sub.handle.individual_ack(T1, [IndividualAck(p[2])])
    await sub.cursor.ack_cumulative(p[0])
    with pytest.raises(TransactionConflictError, match="already acked before"):
        await sub.handle.individual_ack(T1, [IndividualAck(p[0])])
    assert sub.handle.individual_ack_positions == {} and log_records(sub) == 0


async def test_batch_indexes_acked_on_the_cursor_conflict_only_when_they_overlap(env):
    sub = await open_subscription(env, 2)
    p = sub.positions[0]
    await sub.cursor.ack_batch_indexes(p, acking(5, 0, 1), 5)
    with pytest.raises(TransactionConflictError, match="already acked before"):
        await sub.handle.individual_ack(T1, [batch(p, 5, 1, 2)])
    with pytest.raises(TransactionConflictError, match="already acked before"):
        await sub.handle.individual_ack(T1, [IndividualAck(p, 5)])          # the whole entry
    await sub.handle.individual_ack(T1, [batch(p, 5, 2, 3)])
    assert sub.handle.individual_ack_positions[p].ack_set == tuple(acking(5, 2, 3))


@pytest.mark.parametrize("whole_size", [1, 5])
async def test_a_whole_entry_ack_over_indexes_another_txn_holds_is_a_conflict(env, whole_size):
    """A whole-entry ack names batch size 1 (the wire's and the embedding API's ack of a message
    sent alone, or of an entry without ack set) or the batch's: either way, over indexes another
    txn holds, it is a conflict (TransactionConflictError), not malformed input."""
    sub = await open_subscription(env, 2)
    p = sub.positions[0]
    await sub.handle.individual_ack(T1, [batch(p, 5, 0)])
    with pytest.raises(TransactionConflictError, match="in pending ack status"):
        await sub.handle.individual_ack(T2, [IndividualAck(p, whole_size)])
    assert sub.handle.individual_ack_positions[p].ack_set == tuple(acking(5, 0))
    assert set(sub.handle.individual_ack_of_txn) == {T1}


async def test_batch_indexes_reserved_by_an_open_txn_conflict_for_every_txn(env):
    sub = await open_subscription(env, 2)
    p = sub.positions[0]
    await sub.handle.individual_ack(T1, [batch(p, 70, 3, 65)])
    with pytest.raises(TransactionConflictError, match="in pending ack status"):
        await sub.handle.individual_ack(T2, [batch(p, 70, 65)])
    with pytest.raises(TransactionConflictError, match="in pending ack status"):
        await sub.handle.individual_ack(T1, [batch(p, 70, 3)])               # itself, too
    await sub.handle.individual_ack(T2, [batch(p, 70, 4, 69)])
    await sub.handle.individual_ack(T1, [batch(p, 70, 5)])
    assert sub.handle.individual_ack_of_txn[T1][p].ack_set == tuple(acking(70, 3, 5, 65))
    assert sub.handle.individual_ack_positions[p].ack_set == tuple(acking(70, 3, 4, 5, 65, 69))


async def test_padding_bits_above_the_batch_size_never_conflict(env):
    # Pulsar's isAckSetOverlap flips whole words, so two acks of a 5-message batch could
    # "overlap" on bits 5..63 that are not messages; ackset_conflicts counts real indexes only.
    sub = await open_subscription(env, 1)
    p = sub.positions[0]
    await sub.handle.individual_ack(T1, [batch(p, 5, 0, 1)])
    await sub.handle.individual_ack(T2, [batch(p, 5, 2, 3, 4)])
    assert sub.handle.is_fully_pending(p, 5)


async def test_a_whole_entry_reserved_by_any_txn_conflicts(env):
    sub = await open_subscription(env, 2)
    p = sub.positions[0]
    await sub.handle.individual_ack(T1, [IndividualAck(p)])
    for txn in (T1, T2):
        with pytest.raises(TransactionConflictError, match="in pending ack status"):
            await sub.handle.individual_ack(txn, [IndividualAck(p)])
        with pytest.raises(TransactionConflictError, match="in pending ack status"):
            await sub.handle.individual_ack(txn, [batch(p, 4, 0)])


async def test_a_whole_entry_ack_conflicts_with_any_reserved_index(env):
    sub = await open_subscription(env, 2)
    p = sub.positions[0]
    await sub.handle.individual_ack(T1, [batch(p, 4, 3)])
    with pytest.raises(TransactionConflictError, match="in pending ack status"):
        await sub.handle.individual_ack(T2, [IndividualAck(p, 4)])


async def test_a_refused_request_reserves_and_logs_nothing(env):
    sub = await open_subscription(env, 4)
    p = sub.positions
    await sub.handle.individual_ack(T1, [IndividualAck(p[3])])
    before = (dict(sub.handle.individual_ack_positions), log_records(sub))
    with pytest.raises(TransactionConflictError):
        await sub.handle.individual_ack(T2, [IndividualAck(p[0]), batch(p[1], 3, 0), IndividualAck(p[3])])
    assert (dict(sub.handle.individual_ack_positions), log_records(sub)) == before
    assert T2 not in sub.handle.individual_ack_of_txn
    # The same position twice in one request conflicts with itself.
    with pytest.raises(TransactionConflictError):
        await sub.handle.individual_ack(T2, [batch(p[1], 3, 0), batch(p[1], 3, 0, 2)])
    assert (dict(sub.handle.individual_ack_positions), log_records(sub)) == before
    await sub.handle.individual_ack(T2, [IndividualAck(p[0]), batch(p[1], 3, 0)])
    assert log_records(sub) == 2


@pytest.mark.parametrize("sub_type", [SHARED, KEY_SHARED])
async def test_cumulative_acks_are_not_allowed_on_shared_subscriptions(env, sub_type):
    sub = await open_subscription(env, 3, sub_type=sub_type)
    with pytest.raises(NotAllowedError, match="not allowed"):
        await sub.handle.cumulative_ack(T1, sub.positions[1])
    assert sub.handle.cumulative_ack_of_txn is None and log_records(sub) == 0
    sub.handle.subscription_type = FAILOVER                     # the consumers changed
    await sub.handle.cumulative_ack(T1, sub.positions[1])
    assert sub.handle.cumulative_ack_of_txn == (T1, sub.positions[1])


@pytest.mark.parametrize("sub_type", [EXCLUSIVE, FAILOVER])
async def test_cumulative_ack_rules_of_apache(env, sub_type):
    sub = await open_subscription(env, 6, sub_type=sub_type)
    h, p = sub.handle, sub.positions
    await sub.cursor.ack_cumulative(p[1])
    with pytest.raises(TransactionConflictError, match="markDeletePosition"):
        await h.cumulative_ack(T1, p[1])
    await h.cumulative_ack(T1, p[3])
    with pytest.raises(TransactionConflictError, match="holds a pending cumulative ack"):
        await h.cumulative_ack(T2, p[5])
    for backwards in (p[2], p[3]):
        with pytest.raises(TransactionConflictError, match="within range of its current position"):
            await h.cumulative_ack(T1, backwards)
    await h.cumulative_ack(T1, p[4])
    assert h.cumulative_ack_of_txn == (T1, p[4]) and log_records(sub) == 2


async def test_cumulative_ack_over_an_entry_another_txn_holds_individually_conflicts(env):
    sub = await open_subscription(env, 6)
    h, p = sub.handle, sub.positions
    await h.individual_ack(T1, [batch(p[2], 3, 1)])
    with pytest.raises(TransactionConflictError, match="covering message"):
        await h.cumulative_ack(T2, p[4])
    await h.cumulative_ack(T2, p[1])                            # below it: fine
    await h.individual_ack(T3, [IndividualAck(p[5])])
    assert h.cumulative_ack_of_txn == (T2, p[1])


async def test_individual_ack_under_another_txns_cumulative_ack_conflicts(env):
    sub = await open_subscription(env, 6)
    h, p = sub.handle, sub.positions
    await h.cumulative_ack(T1, p[3])
    for position in (p[0], p[3]):
        with pytest.raises(TransactionConflictError, match="cumulative ack of Transaction:"):
            await h.individual_ack(T2, [IndividualAck(position)])
    await h.individual_ack(T2, [IndividualAck(p[4])])
    # The holder itself may also ack individually below its cumulative position.
    await h.individual_ack(T1, [IndividualAck(p[2])])
    assert sorted(await h.commit(T1, -1)) == [p[2], p[3]]
    assert sub.cursor.mark_delete == p[3]


async def test_own_individual_acks_do_not_block_own_cumulative_ack(env):
    sub = await open_subscription(env, 6)
    h, p = sub.handle, sub.positions
    await h.individual_ack(T1, [IndividualAck(p[1]), IndividualAck(p[5])])
    await h.cumulative_ack(T1, p[3])
    assert await h.commit(T1, -1) == [p[1], p[5], p[3]]
    assert sub.cursor.mark_delete == p[3] and sub.cursor.is_acked(p[5])


async def test_a_cumulative_ack_inside_a_batch_is_one_request(env, reopen):
    """The entries before the batch (cumulatively) and the batch's indexes: a conflict of
    either part reserves and logs nothing of the other (Pulsar holds it as one position)."""
    sub = await open_subscription(env, 4)
    h, p = sub.handle, sub.positions
    await h.individual_ack(T1, [batch(p[2], 4, 1)])
    with pytest.raises(TransactionConflictError, match="batch message"):       # the indexes conflict
        await h.cumulative_ack_in_batch(T2, p[1], batch(p[2], 4, 0, 1, 2))
    await h.individual_ack(T1, [IndividualAck(p[0])])
    with pytest.raises(TransactionConflictError, match="covering message"):    # the entries before do
        await h.cumulative_ack_in_batch(T2, p[1], batch(p[2], 4, 0))
    assert h.cumulative_ack_of_txn is None and T2 not in h.individual_ack_of_txn
    assert log_records(sub) == 2
    env = reopen(env)
    sub = await open_subscription(env)
    h = sub.handle
    assert h.cumulative_ack_of_txn is None and T2 not in h.individual_ack_of_txn
    await h.abort(T1, -1)
    await h.cumulative_ack_in_batch(T2, p[1], batch(p[2], 4, 0, 1))
    assert log_records(sub) == 2                                # both parts, in one write
    sub = await open_subscription(reopen(env))
    h = sub.handle
    assert h.cumulative_ack_of_txn == (T2, p[1]) and h.pending_ack_set(p[2]) == acking(4, 0, 1)
    assert await h.commit(T2, -1) == [p[2], p[1]]
    assert sub.cursor.mark_delete == p[1] and sub.cursor.batch_ack_set(p[2]) == acking(4, 0, 1)
