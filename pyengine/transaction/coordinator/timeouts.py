"""Transaction timeouts of a coordinator service: one heap of deadlines and one asyncio timer
armed for the earliest (Pulsar's TransactionTimeoutTracker), not a task per transaction.

Cancelling a deadline only forgets it (the heap entry is skipped when it comes up), so commit
and abort cost O(1); the heap is rebuilt when skipped entries outnumber live ones.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable

from pyengine.transaction.coordinator.clock import Clock
from pyengine_kernels import TxnId


class TimeoutTracker:
    def __init__(self, clock: Clock, on_expired: Callable[[TxnId], None]) -> None:
        """`on_expired(txn)` runs on the event loop once `txn`'s deadline has passed."""
        self._clock = clock
        self._on_expired = on_expired
        self._deadlines: dict[TxnId, int] = {}
        self._heap: list[tuple[int, TxnId]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for: int | None = None
        self._running = False

    def __len__(self) -> int:
        return len(self._deadlines)

    def deadline(self, txn: TxnId) -> int | None:
        return self._deadlines.get(txn)

    def add(self, txn: TxnId, deadline_ms: int) -> None:
        """Expire `txn` at `deadline_ms` (replacing an earlier deadline of the same txn)."""
        self._deadlines[txn] = deadline_ms
        heapq.heappush(self._heap, (deadline_ms, txn))
        if self._running and (self._armed_for is None or deadline_ms < self._armed_for):
            self._arm()

    def cancel(self, txn: TxnId) -> None:
        if self._deadlines.pop(txn, None) is not None and len(self._heap) > 2 * len(self._deadlines) + 64:
            self._heap = [(deadline, t) for t, deadline in self._deadlines.items()]
            heapq.heapify(self._heap)

    def start(self) -> None:
        """Start firing; deadlines already past fire at once."""
        self._running = True
        self.poll()

    def stop(self) -> None:
        self._running = False
        self._disarm()

    def poll(self) -> int:
        """Expire every txn whose deadline has passed, then re-arm the timer; returns how many
        expired. The timer calls it; a test that moves an injected clock calls it directly."""
        now = self._clock()
        expired = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            deadline, txn = heapq.heappop(heap)
            if self._deadlines.get(txn) == deadline:
                del self._deadlines[txn]
                expired.append(txn)
        if self._running:
            self._arm()
        for txn in expired:
            self._on_expired(txn)
        return len(expired)

    def _arm(self) -> None:
        self._disarm()
        heap = self._heap
        while heap and self._deadlines.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        if not heap:
            return
        self._armed_for = heap[0][0]
        delay = max(0, self._armed_for - self._clock()) / 1000
        self._timer = asyncio.get_running_loop().call_later(delay, self.poll)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._armed_for = None
