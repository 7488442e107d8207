"""Trims delete what every durable cursor has consumed as saved, never by a mark-delete position
held in memory only. An ack (a seek) moves the cursor in memory at once and is saved with the
next group commit; while that save is in flight, or after it failed (the client was told the ack
failed), a restart finds the cursor where its last saved state left it, needing the entries
after it. As in Pulsar (ManagedCursorImpl tells its ledger the new position in the completion
of the save), the slowest cursor's position moves on, and a trim follows, once the save is done.
"""

import asyncio

import pytest

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment, StorageError
from pyengine_kernels import Position
from tests.broker.helpers import GatedWriter
from tests.storage.helpers import fail_next_save, settled

TOPIC = "persistent://public/default/trims"
# Ledgers of 3 entries, retention 0: a consumed closed ledger goes at once.
CONFIG = ManagedLedgerConfig(max_entries_per_ledger=3, retention_ms=0)


async def consumed_ledgers(env):
    """A cursor at the start of 7 entries in 3 ledgers, the first two closed long enough ago."""
    ml = await ManagedLedger.open(env, TOPIC, CONFIG)
    cursor = await ml.open_cursor("sub", "earliest")
    positions = [await ml.append(b"m%d" % i) for i in range(7)]
    await settled(ml)
    await asyncio.sleep(0.002)                 # retention 0: closed longer ago than 0 ms
    return ml, cursor, positions


def move_past_two_ledgers(cursor, positions, how):
    if how == "cumulative":
        return cursor.ack_cumulative(positions[5])
    if how == "individual":
        return cursor.ack(positions[:6])
    return cursor.seek(positions[6])


async def crash_and_reopen(tmp_path, env):
    """What a kill -9 leaves: nothing is flushed on the way out."""
    env.close()
    env = StorageEnvironment(tmp_path / "data")
    ml = await ManagedLedger.open(env, TOPIC, CONFIG)
    return env, ml, await ml.open_cursor("sub", "earliest")


def assert_nothing_unconsumed_is_gone(ml, cursor, positions):
    gone = [p for p in positions if not cursor.is_acked(p) and ml.read_entry(p) is None]
    assert gone == [], f"deleted, yet not acknowledged by the saved cursor ({cursor.mark_delete})"


@pytest.mark.parametrize("how", ["cumulative", "individual", "seek"])
async def test_a_failed_cursor_save_lets_nothing_be_trimmed(tmp_path, how):
    env = StorageEnvironment(tmp_path / "data")
    try:
        ml, cursor, positions = await consumed_ledgers(env)
        fail_next_save(env, "cursor")
        with pytest.raises(StorageError, match="injected"):
            await move_past_two_ledgers(cursor, positions, how)
        await settled(ml)
        await ml.trim()                            # nor does a trim asked for meanwhile
        assert ml.first_position() == positions[0]
        env, ml, cursor = await crash_and_reopen(tmp_path, env)
        assert cursor.mark_delete == Position(positions[0].ledger_id, -1)
        assert_nothing_unconsumed_is_gone(ml, cursor, positions)
    finally:
        env.close()


@pytest.mark.parametrize("how", ["cumulative", "individual", "seek"])
async def test_a_cursor_save_in_flight_lets_nothing_be_trimmed(tmp_path, how):
    env = StorageEnvironment(tmp_path / "data")
    gate = None
    try:
        ml, cursor, positions = await consumed_ledgers(env)
        gate = GatedWriter(env)
        moved = move_past_two_ledgers(cursor, positions, how)
        await gate.next_commit()                   # the cursor's save is with the writer, held
        trim = asyncio.ensure_future(ml.trim())    # (a ledger roll, another cursor's ack)
        await asyncio.sleep(0.01)
        gate.let_through(OSError(5, "killed"))     # the save never lands
        with pytest.raises(StorageError):
            await moved
        gate.open()
        assert await trim == []
        await settled(ml)
        assert ml.first_position() == positions[0]
        env, ml, cursor = await crash_and_reopen(tmp_path, env)
        assert_nothing_unconsumed_is_gone(ml, cursor, positions)
    finally:
        if gate is not None:
            gate.open()
        env.close()


@pytest.mark.parametrize("how", ["cumulative", "individual", "seek"])
async def test_the_save_that_succeeds_trims_what_the_cursor_consumed(tmp_path, how):
    """The trim follows the save, without waiting for another reason to trim (a roll, the
    periodic check): here the client's retry of an ack whose first save failed."""
    env = StorageEnvironment(tmp_path / "data")
    try:
        ml, cursor, positions = await consumed_ledgers(env)
        fail_next_save(env, "cursor")
        with pytest.raises(StorageError, match="injected"):
            await move_past_two_ledgers(cursor, positions, how)
        await settled(ml)
        assert ml.first_position() == positions[0]
        await move_past_two_ledgers(cursor, positions, how)        # the retry: saved
        await settled(ml)
        assert ml.first_position() == positions[6]
        env, ml, cursor = await crash_and_reopen(tmp_path, env)
        assert ml.first_position() == positions[6]
        assert cursor.mark_delete == positions[5]
    finally:
        env.close()


async def test_a_cursor_moved_back_keeps_what_it_will_read_again(env):
    """A move back (a seek, a rewind of a compaction cursor) counts at once, before its save is
    done: the entries the cursor will read again are kept, though the saved position is past
    them."""
    ml, cursor, positions = await consumed_ledgers(env)
    await cursor.ack_cumulative(positions[5])      # saved: the trim it asks for is to come
    back = cursor.seek(positions[3])               # back into the second ledger, at once
    await settled(ml)
    assert ml.first_position() == positions[3]     # only the first ledger went
    await back
    await settled(ml)
    assert [e.position for e in ml.read_entries(cursor.read_position, 10)] == positions[3:]
    await ml.close()
