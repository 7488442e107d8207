"""What the dispatcher asks: is an entry fully pending, and which indexes are still free."""

from pyengine.transaction.pendingack import IndividualAck
from pyengine_kernels import ackset_new
from tests.transaction.pendingack.helpers import T1, T2, acking, open_subscription


def batch(position, size, *indexes):
    return IndividualAck(position, size, tuple(acking(size, *indexes)))


async def test_untouched_entries_are_neither_pending_nor_reserved(env):
    sub = await open_subscription(env, 2)
    p = sub.positions[0]
    assert not sub.handle.is_fully_pending(p) and not sub.handle.is_fully_pending(p, 10)
    assert sub.handle.pending_ack_set(p) is None


async def test_entries_acked_on_the_cursor_are_fully_pending_without_a_txn(env):
    sub = await open_subscription(env, 2)
    p = sub.positions[0]
    await sub.cursor.ack([p])
    assert sub.handle.is_fully_pending(p, 5) and sub.handle.pending_ack_set(p) is None


async def test_a_whole_entry_reserved_is_fully_pending(env):
    sub = await open_subscription(env, 2)
    p = sub.positions[1]
    await sub.handle.individual_ack(T1, [IndividualAck(p)])
    assert sub.handle.is_fully_pending(p) and sub.handle.is_fully_pending(p, 7)
    assert sub.handle.pending_ack_set(p) == []


async def test_a_partly_reserved_batch_is_delivered_with_the_combined_ack_set(env):
    sub = await open_subscription(env, 2)
    p = sub.positions[0]
    await sub.cursor.ack_batch_indexes(p, acking(5, 0), 5)
    await sub.handle.individual_ack(T1, [batch(p, 5, 1)])
    await sub.handle.individual_ack(T2, [batch(p, 5, 3)])
    assert not sub.handle.is_fully_pending(p, 5)
    assert sub.handle.pending_ack_set(p) == acking(5, 0, 1, 3)       # indexes 2 and 4 free


async def test_batches_over_64_messages_use_several_words(env):
    sub = await open_subscription(env, 1)
    p = sub.positions[0]
    await sub.handle.individual_ack(T1, [batch(p, 130, *range(0, 130, 2))])
    assert not sub.handle.is_fully_pending(p, 130)
    await sub.handle.individual_ack(T2, [batch(p, 130, *range(1, 130, 2))])
    assert sub.handle.is_fully_pending(p, 130) and sub.handle.pending_ack_set(p) == []


async def test_entries_under_a_pending_cumulative_ack_are_fully_pending(env):
    sub = await open_subscription(env, 4)
    h, p = sub.handle, sub.positions
    await h.cumulative_ack(T1, p[2])
    assert all(h.is_fully_pending(position, 3) for position in p[:3])
    assert h.pending_ack_set(p[1]) == []
    assert not h.is_fully_pending(p[3]) and h.pending_ack_set(p[3]) is None


async def test_after_abort_the_batch_is_free_again(env):
    sub = await open_subscription(env, 1)
    p = sub.positions[0]
    await sub.handle.individual_ack(T1, [batch(p, 3, 0, 1, 2)])
    assert sub.handle.is_fully_pending(p, 3)
    await sub.handle.abort(T1, -1)
    assert not sub.handle.is_fully_pending(p, 3) and sub.handle.pending_ack_set(p) is None
    assert ackset_new(3) == acking(3)
