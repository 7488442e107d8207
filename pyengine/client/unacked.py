"""Ack timeout: messages handed to the application and not acknowledged within the timeout are
asked for again, as Pulsar's UnAckedMessageTracker does.

Like the C++ and Java trackers, time is cut into ticks (`tick_duration_ms`, at most the
timeout): a message is put into the newest slot when the application receives it, and each
tick takes out the oldest slot, so a message comes again between `timeout` and `timeout + tick`
after it was received. What times out goes to the consumer's `redeliver(owner, ids)`, which
for Shared / Key_Shared subscriptions sends REDELIVER_UNACKNOWLEDGED_MESSAGES with their ids
and for Exclusive / Failover redelivers everything unacknowledged (as the clients do).

A message of a batch is tracked by itself; when one times out, its entry is redelivered (the
broker leaves the acknowledged indexes out) and the entry's other tracked messages with it.
A chunked message is tracked by its ChunkMessageId, and its timeout redelivers every chunk;
chunks the consumer dropped without acknowledging them are tracked each by itself.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable

from pyengine.client.message import MessageId

Redeliver = Callable[[object, list[MessageId]], None]
_Key = tuple[object, int, int, int]          # (owner, ledger, entry, batch index)


class UnackedMessageTracker:
    def __init__(self, timeout_ms: int, tick_ms: int, redeliver: Redeliver) -> None:
        self.timeout_ms = timeout_ms
        self.tick_ms = min(tick_ms, timeout_ms)
        self._redeliver = redeliver
        slots = math.ceil(timeout_ms / self.tick_ms) + 1
        self._slots: deque[set[_Key]] = deque(set() for _ in range(slots))
        self._slot_of: dict[_Key, set[_Key]] = {}
        self._ids: dict[_Key, MessageId] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._ids)

    @staticmethod
    def _key(owner: object, message_id: MessageId) -> _Key:
        return (owner, message_id.ledger_id, message_id.entry_id, message_id.batch_index)

    def add(self, owner: object, message_id: MessageId) -> None:
        if self._closed:
            return
        key = self._key(owner, message_id)
        if key in self._slot_of:
            return
        slot = self._slots[-1]
        slot.add(key)
        self._slot_of[key] = slot
        self._ids[key] = message_id
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.tick_ms / 1000, self._tick)

    def _drop(self, key: _Key) -> None:
        slot = self._slot_of.pop(key, None)
        if slot is not None:
            slot.discard(key)
        self._ids.pop(key, None)

    def remove(self, owner: object, message_id: MessageId) -> None:
        self._drop(self._key(owner, message_id))

    def remove_until(self, owner: object, message_id: MessageId) -> None:
        """A cumulative acknowledgement: every message of `owner` up to `message_id`."""
        limit = (message_id.ledger_id, message_id.entry_id, message_id.batch_index)
        for key in [k for k in self._ids if k[0] is owner and k[1:] <= limit]:
            self._drop(key)

    def forget(self, owner: object) -> None:
        """Everything of `owner` is redelivered anyway (redeliver-all, reconnect, seek)."""
        for key in [k for k in self._ids if k[0] is owner]:
            self._drop(key)

    def _tick(self) -> None:
        self._timer = None
        if self._closed:
            return
        expired = self._slots.popleft()
        self._slots.append(set())
        by_owner: dict[object, dict[tuple[int, int], MessageId]] = {}
        for key in expired:
            self._slot_of.pop(key, None)
            message_id = self._ids.pop(key)
            owner, ledger, entry = key[0], key[1], key[2]
            by_owner.setdefault(owner, {}).setdefault((ledger, entry), message_id)
        for owner, entries in by_owner.items():
            # The whole entry comes again: its other messages still tracked come with it.
            for key in [k for k in self._ids if k[0] is owner and (k[1], k[2]) in entries]:
                self._drop(key)
            # A batch message stands for its entry; any other id goes as it is, so that a
            # chunked message's id brings every one of its chunks again (as the C++ tracker).
            self._redeliver(owner, [MessageId(ledger, entry, -1, message_id.partition)
                                    if message_id.batch_index >= 0 else message_id
                                    for (ledger, entry), message_id in entries.items()])
        if self._ids and not self._closed and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.tick_ms / 1000, self._tick)

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._slot_of.clear()
        self._ids.clear()
        for slot in self._slots:
            slot.clear()
