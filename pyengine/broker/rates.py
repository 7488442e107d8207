"""Message and byte counters with their rates, as Pulsar's topic stats report them.

Pulsar computes the rates of its stats (msgRateIn, msgThroughputIn, msgRateOut,
msgThroughputOut) once every `statsUpdateFrequencyInSecs` (60 s by default) over the interval
since the previous computation, and the admin API shows the last values: a counter here is
sampled the same way (`BrokerService` runs `Topic.update_rates` every
`stats_update_interval_s`), so a rate is 0 until the first interval has passed.
"""

from __future__ import annotations

import time


class RateCounter:
    """Messages and bytes counted since creation, and their rates per second over the last
    stats interval."""

    __slots__ = ("msgs", "bytes", "msg_rate", "byte_rate", "_sampled_at", "_sampled_msgs", "_sampled_bytes")

    def __init__(self, now: float | None = None) -> None:
        self.msgs = 0
        self.bytes = 0
        self.msg_rate = 0.0
        self.byte_rate = 0.0
        self._sampled_at = time.monotonic() if now is None else now
        self._sampled_msgs = 0
        self._sampled_bytes = 0

    def add(self, msgs: int, nbytes: int) -> None:
        self.msgs += msgs
        self.bytes += nbytes

    def update(self, now: float) -> None:
        """The rates over the time since the previous update (or creation)."""
        elapsed = now - self._sampled_at
        if elapsed <= 0:
            return
        self.msg_rate = (self.msgs - self._sampled_msgs) / elapsed
        self.byte_rate = (self.bytes - self._sampled_bytes) / elapsed
        self._sampled_at, self._sampled_msgs, self._sampled_bytes = now, self.msgs, self.bytes
