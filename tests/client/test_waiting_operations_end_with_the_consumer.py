"""Operations waiting for a disconnected consumer to reconnect (get_last_message_id, seek,
unsubscribe, transactional acks) end as soon as the consumer is closed, with
AlreadyClosedError. Found by an audit: they waited out the operation timeout and then raised
a bare TimeoutError('')."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client, MessageId
from pyengine.client.errors import AlreadyClosedError

T = "persistent://public/default/waiting-operations"


async def test_close_ends_the_operations_waiting_for_a_connection(broker):
    async with Client(broker.url, operation_timeout_seconds=30) as client:
        consumer = await client.subscribe(T, "s")
        await broker.stop()
        waiting = [asyncio.ensure_future(op) for op in (consumer.get_last_message_id(),
                                                         consumer.seek(MessageId.earliest),
                                                         consumer.unsubscribe())]
        await asyncio.sleep(0.2)
        assert not any(op.done() for op in waiting)
        await consumer.close()
        for op in waiting:
            with pytest.raises(AlreadyClosedError):
                await asyncio.wait_for(op, 2)


async def test_a_consumer_that_stays_disconnected_says_so(broker):
    async with Client(broker.url, operation_timeout_seconds=0.5) as client:
        consumer = await client.subscribe(T, "s")
        await broker.stop()
        with pytest.raises(TimeoutError, match="not connected to the broker within the operation timeout"):
            await consumer.get_last_message_id()
        await consumer.close()
