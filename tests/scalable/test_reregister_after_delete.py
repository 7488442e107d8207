"""A Stream consumer whose connection drops and whose topic is deleted before it registers
again ends with TopicNotFoundError (receive() raises it), as it does when the deletion is
pushed to it. Found by an audit: it retried the registration forever, backing off, and
receive() waited for good."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.client import Client
from pyengine.errors import TopicNotFoundError
from pyengine.protocol.server import ProtocolServer

T = "topic://public/default/orders"


async def test_a_topic_deleted_while_disconnected_ends_the_consumer(tmp_path):
    service = BrokerService(BrokerConfig(data_dir=tmp_path / "data", sync=False, num_coordinators=1))
    await service.start()
    server = ProtocolServer(service, "127.0.0.1", 0)
    await server.start()
    service.service_url = f"pulsar://127.0.0.1:{server.port}"
    try:
        async with Client(service.service_url, operation_timeout_seconds=5) as client:
            # room to delete the topic before the consumer registers again
            client._core.config = dataclasses.replace(client._core.config, initial_backoff=0.3)
            scalable = await service.scalable_topics()
            await scalable.create_topic(T, 2)
            stream = await client.subscribe_stream(T, "s", "c1")
            assert stream.assigned == [0, 1]
            for connection in list(server.connections):
                connection.transport.close()               # the client's connections drop
            await scalable.delete_topic(T)
            with pytest.raises(TopicNotFoundError):
                await asyncio.wait_for(stream.receive(), 10)
            await stream.close()
    finally:
        await server.stop()
        await service.close()
