"""Cursor behaviours no other test pinned down (found by mutation testing): each test fails
with one small change of pyengine/storage/cursor.py that the rest of the suite let through."""

import asyncio

from pyengine.storage import ManagedLedger, ManagedLedgerConfig
from pyengine_kernels import Position

TOPIC = "persistent://public/default/gaps"
CONFIG = ManagedLedgerConfig(max_entries_per_ledger=4)


async def filled(env, n):
    ml = await ManagedLedger.open(env, TOPIC, CONFIG)
    positions = await asyncio.gather(*(ml.append(b"x") for _ in range(n)))
    return ml, positions


async def reopened(reopen, env, name="s", initial_position="earliest"):
    env2 = reopen(env)
    ml2 = await ManagedLedger.open(env2, TOPIC, CONFIG)
    return ml2, await ml2.open_cursor(name, initial_position)


async def test_a_cumulative_ack_over_individual_acks_forgets_them(env):
    """Entries acked individually and then covered by a cumulative ack are no longer counted
    as individually deleted: the backlog counts each entry once."""
    ml, p = await filled(env, 10)                   # ledgers of 4: p[0..3], p[4..7], p[8..9]
    c = await ml.open_cursor("s", "earliest")
    await c.ack([p[1], p[5], p[8]])
    await c.ack_cumulative(p[6])                    # covers p[1] and p[5]; p[7] is not acked
    assert c.mark_delete == p[6]
    assert c.backlog() == 2                         # p[7], p[9]
    assert c.individually_deleted_ranges() == [(Position(p[8].ledger_id, -1), p[8])]
    await c.ack_cumulative(p[7])
    assert c.mark_delete == p[8] and c.backlog() == 1


async def test_a_cumulative_ack_of_an_individually_acked_entry_counts_it_once(env):
    """The mark-delete entry itself is dropped from the individual acks (it is covered)."""
    ml, p = await filled(env, 10)
    c = await ml.open_cursor("s", "earliest")
    await c.ack([p[4]])                             # the first entry of the second ledger
    await c.ack_cumulative(p[4])
    assert c.mark_delete == p[4] and c.backlog() == 5
    assert c.individually_deleted_ranges() == []


async def test_a_cumulative_ack_moves_the_read_position_past_the_mark_delete(env):
    """A cumulative ack at the read position moves the read position past it: the next read
    is the first unacknowledged entry, not the one just acknowledged."""
    ml, p = await filled(env, 6)
    c = await ml.open_cursor("s", "earliest")
    c.read_position = p[3]                          # p[0..2] were read (the dispatcher moves it)
    await c.ack_cumulative(p[3])
    assert c.read_position == p[4]
    await c.ack_cumulative(p[5])                    # past the read position
    assert c.read_position == ml.next_position(p[5])


async def test_a_whole_entry_ack_drops_its_batch_ack_set(env, reopen):
    """A partly acked batch acknowledged as a whole keeps no ack set, in memory or saved, also
    while the mark-delete position stays before it."""
    ml, p = await filled(env, 6)
    c = await ml.open_cursor("s", "earliest")
    await c.ack_batch_indexes(p[2], [0b1100], 4)    # indexes 0, 1 acked
    assert c.batch_ack_set(p[2]) == [0b1100]
    await c.ack([p[2]])
    assert c.is_acked(p[2]) and c.mark_delete < p[2]
    assert c.batch_ack_set(p[2]) is None
    assert list(c.record().batch_acks) == []
    await ml.close()
    _, c2 = await reopened(reopen, env)
    assert c2.batch_ack_set(p[2]) is None and c2.is_acked(p[2])


async def test_a_cumulative_ack_to_a_partly_acked_batch_drops_its_ack_set(env):
    """The ack set of the batch at the new mark-delete position itself goes too."""
    ml, p = await filled(env, 6)
    c = await ml.open_cursor("s", "earliest")
    await c.ack_batch_indexes(p[2], [0b1100], 4)
    await c.ack_batch_indexes(p[4], [0b0110], 4)
    await c.ack_cumulative(p[2])
    assert c.batch_ack_set(p[2]) is None
    assert c.batch_ack_set(p[4]) == [0b0110]        # after it: kept
    assert [(b.position.entry_id, list(b.ack_set)) for b in c.record().batch_acks] == [(p[4].entry_id, [0b0110])]


async def test_a_seek_forgets_partly_acked_batches(env, reopen):
    """A seek (Pulsar's resetCursor) makes everything from its position unacknowledged: the
    indexes acked of a batch after it are delivered again too, not filtered out by an ack
    set left over."""
    ml, p = await filled(env, 6)
    c = await ml.open_cursor("s", "earliest")
    await c.ack_batch_indexes(p[3], [0b1100], 4)
    await c.seek(p[1])
    assert c.batch_ack_set(p[3]) is None
    assert list(c.record().batch_acks) == []
    await ml.close()
    _, c2 = await reopened(reopen, env)
    assert c2.batch_ack_set(p[3]) is None and c2.mark_delete == p[0]


async def test_a_seek_with_a_fully_acked_set_leaves_no_ack_set(env):
    """A seek whose ack set acknowledges every index keeps none (an all-acked batch would be
    delivered with nothing in it, and never acknowledged)."""
    ml, p = await filled(env, 6)
    c = await ml.open_cursor("s", "earliest")
    await c.seek(p[2], [0])
    assert c.batch_ack_set(p[2]) is None
    await c.seek(p[2], [0b0110])
    assert c.batch_ack_set(p[2]) == [0b0110]


async def test_a_new_cursor_is_durable_once_opened(env, reopen):
    """Opening a cursor saves it: after a crash (no close, nothing acked) it is found where
    it was created, and the entries published since are its backlog, not skipped by a
    'latest' cursor created again."""
    ml, p = await filled(env, 3)
    c = await ml.open_cursor("s", "latest")
    assert c.mark_delete == p[2]
    later = [await ml.append(b"y") for _ in range(2)]
    _, c2 = await reopened(reopen, env, initial_position="latest")   # env closed, the ledger was not
    assert c2.mark_delete == p[2]
    assert c2.backlog() == 2 and c2.read_position == later[0]


async def test_the_largest_entry_id_a_bitmap_holds_can_be_acked(env):
    """The entry id range check bounds ids to what a roaring bitmap holds, 2**32 - 1
    included (in a ledger before the LAC's: an ack after the LAC is refused)."""
    ml, p = await filled(env, 5)
    c = await ml.open_cursor("s", "earliest")
    largest = Position(p[0].ledger_id, (1 << 32) - 1)
    assert largest < ml.lac
    await c.ack([largest])
    assert c.is_acked(largest) and not c.is_acked(p[1])
