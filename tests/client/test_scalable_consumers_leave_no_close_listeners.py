"""Scalable producers and consumers closed leave nothing on the pooled connection they used:
each DAG watch and each stream registration added a close listener to it and never removed
it, so a long-lived connection kept every closed producer and consumer in memory."""

from __future__ import annotations

import pytest

from pyengine.client import Client

T = "topic://public/default/close-listeners"



def listeners(client: Client) -> int:
    return sum(len(connection._close_listeners) for connection in client._core.pool._connections.values())


@pytest.mark.parametrize("kind", ["producer", "queue", "stream", "checkpoint"])
async def test_closed_scalable_clients_leave_no_listener_behind(scalable_client, kind):
    async def made_and_closed(n: int) -> None:
        if kind == "producer":
            made = await scalable_client.create_producer(T)
        elif kind == "queue":
            made = await scalable_client.subscribe_queue(T, "s")
        elif kind == "stream":
            made = await scalable_client.subscribe_stream(T, "s", f"c{n}")
        else:
            made = await scalable_client.subscribe_checkpoint(T, "s", f"c{n}")
        await made.close()

    await made_and_closed(0)
    before = listeners(scalable_client)
    for n in range(1, 6):
        await made_and_closed(n)
    assert listeners(scalable_client) == before
