"""A receive() waiting on a QueueConsumer or a StreamConsumer of a scalable topic ends when the
consumer is closed, with AlreadyClosedError, as a Consumer's does (and one called after the
close raises it at once). Found by an audit: they waited on the consumer's queue for ever."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client.errors import AlreadyClosedError

T = "topic://public/default/closing-receives"



@pytest.mark.parametrize("kind", ["queue", "stream", "checkpoint"])
async def test_close_ends_a_waiting_receive(scalable_client, kind):
    if kind == "queue":
        consumer = await scalable_client.subscribe_queue(T, "s")
    elif kind == "stream":
        consumer = await scalable_client.subscribe_stream(T, "s", "c1")
    else:
        consumer = await scalable_client.subscribe_checkpoint(T, "s", "c1")
    waiting = asyncio.ensure_future(consumer.receive())
    await asyncio.sleep(0)                            # it waits on the empty queue
    assert not waiting.done()
    await consumer.close()
    done, _ = await asyncio.wait([waiting], timeout=1)
    assert done, "receive() still waiting after close()"
    with pytest.raises(AlreadyClosedError):
        waiting.result()
    with pytest.raises(AlreadyClosedError):
        await asyncio.wait_for(consumer.receive(), 1)
