"""An in-process broker with its protocol server on 127.0.0.1 and a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import WireClient

NUM_COORDINATORS = 4


@pytest.fixture
async def service(tmp_path) -> AsyncIterator[BrokerService]:
    service = BrokerService(BrokerConfig(data_dir=tmp_path, sync=False, num_coordinators=NUM_COORDINATORS))
    await service.start()
    yield service
    await service.close()


@pytest.fixture
async def server(service: BrokerService) -> AsyncIterator[ProtocolServer]:
    server = ProtocolServer(service, "127.0.0.1", 0, liveness_timeout=0.5)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def client(server: ProtocolServer) -> AsyncIterator[WireClient]:
    client = await WireClient.connect(server.port)
    yield client
    await client.close()


@pytest.fixture
async def connect() -> AsyncIterator[Callable[..., Awaitable[WireClient]]]:
    """Open more raw connections (`await connect(port, handshake=...)`), closed at the end."""
    clients: list[WireClient] = []

    async def open_client(port: int, *, handshake: bool = True) -> WireClient:
        client = await WireClient.connect(port, handshake=handshake)
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        await client.close()
