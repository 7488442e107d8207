"""Client.close() while a producer or consumer is being created (found by an audit): the
creation could come back "ready" on the connection the close had just dropped, never told of
it, its sends never settling; or it retried until the operation timeout. As the Java and C++
clients, a creation under way at close fails at once with AlreadyClosed, and whatever was
created before the close is closed by it."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import AlreadyClosedError, Client


@pytest.mark.parametrize("delay", [0.0, 0.0005, 0.001, 0.002, 0.004])
@pytest.mark.parametrize("kind", ["producer", "consumer"])
async def test_a_creation_under_way_at_close_fails_or_is_closed(broker, kind, delay):
    client = Client(broker.url, operation_timeout_seconds=5)
    await client.create_producer("persistent://public/default/warm-up")        # a connection made
    topic = f"persistent://public/default/close-while-creating-{kind}-{delay}"
    creating = asyncio.ensure_future(client.create_producer(topic, send_timeout_ms=0) if kind == "producer"
                                     else client.subscribe(topic, "s"))
    await asyncio.sleep(delay)
    await client.close()
    started = asyncio.get_running_loop().time()
    try:
        created = await asyncio.wait_for(creating, 10)
    except AlreadyClosedError:
        assert asyncio.get_running_loop().time() - started < 2       # at once, not at the timeout
        return
    # made before the close: the close closed it
    with pytest.raises(AlreadyClosedError):
        if kind == "producer":
            await created.send(b"x")
        else:
            await created.receive(1)
