"""An operation that, once started, runs to its end whoever waits for it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


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
