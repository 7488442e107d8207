"""Delayed message delivery, as Pulsar's InMemoryDelayedDeliveryTracker.

A message whose metadata has `deliver_at_time` (ms since the epoch, field 19) in the future is
not dispatched when a Shared or Key_Shared subscription reads it: the dispatcher hands it to
its tracker (time -> position) and reads on. When its time has come the tracker gives the
position back and the dispatcher delivers it as a replay (with the entries put back for
redelivery, oldest first, without counting a redelivery). Exclusive and Failover
subscriptions, and readers, deliver such messages at once, as Pulsar does.

The tracker is memory only, as Pulsar's in-memory one: the message stays unacknowledged in
the cursor (it counts as backlog), so after a restart or a topic reload the cursor reads it
again and it is tracked again if its time has not come, delivered at once if it has.

Timing follows Pulsar's tracker: one timer per tracker, set for the earliest time held, and
at most one timed release per tick (`tickTime` of the delayed delivery policies, Pulsar's
delayedDeliveryTickTimeMillis, 1000 ms by default), so a message may come up to a tick late.
Unlike Pulsar's default (isDelayedDeliveryDeliverAtTimeStrict=false, which lets a message out
up to a tick early, so that a 1 s delay may not delay at all) the cut-off here is strict by
default: a message is never delivered before its deliver_at_time (by the broker's clock).

A dispatcher searches an entry for a deliver_at_time only when it may carry one: entries
stored before the topic was loaded, and every entry once a message with a deliver_at_time was
published on the topic (`Topic.delayed_seen`, noted by the publish path); a topic that never
had a delayed message pays one comparison per entry, not a metadata search.

A deliver_at_time that is not a time (negative, or past the year 9999) or metadata that does
not parse is delivered at once: bad input must not hold a message forever nor stop dispatch.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable

from google.protobuf.message import DecodeError

from pyengine.protocol.pulsar_api_pb2 import MessageMetadata
from pyengine_kernels import Position

DELIVER_AT_TIME_STRICT = True          # Pulsar's isDelayedDeliveryDeliverAtTimeStrict (Pulsar: false)
MAX_DELIVER_AT_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: beyond it, not a time
MAX_TIMER_S = 3600.0                   # a far timer is set again when it fires

_CHECKSUM_MAGIC = b"\x0e\x01"
_DELIVER_AT_TAG = b"\x98\x01"          # field 19, varint: (19 << 3) | 0 = 152, as a varint


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def deliver_at_time(data: bytes) -> int | None:
    """The `deliver_at_time` of a stored message (headers and payload, as the producer sent
    them), or None when it has none or its metadata cannot be read. The metadata is parsed
    only when the field's tag occurs in it, so messages without a delay cost a byte search."""
    try:
        offset = 6 if data[:2] == _CHECKSUM_MAGIC else 0
        start = offset + 4
        if len(data) < start:
            return None
        end = start + int.from_bytes(data[offset:start], "big")
        if end > len(data) or data.find(_DELIVER_AT_TAG, start, end) < 0:
            return None
        metadata = MessageMetadata()
        metadata.ParseFromString(bytes(data[start:end]))
    except (DecodeError, ValueError, TypeError, AttributeError):
        return None
    return metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None


class DelayedDeliveryTracker:
    """Positions held back until their time; `on_due` is called (from the event loop) when
    the earliest may be released, and the dispatcher then takes them with `pop_due`."""

    def __init__(self, on_due: Callable[[], None], *, tick_time_ms: int = 1000,
                 strict: bool = DELIVER_AT_TIME_STRICT, clock: Callable[[], int] = wall_clock_ms) -> None:
        self._on_due = on_due
        self.tick_time_ms = tick_time_ms
        self.strict = strict
        self._clock = clock
        self._heap: list[tuple[int, Position]] = []
        self._held: dict[Position, int] = {}            # position -> deliver at
        self._timer: asyncio.TimerHandle | None = None
        self._timer_target = -1                         # the deliver-at time the timer is set for
        self._last_release = -(1 << 62)                 # when a timed release last let something out
        self._closed = False

    def __len__(self) -> int:
        """Messages held (Pulsar's msgDelayed)."""
        return len(self._held)

    def __contains__(self, position: Position) -> bool:
        return position in self._held

    def _cutoff(self, now: int) -> int:
        return now if self.strict else now + self.tick_time_ms

    def add(self, position: Position, deliver_at: int) -> bool:
        """Hold `position` until `deliver_at` (ms since the epoch). False: deliver it now (its
        time has come, or the value is not a time)."""
        if self._closed or deliver_at < 0 or deliver_at > MAX_DELIVER_AT_MS \
                or deliver_at <= self._cutoff(self._clock()):
            return False
        if self._held.get(position) != deliver_at:
            self._held[position] = deliver_at
            heapq.heappush(self._heap, (deliver_at, position))
        self._update_timer()
        return True

    def pop_due(self) -> list[Position]:
        """The positions whose time has come, taken out of the tracker, in position order."""
        due: list[Position] = []
        heap, held = self._heap, self._held
        if heap:
            cutoff = self._cutoff(self._clock())
            while heap and heap[0][0] <= cutoff:
                at, position = heapq.heappop(heap)
                if held.get(position) == at:
                    del held[position]
                    due.append(position)
        self._update_timer()
        due.sort()
        return due

    def positions_up_to(self, position: Position) -> list[Position]:
        return sorted(p for p in self._held if p <= position)

    def discard(self, positions: list[Position]) -> None:
        """Forget acknowledged positions (their heap items are dropped when they come up)."""
        for position in positions:
            self._held.pop(position, None)
        if not self._held:
            self.clear()

    def clear(self) -> list[Position]:
        """Forget everything held (a seek; the cursor reads the entries again); returns what
        was held, in position order."""
        held = sorted(self._held)
        self._held.clear()
        self._heap.clear()
        self._cancel_timer()
        return held

    def close(self) -> None:
        self._closed = True
        self.clear()

    # --- the timer ------------------------------------------------------------------------

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_target = -1

    def _update_timer(self) -> None:
        heap, held = self._heap, self._held
        while heap and held.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)                        # acknowledged, or held again for another time
        if not heap or self._closed:
            self._cancel_timer()
            return
        target = heap[0][0]
        if target == self._timer_target and self._timer is not None:
            return
        self._cancel_timer()
        now = self._clock()
        if self._last_release > now:
            # The wall clock went back: a release "in the future" would hold the next one back
            # by as much as the clock jumped (up to an hour), not by at most a tick.
            self._last_release = now
        # At the target, and no sooner than a tick after the last timed release.
        delay_ms = max(target - now, self._last_release + self.tick_time_ms - now, 0)
        self._timer_target = target
        self._timer = asyncio.get_running_loop().call_later(min(delay_ms / 1000, MAX_TIMER_S), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_target = -1
        if self._closed:
            return
        if self._heap and self._heap[0][0] <= self._cutoff(self._clock()):
            self._last_release = self._clock()
        self._on_due()
