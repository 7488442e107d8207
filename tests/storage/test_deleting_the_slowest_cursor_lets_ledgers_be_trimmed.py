"""Deleting a subscription's cursor that held consumed ledgers back lets retention trim them at
once, as Pulsar trims after a cursor is deleted (not at the next periodic check)."""

import asyncio

from pyengine.storage import ManagedLedger, ManagedLedgerConfig

TOPIC = "persistent://public/default/delete-trims"


async def settled(ml: ManagedLedger) -> None:
    for _ in range(100):
        await asyncio.sleep(0)
        if ml._trimming is None:
            return
        await asyncio.wait([ml._trimming])


async def test_deleting_the_slowest_cursor_trims_what_only_it_held(env):
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=3, retention_ms=0))
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
