"""A broker on the network for the client's tests: BrokerService + ProtocolServer in this
process, on a temp dir and a free loopback port; `restart()` brings it back on the same port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.client import Client
from pyengine.protocol.server import ProtocolServer


async def drain(consumer, timeout: float = 1.0) -> list:
    """Receive and acknowledge until nothing comes for `timeout` seconds; the messages."""
    got = []
    while True:
        try:
            message = await consumer.receive(timeout=timeout)
        except TimeoutError:
            return got
        got.append(message)
        await consumer.acknowledge(message)


async def until_buffered(consumer, count: int) -> None:
    """Until `count` messages sit in a MultiTopicsConsumer's own buffer (none handed out)."""
    for _ in range(500):
        if len(consumer._buffer) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(consumer._buffer)} messages buffered, not {count}")


class NetworkBroker:
    def __init__(self, data_dir: Path, **config) -> None:
        self.data_dir = data_dir
        self.config = config
        self.service: BrokerService | None = None
        self.server: ProtocolServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.service = BrokerService(BrokerConfig(data_dir=self.data_dir, sync=False, **self.config))
        await self.service.start()
        self.server = ProtocolServer(self.service, "127.0.0.1", self.port)
        await self.server.start()
        self.port = self.server.port

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self.service is not None:
            await self.service.close()
            self.service = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def __aenter__(self) -> NetworkBroker:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[NetworkBroker]:
    async with NetworkBroker(tmp_path / "data", num_coordinators=4) as network_broker:
        yield network_broker


@pytest.fixture
async def client(broker: NetworkBroker) -> AsyncIterator[Client]:
    async with Client(broker.url, operation_timeout_seconds=10) as network_client:
        yield network_client


def answer_registrations_when_set(client, monkeypatch) -> asyncio.Event:
    """ADD_PARTITION_TO_TXN goes out only once the returned event is set."""
    coordinator = client._core.coordinator
    registered = asyncio.Event()
    original = coordinator.add_partition

    async def slow(*args):
        await registered.wait()
        await original(*args)
    monkeypatch.setattr(coordinator, "add_partition", lambda *args: asyncio.ensure_future(slow(*args)))
    return registered


def record_sends(connection, monkeypatch) -> list[bytes]:
    """The SEND frames `connection` writes from now on (written on as well), in order."""
    from pyengine.protocol import pulsar_api_pb2 as pb

    written: list[bytes] = []
    write = connection.write

    def recording(frame: bytes) -> None:
        size = int.from_bytes(frame[4:8], "big")
        if pb.BaseCommand.FromString(frame[8:8 + size]).type == pb.BaseCommand.SEND:
            written.append(frame)
        write(frame)
    monkeypatch.setattr(connection, "write", recording)
    return written


def answer_late(monkeypatch, seconds: float, late: Callable[[Any], bool]) -> None:
    """The client takes the broker's answer to each request `late(cmd)` selects `seconds` after
    it came (a slow broker or network): the request stays pending on the client meanwhile."""
    from pyengine.client.connection import ClientConnection
    from pyengine.protocol.commands import command_body

    late_ids: set[int] = set()
    send_request, settle = ClientConnection.send_request, ClientConnection._settle

    def sending(connection, cmd):
        if late(cmd):
            late_ids.add(command_body(cmd).request_id)
        return send_request(connection, cmd)

    def settling(connection, cmd) -> None:
        if command_body(cmd).request_id in late_ids:
            asyncio.get_running_loop().call_later(seconds, settle, connection, cmd)
        else:
            settle(connection, cmd)
    monkeypatch.setattr(ClientConnection, "send_request", sending)
    monkeypatch.setattr(ClientConnection, "_settle", settling)


def consumers_on_broker(broker: NetworkBroker, topic: str, subscription: str = "s") -> int:
    """How many consumers `subscription` of `topic` has on the broker (0: no such topic or subscription)."""
    from pyengine.naming import TopicName

    found = broker.service.topics.get(str(TopicName.parse(topic)))
    if found is None or subscription not in found.subscriptions:
        return 0
    return len(found.subscriptions[subscription].consumers)


def producers_on_broker(broker: NetworkBroker, topic: str) -> int:
    from pyengine.naming import TopicName

    found = broker.service.topics.get(str(TopicName.parse(topic)))
    return 0 if found is None else len(found.producers)


@pytest.fixture
async def scalable_client(broker: NetworkBroker, request) -> AsyncIterator[Client]:
    """A client of `broker` with the test module's scalable topic `T` created (one segment)."""
    broker.service.service_url = broker.url          # as `pyengine serve` sets it
    scalable = await broker.service.scalable_topics()
    await scalable.create_topic(request.module.T, 1)
    async with Client(broker.url, operation_timeout_seconds=10) as network_client:
        yield network_client
