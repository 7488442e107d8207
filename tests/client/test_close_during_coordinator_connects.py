"""Client.close() while the transaction coordinators are being connected, some of them
connected already: those are closed with the others. Found by an audit: close() cancelled the
discovery, and the coordinator handlers that had connected were known to no one, so nothing
closed them; the pool's closing of their connection made them start reconnecting after the
client was closed."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client
from pyengine.client import coordinator as coordinator_module
from pyengine.client.coordinator import TC_ASSIGN_TOPIC
from pyengine.client.errors import AlreadyClosedError
from pyengine.client.handler import CLOSED


async def test_coordinators_connected_before_the_close_are_closed(broker, monkeypatch):
    client = Client(broker.url, operation_timeout_seconds=30)
    made: list = []
    handler_class = coordinator_module.CoordinatorHandler

    class Recorded(handler_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)
    monkeypatch.setattr(coordinator_module, "CoordinatorHandler", Recorded)
    held = asyncio.Event()
    never = asyncio.Event()
    lookup = client._core.lookup.lookup

    async def held_lookup(topic):
        if topic == f"{TC_ASSIGN_TOPIC}-partition-3":
            held.set()
            await never.wait()               # coordinator 3 is never found before the close
        return await lookup(topic)
    monkeypatch.setattr(client._core.lookup, "lookup", held_lookup)
    waiting = asyncio.ensure_future(client.new_transaction())
    await held.wait()
    while sum(h.connection is not None for h in made) < 3:     # coordinators 0..2 are connected
        await asyncio.sleep(0.01)
    await client.close()
    with pytest.raises(AlreadyClosedError):
        await waiting
    assert len(made) == 4
    assert [h.state for h in made] == [CLOSED] * 4
    assert all(h._reconnect_task is None or h._reconnect_task.done() for h in made)
