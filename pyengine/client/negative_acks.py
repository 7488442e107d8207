"""Negative acknowledgements: each message asked for again is redelivered once its delay has
passed, several at a time, through REDELIVER_UNACKNOWLEDGED_MESSAGES with their ids."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from pyengine.client.message import MessageId

Redeliver = Callable[[object, list[MessageId]], None]


class NegativeAckTracker:
    def __init__(self, delay_ms: int, redeliver: Redeliver) -> None:
        self._delay = delay_ms / 1000
        self._redeliver = redeliver
        self._due: dict[tuple[object, int, int], tuple[float, MessageId]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def add(self, owner: object, message_id: MessageId) -> None:
        """Redeliver `message_id` (its whole entry) through `owner` after the delay."""
        key = (owner, message_id.ledger_id, message_id.entry_id)
        if key not in self._due:
            self._due[key] = (time.monotonic() + self._delay, message_id)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = time.monotonic()
        by_owner: dict[object, list[MessageId]] = {}
        for key, (deadline, message_id) in list(self._due.items()):
            if deadline <= now:
                del self._due[key]
                by_owner.setdefault(key[0], []).append(message_id)
        for owner, ids in by_owner.items():
            self._redeliver(owner, ids)
        if self._due:
            next_deadline = min(deadline for deadline, _ in self._due.values())
            self._timer = asyncio.get_running_loop().call_later(max(next_deadline - now, 0.001), self._fire)

    def forget(self, owner: object) -> None:
        for key in [key for key in self._due if key[0] is owner]:
            del self._due[key]

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._due.clear()
