"""Operations waiting for a disconnected consumer to reconnect end as soon as its reconnection
fails for good, with that failure (as they end with AlreadyClosedError when it is closed).
Found by an audit: they waited out the operation timeout and raised a bare TimeoutError('')."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client, MessageId
from pyengine.errors import TopicNotFoundError

T = "persistent://public/default/waiting-operations-failed"


async def test_a_failed_reconnection_ends_the_operations_waiting_for_it(broker):
    async with Client(broker.url, operation_timeout_seconds=30) as client:
        consumer = await client.subscribe(T, "s")
        handler = consumer._handlers[-1]
        await broker.stop()

        async def topic_gone() -> None:
            raise TopicNotFoundError(f"{T} was deleted")
        handler._connect_once = topic_gone          # its next attempt fails for good
        waiting = [asyncio.ensure_future(op) for op in (consumer.get_last_message_id(),
                                                         consumer.seek(MessageId.earliest))]
        for op in waiting:
            with pytest.raises(TopicNotFoundError):
                await asyncio.wait_for(op, 5)       # at once, not after the 30 s timeout
        await consumer.close()
