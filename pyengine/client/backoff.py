"""Exponential back-off with jitter, as Pulsar's clients reconnect: 100 ms doubling to a cap."""

from __future__ import annotations

import random


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
