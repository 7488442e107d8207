"""An ack that repeats one whose save is still in flight (a client's retry, a duplicate ack), or
that an ack in flight already covers, changes nothing in memory; its answer (the broker's ack
receipt) must still wait for that save: answered at once, a kill -9 before the save lands loses
an ack the client was told is done. And when that save fails, the repeat fails too. An ack
repeating a state already saved is answered at once, as before."""

import asyncio

import pytest

from pyengine.storage import ManagedLedger, StorageEnvironment, StorageError
from pyengine_kernels import Position, ackset_new
from tests.broker.helpers import GatedWriter

TOPIC = "persistent://public/default/acks"
SOME_INDEXES = [ackset_new(4)[0] & ~0b11]          # indexes 0 and 1 of 4 acknowledged
HOW = ["individual", "cumulative", "batch_indexes", "covered_by_cumulative", "covered_individually"]


def first_and_repeat(cursor, positions, how):
    """An ack, and at once one that repeats it or is covered by it."""
    first, second = positions[0], positions[1]
    if how == "individual":
        return cursor.ack([second]), cursor.ack([second])
    if how == "cumulative":
        return cursor.ack_cumulative(second), cursor.ack_cumulative(second)
    if how == "batch_indexes":
        return (cursor.ack_batch_indexes(second, SOME_INDEXES, 4),
                cursor.ack_batch_indexes(second, SOME_INDEXES, 4))
    if how == "covered_by_cumulative":
        return cursor.ack_cumulative(second), cursor.ack([first])
    return cursor.ack([first, second]), cursor.ack_batch_indexes(first, SOME_INDEXES, 4)


def is_saved(cursor, positions, how) -> bool:
    if how == "batch_indexes":
        return cursor.batch_ack_set(positions[1]) == SOME_INDEXES
    return cursor.is_acked(positions[1])


async def setup(env):
    ml = await ManagedLedger.open(env, TOPIC)
    positions = [await ml.append(b"m%d" % i) for i in range(3)]
    return ml, positions, await ml.open_cursor("s", "earliest")


async def crash_and_reopen(tmp_path, env):
    """What a kill -9 leaves: nothing is flushed on the way out."""
    env.close()
    env = StorageEnvironment(tmp_path / "data")
    ml = await ManagedLedger.open(env, TOPIC)
    return env, await ml.open_cursor("s", "earliest")


@pytest.mark.parametrize("how", HOW)
async def test_a_repeated_ack_is_answered_once_the_save_in_flight_lands(tmp_path, how):
    env = StorageEnvironment(tmp_path / "data")
    gate = None
    try:
        ml, positions, cursor = await setup(env)
        gate = GatedWriter(env)
        first, repeat = first_and_repeat(cursor, positions, how)
        await gate.next_commit()                   # the first ack's save is with the writer, held
        await asyncio.sleep(0.01)
        assert not repeat.done(), "answered while nothing of it is durable"
        gate.let_through()
        await asyncio.wait_for(repeat, 10)
        assert first.done() and first.exception() is None
        gate.open()
        env, cursor = await crash_and_reopen(tmp_path, env)
        assert is_saved(cursor, positions, how)
    finally:
        if gate is not None:
            gate.open()
        env.close()


@pytest.mark.parametrize("how", HOW)
async def test_a_repeated_ack_fails_when_the_save_in_flight_fails(tmp_path, how):
    env = StorageEnvironment(tmp_path / "data")
    gate = None
    try:
        ml, positions, cursor = await setup(env)
        gate = GatedWriter(env)
        first, repeat = first_and_repeat(cursor, positions, how)
        await gate.next_commit()
        gate.let_through(OSError(5, "killed"))     # the save never lands
        for answer in (first, repeat):
            with pytest.raises(StorageError):
                await asyncio.wait_for(answer, 10)
        gate.open()
        env, cursor = await crash_and_reopen(tmp_path, env)
        assert not is_saved(cursor, positions, how)    # as both answers said
    finally:
        if gate is not None:
            gate.open()
        env.close()


async def test_giving_up_on_a_repeated_ack_does_not_cancel_the_save(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    gate = None
    try:
        ml, positions, cursor = await setup(env)
        gate = GatedWriter(env)
        first = cursor.ack([positions[0]])
        repeat = cursor.ack([positions[0]])
        await gate.next_commit()
        repeat.cancel()                            # (a connection closing, a timeout)
        another = cursor.ack([positions[0]])
        gate.let_through()
        await asyncio.wait_for(asyncio.gather(first, another), 10)
        gate.open()
        env, cursor = await crash_and_reopen(tmp_path, env)
        assert cursor.mark_delete == positions[0]
    finally:
        if gate is not None:
            gate.open()
        env.close()


async def test_an_ack_repeating_a_saved_state_is_answered_at_once(env):
    ml, positions, cursor = await setup(env)
    await cursor.ack_cumulative(positions[0])
    await cursor.ack([positions[2]])
    for repeat in (cursor.ack([positions[0]]), cursor.ack([positions[2]]),
                   cursor.ack_cumulative(Position(positions[0].ledger_id, positions[0].entry_id)),
                   cursor.ack_batch_indexes(positions[2], SOME_INDEXES, 4)):
        assert repeat.done() and repeat.exception() is None
    await ml.close()
