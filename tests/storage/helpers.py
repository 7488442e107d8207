"""Helpers of the storage tests."""

import asyncio

from pyengine.storage import ManagedLedger


async def settled(ml: ManagedLedger) -> None:
    """Let a background trim finish."""
    for _ in range(100):
        await asyncio.sleep(0)
        if ml._trimming is None:
            return
        await asyncio.wait([ml._trimming])
