"""Waiting in tests for what real timers, disk writes and watches bring about, instead of
sleeping a fixed time that a slow machine outlasts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(predicate: Callable[[], bool], timeout_s: float = 10, interval_s: float = 0.005) -> None:
    """Wait until `predicate()` holds; fail the test after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"not true after {timeout_s} s: {predicate}"
        await asyncio.sleep(interval_s)
