"""Small asyncio patterns the packages share."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, TypeVar

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


class RunOnce:
    """`operation` (a close) run at most once, as a task of its own: a caller cancelled while it
    runs does not stop it half-way, and every later caller waits for that same run (and gets its
    outcome) instead of finding the object half-done and doing nothing."""

    def __init__(self, operation: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._operation = operation
        self._run: asyncio.Future[None] | None = None

    async def __call__(self) -> None:
        if self._run is None:
            self._run = asyncio.ensure_future(self._operation())
        await asyncio.shield(self._run)
