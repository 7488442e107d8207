"""A cursor reset (seek / reset-cursor / a subscription created at a message id) that moves the
slowest durable cursor past whole ledgers lets retention trim them in the background, as any
other move of the mark-delete position does (Pulsar's resetCursor goes through the
mark-delete path, which trims consumed ledgers once the slowest cursor moves on)."""

import asyncio

from pyengine.storage import ManagedLedger, ManagedLedgerConfig

TOPIC = "persistent://public/default/reset-trims"


async def settled(ml: ManagedLedger) -> None:
    for _ in range(100):
        await asyncio.sleep(0)
        if ml._trimming is None:
            return
        await asyncio.wait([ml._trimming])


async def test_a_reset_forward_past_consumed_ledgers_trims_them(env):
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=3, retention_ms=0))
    cursor = await ml.open_cursor("sub", "earliest")
    positions = [await ml.append(b"x") for _ in range(7)]
    await settled(ml)
    assert ml.first_position() == positions[0]      # nothing consumed yet
    await asyncio.sleep(0.002)                       # retention 0: closed longer ago than 0 ms
    await cursor.seek(positions[6])                  # read positions[6] next: two ledgers passed
    await settled(ml)
    assert ml.first_position() == positions[6]
    await ml.close()

