"""Small asyncio patterns the packages share."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


def single_flight(running: dict[Hashable, asyncio.Future[T]], key: Hashable,
                  start: Callable[[], Awaitable[T]]) -> Awaitable[T]:
    """One run of `start()` per `key` at a time (kept in `running` while it runs): callers
    that come while it runs share its outcome instead of starting another. A caller cancelled
    while waiting does not cancel the run: the others still wait for it."""
    run = running.get(key)
    if run is None:
        run = asyncio.ensure_future(start())
        running[key] = run
        run.add_done_callback(lambda done: running.pop(key) if running.get(key) is done else None)
    return asyncio.shield(run)
