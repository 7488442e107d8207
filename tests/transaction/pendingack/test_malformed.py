"""Malformed input to every public method gets a clear TypeError / ValueError and changes
nothing."""

import pytest

from pyengine.transaction.pendingack import IndividualAck
from pyengine.transaction.pendingack.handle import PendingAckHandleImpl
from pyengine.transaction.pendingack.log_store import LogPendingAckStore
from pyengine_kernels import Position
from tests.transaction.pendingack.helpers import T1, T2, acking, open_subscription

FULL_WORD = -1


def bad_individual_requests(p):
    return [
        (TypeError, "txn must be a TxnId", "(1,1)", [IndividualAck(p)]),
        (TypeError, "acks must be a list", T1, IndividualAck(p)),
        (TypeError, "acks must be a list", T1, "1:0"),
        (ValueError, "at least one position", T1, []),
        (TypeError, r"acks\[0\] must be an IndividualAck", T1, [p]),
        (TypeError, r"acks\[0\].position must be a Position", T1, [IndividualAck((1, 0))]),
        (ValueError, "does not name an entry", T1, [IndividualAck(Position(-1, -1))]),
        (ValueError, "does not name an entry", T1, [IndividualAck(Position(p.ledger_id, -1))]),
        (ValueError, "batch_size must be between", T1, [IndividualAck(p, 0)]),
        (ValueError, "batch_size must be between", T1, [IndividualAck(p, -3)]),
        (ValueError, "batch_size must be between", T1, [IndividualAck(p, 2**31)]),
        (TypeError, "batch_size must be an int", T1, [IndividualAck(p, True)]),
        (TypeError, "batch_size must be an int", T1, [IndividualAck(p, 2.0)]),
        (TypeError, "ack_set must be a sequence", T1, [IndividualAck(p, 5, 3)]),
        (TypeError, "ack_set must be a sequence", T1, [IndividualAck(p, 5, b"\x01")]),
        (TypeError, r"ack_set\[0\] must be an int", T1, [IndividualAck(p, 5, ("3",))]),
        (TypeError, r"ack_set\[0\] must be an int, not bool", T1, [IndividualAck(p, 5, (True,))]),
        (ValueError, "outside the signed 64-bit range", T1, [IndividualAck(p, 64, (2**63,))]),
        (ValueError, "has 2 words", T1, [IndividualAck(p, 5, (1, 0))]),
        (ValueError, "indexes >= the batch size", T1, [IndividualAck(p, 5, (0b100001,))]),
        (ValueError, "indexes >= the batch size", T1, [IndividualAck(p, 70, (FULL_WORD, 1 << 6))]),
        (ValueError, "acknowledges no index", T1, [IndividualAck(p, 5, tuple(acking(5)))]),
    ]


async def test_individual_ack_rejects_malformed_requests(env):
    sub = await open_subscription(env, 2)
    p = sub.positions[0]
    for error, message, txn, acks in bad_individual_requests(p):
        with pytest.raises(error, match=message):
            await sub.handle.individual_ack(txn, acks)
    beyond = Position(p.ledger_id, 99)
    with pytest.raises(ValueError, match="beyond the last entry"):
        await sub.handle.individual_ack(T1, [IndividualAck(p), IndividualAck(beyond)])
    assert sub.handle.individual_ack_positions == {} and sub.handle.stats()["log_records"] == 0


async def test_a_batch_size_different_from_an_earlier_acks_is_refused(env):
    sub = await open_subscription(env, 1)
    p = sub.positions[0]
    await sub.handle.individual_ack(T1, [IndividualAck(p, 5, tuple(acking(5, 0)))])
    with pytest.raises(ValueError, match="batch size 6 of .* differs from the batch size 5"):
        await sub.handle.individual_ack(T2, [IndividualAck(p, 6, tuple(acking(6, 5)))])
    assert T2 not in sub.handle.individual_ack_of_txn


async def test_the_callers_ack_set_is_copied_and_trimmed(env):
    sub = await open_subscription(env, 1)
    p = sub.positions[0]
    words = [FULL_WORD, 0]              # acks indexes 64..69, with a trailing zero word
    ack = IndividualAck(p, 70, words)
    await sub.handle.individual_ack(T1, [ack])
    words[0] = 0                                                 # the caller reuses its list
    assert sub.handle.individual_ack_positions[p].ack_set == (FULL_WORD,)


async def test_cumulative_ack_commit_abort_and_queries_reject_malformed_input(env):
    sub = await open_subscription(env, 2)
    h, p = sub.handle, sub.positions[0]
    with pytest.raises(TypeError, match="txn must be a TxnId"):
        await h.cumulative_ack(None, p)
    with pytest.raises(TypeError, match="position must be a Position"):
        await h.cumulative_ack(T1, "1:0")
    with pytest.raises(ValueError, match="does not name an entry"):
        await h.cumulative_ack(T1, Position(-1, -1))
    with pytest.raises(ValueError, match="beyond the last entry"):
        await h.cumulative_ack(T1, Position(p.ledger_id + 5, 0))
    for end in (h.commit, h.abort):
        with pytest.raises(TypeError, match="txn must be a TxnId"):
            await end((1, 1), -1)
        with pytest.raises(ValueError, match="low_watermark must be -1"):
            await end(T1, -2)
        with pytest.raises(TypeError, match="low_watermark must be an int"):
            await end(T1, "5")
    with pytest.raises(TypeError):
        h.is_fully_pending((1, 0))
    with pytest.raises(ValueError, match="does not name an entry"):
        h.is_fully_pending(Position(0, -1))
    with pytest.raises(ValueError, match="batch_size must be between"):
        h.is_fully_pending(p, 0)
    with pytest.raises(TypeError):
        h.pending_ack_set(None)
    assert h.cumulative_ack_of_txn is None


async def test_constructor_rejects_bad_arguments(env):
    sub = await open_subscription(env, 1)
    store = LogPendingAckStore.for_cursor(sub.cursor)
    with pytest.raises(ValueError, match="subscription_type"):
        PendingAckHandleImpl(sub.cursor, store, subscription_type=7)
    with pytest.raises(ValueError, match="subscription_type"):
        sub.handle.subscription_type = True
    with pytest.raises(ValueError, match="replay_chunk"):
        PendingAckHandleImpl(sub.cursor, store, subscription_type=0, replay_chunk=0)
    reader = sub.ledger.new_non_durable_cursor(sub.positions[0])
    with pytest.raises(ValueError, match="durable cursor"):
        PendingAckHandleImpl(reader, store, subscription_type=0)
    with pytest.raises(ValueError, match="must not be empty"):
        LogPendingAckStore(sub.ledger.env, b"", "x")
