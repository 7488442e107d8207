"""Client.close() while new transactions wait for the transaction coordinators to be found
(or for the v5 coordinator's connection): they fail with AlreadyClosedError, as the Java
client fails what is under way at close. Found by an audit: close() cancelled the discovery
and the waiting new_transaction() calls ended cancelled, though nobody had cancelled them (a
second one waiting raised AttributeError: the first had reset the discovery already)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client
from pyengine.client.coordinator import TC_ASSIGN_TOPIC
from pyengine.client.errors import AlreadyClosedError


@pytest.mark.parametrize("scalable", [False, True], ids=["v4-discovery", "v5-handler"])
async def test_new_transactions_waiting_at_close_fail_as_closed(broker, monkeypatch, scalable):
    client = Client(broker.url, operation_timeout_seconds=30)
    reached = asyncio.Event()
    never = asyncio.Event()
    core = client._core
    if scalable:
        lookup = core.lookup.lookup

        async def held_lookup(topic):
            if topic == TC_ASSIGN_TOPIC:
                reached.set()
                await never.wait()           # the v5 coordinator's lookup hangs until the close
            return await lookup(topic)
        monkeypatch.setattr(core.lookup, "lookup", held_lookup)
    else:
        partitions = core.lookup.partitions

        async def held_partitions(topic):
            if topic == TC_ASSIGN_TOPIC:
                reached.set()
                await never.wait()           # the discovery hangs until the close
            return await partitions(topic)
        monkeypatch.setattr(core.lookup, "partitions", held_partitions)
    waiting = [asyncio.ensure_future(client.new_transaction(scalable=scalable)) for _ in range(2)]
    await reached.wait()
    await client.close()
    await asyncio.wait(waiting, timeout=1)
    for new_transaction in waiting:
        assert new_transaction.done()
        assert not new_transaction.cancelled(), "new_transaction() ended cancelled, though nobody cancelled it"
        with pytest.raises(AlreadyClosedError):
            new_transaction.result()
