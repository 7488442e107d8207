"""Readers: a non-durable exclusive subscription that starts at a chosen message."""

from __future__ import annotations

import asyncio

from pyengine.client.consumer import Consumer, PartitionConsumer
from pyengine.client.message import Message, MessageId
from pyengine_kernels import Position


class Reader(Consumer):
    """Reads a topic from `start_message_id` on; it keeps no position on the broker, and after
    a reconnect it resumes after the last message it handed out."""

    async def read_next(self, timeout: float | None = None) -> Message:
        return await self.receive(timeout)

    async def has_message_available(self) -> bool:
        """Whether a message after the last one read is stored (and so will be read)."""
        self._check_open()
        if any(generation == handler.generation for handler, generation, _ in self._queue):
            return True
        results = await asyncio.gather(*(_has_more(h) for h in self._handlers.values()))
        return any(results)


async def _has_more(handler: PartitionConsumer) -> bool:
    if handler.last_dequeued is None and (handler.sought_by_timestamp or handler.start == MessageId.latest):
        return await _has_more_from_position(handler)
    return has_more(await handler.get_last_message_id(), handler.last_dequeued, handler.start, handler.start_inclusive)


async def _has_more_from_position(handler: PartitionConsumer) -> bool:
    """Nothing read yet and the start names no message (the latest, or a seek by time): as
    the C++ client, whether the subscription's mark-delete position is before the topic's last
    message. A start-inclusive reader at the latest moves to the last message first, so that
    it reads it next; the broker ignores start-inclusive on a seek by time."""
    last, mark_delete = await handler.get_last_message_id_and_position()
    if last.entry_id < 0:
        return False                                   # nothing stored on the topic
    inclusive = handler.start_inclusive and not handler.sought_by_timestamp
    if inclusive:
        await handler.seek(last)
    return mark_delete is not None and position_before_last(mark_delete, last, inclusive)


def position_before_last(mark_delete: MessageId | Position, last: MessageId, inclusive: bool = False) -> bool:
    """Whether a subscription at `mark_delete` has `last` (the topic's last message) still to
    read; `inclusive`: also when it stands at it (the network and the embedded readers')."""
    position, last_position = (mark_delete.ledger_id, mark_delete.entry_id), (last.ledger_id, last.entry_id)
    return position <= last_position if inclusive else position < last_position


def has_more(last: MessageId, last_read: MessageId | None, start: MessageId | None, start_inclusive: bool) -> bool:
    """Whether a reader that read up to `last_read` (None: nothing yet), from `start`, has more to
    read before `last`, the topic's last message id (the network and the embedded readers')."""
    if last.entry_id < 0:
        return False                                   # nothing stored on the topic
    last_key = (last.ledger_id, last.entry_id, last.batch_index)
    if last_read is not None:
        if (last_read.ledger_id, last_read.entry_id) != (last.ledger_id, last.entry_id):
            return (last_read.ledger_id, last_read.entry_id) < (last.ledger_id, last.entry_id)
        return last_read.batch_index < last.batch_index
    if start is None or start == MessageId.earliest:
        return True
    if start == MessageId.latest:
        return False
    start_key = (start.ledger_id, start.entry_id, start.batch_index)
    return last_key >= start_key if start_inclusive else last_key > start_key
