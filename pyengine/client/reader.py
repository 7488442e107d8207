"""Readers: a non-durable exclusive subscription that starts at a chosen message."""

from __future__ import annotations

import asyncio

from pyengine.client.consumer import Consumer, PartitionConsumer
from pyengine.client.message import Message, MessageId


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
    last = await handler.get_last_message_id()
    if last.entry_id < 0:
        return False                                   # nothing stored on the topic
    last_key = (last.ledger_id, last.entry_id, last.batch_index)
    if handler.last_dequeued is not None:
        read = handler.last_dequeued
        if (read.ledger_id, read.entry_id) != (last.ledger_id, last.entry_id):
            return (read.ledger_id, read.entry_id) < (last.ledger_id, last.entry_id)
        return read.batch_index < last.batch_index
    start = handler.start
    if start is None or start == MessageId.earliest:
        return True
    if start == MessageId.latest:
        return False
    start_key = (start.ledger_id, start.entry_id, start.batch_index)
    return last_key >= start_key if handler.start_inclusive else last_key > start_key
