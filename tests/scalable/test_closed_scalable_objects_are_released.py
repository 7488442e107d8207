"""Closing a scalable producer or consumer releases it: the client no longer holds it (a
long-lived client opening and closing them would otherwise keep every one, with its watch)."""

from __future__ import annotations

import pytest

from pyengine.client import Client
from tests.protocol.conftest import server, service  # noqa: F401  (fixtures)

T = "topic://public/default/orders"


@pytest.fixture
async def client(server, service):
    service.service_url = f"pulsar://127.0.0.1:{server.port}"     # as `pyengine serve` sets it
    async with Client(f"pulsar://127.0.0.1:{server.port}", operation_timeout_seconds=10) as client:
        yield client


async def test_closed_scalable_producers_and_consumers_are_not_kept(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    for _ in range(3):
        producer = await client.create_producer(T)
        await producer.send(b"x", key="k")
        queue = await client.subscribe_queue(T, "q")
        stream = await client.subscribe_stream(T, "s", "c1")
        checkpoint = await client.subscribe_checkpoint(T, "cp", "c1")
        for closable in (producer, queue, stream, checkpoint):
            await closable.close()
    assert client._core.open_objects == []
