"""Replay after a restart, the error state, and the life cycle of a handle."""

import pytest

from pyengine.errors import ServiceNotReadyError, TransactionConflictError
from pyengine.transaction.pendingack import IndividualAck, PendingAckReplayError
from pyengine.transaction.pendingack.handle import HandleState
from tests.transaction.pendingack.helpers import FAILOVER, T1, T2, T3, acking, open_subscription


def batch(position, size, *indexes):
    return IndividualAck(position, size, tuple(acking(size, *indexes)))


def snapshot(handle):
    return (dict(handle.individual_ack_positions),
            {txn: dict(acks) for txn, acks in handle.individual_ack_of_txn.items()},
            handle.cumulative_ack_of_txn)


async def test_replay_rebuilds_the_same_state_after_a_restart(env, reopen):
    sub = await open_subscription(env, 8, sub_type=FAILOVER)
    h, p = sub.handle, sub.positions
    await h.individual_ack(T1, [IndividualAck(p[5]), batch(p[6], 70, 0, 64)])
    await h.individual_ack(T2, [batch(p[6], 70, 1, 69)])
    await h.individual_ack(T1, [batch(p[6], 70, 2)])
    await h.cumulative_ack(T3, p[2])
    await h.cumulative_ack(T3, p[3])
    await h.individual_ack(T2, [IndividualAck(p[7])])
    await h.abort(T2, -1)
    before = snapshot(h)
    after = await open_subscription(reopen(env), sub_type=FAILOVER, replay_chunk=2)
    assert snapshot(after.handle) == before
    assert after.handle.stats()["log_records"] == 4
    # The replayed state answers like the original one.
    with pytest.raises(TransactionConflictError):
        await after.handle.individual_ack(T2, [batch(p[6], 70, 64)])
    assert await after.handle.commit(T3, -1) == [p[3]]
    assert after.cursor.mark_delete == p[3]


async def test_replay_drops_what_the_cursor_acknowledged_meanwhile(env, reopen):
    sub = await open_subscription(env, 6)
    h, p = sub.handle, sub.positions
    await h.individual_ack(T1, [IndividualAck(p[0]), IndividualAck(p[4]), batch(p[5], 4, 0, 1)])
    await h.individual_ack(T2, [IndividualAck(p[2])])
    # The cursor moved on without the handle (another path acknowledged).
    await sub.cursor.ack_cumulative(p[2])
    await sub.cursor.ack_batch_indexes(p[5], acking(4, 1, 2), 4)
    after = await open_subscription(reopen(env))
    assert after.handle.individual_ack_of_txn == {T1: {p[4]: after.handle.individual_ack_positions[p[4]],
                                                       p[5]: after.handle.individual_ack_positions[p[5]]}}
    assert after.handle.individual_ack_positions[p[5]].ack_set == tuple(acking(4, 0))
    # T2's record is kept until T2 ends, so that it is deleted then.
    assert after.handle.stats()["transactions"]["(1,2)"]["log_records"] == 1
    assert await after.handle.abort(T2, -1) == []
    assert after.handle.stats()["log_records"] == 1


async def test_a_cumulative_ack_at_or_below_the_mark_delete_is_dropped_on_replay(env, reopen):
    sub = await open_subscription(env, 4)
    await sub.handle.cumulative_ack(T1, sub.positions[1])
    await sub.cursor.ack_cumulative(sub.positions[2])
    after = await open_subscription(reopen(env))
    assert after.handle.cumulative_ack_of_txn is None
    await after.handle.cumulative_ack(T2, sub.positions[3])


async def test_calls_before_replay_and_after_close_are_refused(env):
    sub = await open_subscription(env, 2, replay=False)
    h, p = sub.handle, sub.positions
    assert h.state is HandleState.NONE
    for call in (lambda: h.is_fully_pending(p[0]), lambda: h.pending_ack_set(p[0])):
        with pytest.raises(ServiceNotReadyError, match="not replayed"):
            call()
    with pytest.raises(ServiceNotReadyError, match="not replayed"):
        await h.individual_ack(T1, [IndividualAck(p[0])])
    await h.replay()
    await h.replay()                                            # already ready: nothing to do
    await h.individual_ack(T1, [IndividualAck(p[0])])
    await h.close()
    assert h.stats()["state"] == "closed"
    with pytest.raises(ServiceNotReadyError, match="have been closed"):
        await h.commit(T1, -1)
    with pytest.raises(ServiceNotReadyError, match="have been closed"):
        await h.replay()


async def test_a_corrupt_record_fails_replay_with_the_subscription_and_record_named(env, reopen):
    sub = await open_subscription(env, 3)
    await sub.handle.individual_ack(T1, [IndividualAck(sub.positions[0])])
    await sub.handle.individual_ack(T2, [IndividualAck(sub.positions[1])])
    key = sub.handle.store._key(1)
    db = env.db("pending_ack")
    await env.submit(lambda txn: txn.put(key, b"\x08\x01\xff\xff", db=db))
    after = await open_subscription(reopen(env), replay=False)
    with pytest.raises(PendingAckReplayError, match=r"pending-ack/sub.*record 1 cannot be decoded"):
        await after.handle.replay()
    assert after.handle.state is HandleState.ERROR
    assert "record 1" in after.handle.stats()["replay_error"]
    for call in (after.handle.commit(T1, -1), after.handle.abort(T1, -1),
                 after.handle.individual_ack(T3, [IndividualAck(sub.positions[2])]),
                 after.handle.cumulative_ack(T3, sub.positions[2])):
        with pytest.raises(ServiceNotReadyError, match="PendingAckHandle not replay error!"):
            await call
    with pytest.raises(ServiceNotReadyError, match="not replay error"):
        after.handle.is_fully_pending(sub.positions[0])
    # Once the record is repaired (here: removed), a new replay succeeds.
    await after.ledger.env.submit(lambda txn: txn.delete(key, db=after.ledger.env.db("pending_ack")))
    await after.handle.replay()
    assert after.handle.state is HandleState.READY
    assert set(after.handle.individual_ack_of_txn) == {T1}


async def test_a_record_that_decodes_but_is_invalid_fails_replay(env, reopen):
    from pyengine.transaction.pendingack.records_pb2 import CUMULATIVE, PendingAckPositionRecord, PendingAckRecord

    sub = await open_subscription(env, 2)
    bad = PendingAckRecord(txn_most=1, txn_least=1, kind=CUMULATIVE, positions=[
        PendingAckPositionRecord(ledger_id=1, entry_id=0), PendingAckPositionRecord(ledger_id=1, entry_id=1)])
    key, db = sub.handle.store._key(0), env.db("pending_ack")
    await env.submit(lambda txn: txn.put(key, bad.SerializeToString(), db=db))
    after = await open_subscription(reopen(env), replay=False)
    with pytest.raises(PendingAckReplayError, match="record 0 cannot be decoded: a cumulative record"):
        await after.handle.replay()


async def test_a_key_that_is_not_prefix_plus_sequence_fails_replay(env, reopen):
    sub = await open_subscription(env, 2)
    key, db = sub.handle.store._prefix + b"\x01", env.db("pending_ack")
    await env.submit(lambda txn: txn.put(key, b"", db=db))
    after = await open_subscription(reopen(env), replay=False)
    with pytest.raises(PendingAckReplayError, match="is not prefix \\+ sequence"):
        await after.handle.replay()
