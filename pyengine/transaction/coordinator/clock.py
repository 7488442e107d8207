"""The coordinator's clock: wall-clock milliseconds, injectable so tests can move time."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def wall_clock_ms() -> int:
    """Milliseconds since the epoch, as Pulsar stamps transaction start and finish times."""
    return time.time_ns() // 1_000_000
