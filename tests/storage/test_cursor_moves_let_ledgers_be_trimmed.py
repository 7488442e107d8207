"""Retention trims consumed ledgers when the slowest durable cursor moves past them, by any
means - not only acks: a cursor reset forward (seek / reset-cursor / a subscription created at
a message id; Pulsar's resetCursor goes through the mark-delete path), or the deletion of the
slowest cursor (Pulsar trims after deleting one). Neither waits for the periodic check."""

import asyncio

from pyengine.storage import ManagedLedger, ManagedLedgerConfig
from tests.storage.helpers import settled

TOPIC = "persistent://public/default/trims"


async def small_ledgers(env) -> ManagedLedger:
    """Ledgers of 3 entries, retention 0: a consumed closed ledger goes at once."""
    return await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=3, retention_ms=0))


async def test_a_reset_forward_past_consumed_ledgers_trims_them(env):
    ml = await small_ledgers(env)
    cursor = await ml.open_cursor("sub", "earliest")
    positions = [await ml.append(b"x") for _ in range(7)]
    await settled(ml)
    assert ml.first_position() == positions[0]      # nothing consumed yet
    await asyncio.sleep(0.002)                       # retention 0: closed longer ago than 0 ms
    await cursor.seek(positions[6])                  # read positions[6] next: two ledgers passed
    await settled(ml)
    assert ml.first_position() == positions[6]
    await ml.close()



async def test_deleting_the_slowest_cursor_trims_what_only_it_held(env):
    ml = await small_ledgers(env)
    fast = await ml.open_cursor("fast", "earliest")
    await ml.open_cursor("slow", "earliest")
    positions = [await ml.append(b"x") for _ in range(7)]
    await asyncio.sleep(0.002)                       # retention 0: closed longer ago than 0 ms
    await fast.ack_cumulative(positions[5])
    await settled(ml)
    assert ml.first_position() == positions[0]      # "slow" holds them
    await ml.delete_cursor("slow")
    await settled(ml)
    assert ml.first_position() == positions[6]
    await ml.close()
