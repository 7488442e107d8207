"""Exponential back-off with jitter, as Pulsar's clients reconnect: 100 ms doubling to a cap; and
periodic steps that outlive their failures."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Backoff:
    def __init__(self, initial: float = 0.1, maximum: float = 30.0) -> None:
        self._initial = initial
        self._maximum = maximum
        self._next = initial

    def next(self) -> float:
        """The delay before the next attempt (seconds); each call doubles the following one."""
        delay = self._next
        self._next = min(self._next * 2, self._maximum)
        # Up to 10% less, so handlers that failed together do not retry in lock step.
        return delay * (1 - random.random() * 0.1)

    def reset(self) -> None:
        self._next = self._initial


async def every(interval: float, step: Callable[[], Awaitable[object]], done: Callable[[], bool],
                what: str) -> None:
    """`step()` every `interval` seconds until `done()`; a failure is logged (`what` failed) and
    tried again at the next interval, as Pulsar's clients do their periodic updates."""
    while not done():
        await asyncio.sleep(interval)
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s failed: %s", what, exc)
