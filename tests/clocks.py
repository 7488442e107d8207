"""A wall clock that tests can hold still, for timeouts and due times counted by the broker's
clock (`BrokerConfig.clock`)."""

from __future__ import annotations

from pyengine.transaction.coordinator.clock import wall_clock_ms


class PausedWallClock:
    """Wall-clock milliseconds that stand still from creation until `resume()`, then go on from
    where they stood. A deadline or due time set during a test's set-up then counts only time
    after it, however slow the machine's fsyncs are (fixed budgets of 500-700 ms ran out in
    the middle of set-ups under CI)."""

    def __init__(self) -> None:
        self._paused_at: int | None = wall_clock_ms()
        self._behind = 0

    def __call__(self) -> int:
        return self._paused_at if self._paused_at is not None else wall_clock_ms() - self._behind

    def resume(self) -> None:
        if self._paused_at is not None:
            self._behind = wall_clock_ms() - self._paused_at
            self._paused_at = None
