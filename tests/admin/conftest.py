"""An admin server on 127.0.0.1 (a free port) over an in-process broker on a temporary data
dir, an HTTP client for it, and the embedded client on the same broker to make traffic."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from pyengine.admin import AdminServer
from pyengine.broker.embedded import EmbeddedClient
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.cli import main


@dataclass
class Reply:
    status: int
    body: Any          # decoded JSON, the text when it is not JSON, None when empty
    headers: Any
    data: bytes = b""  # the body as received (a binary one is not text)


class Api:
    """Raw HTTP calls to the admin server (bodies sent as given: tests send malformed ones)."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def call(self, method: str, path: str, body: Any = None, *, raw: bytes | str | None = None) -> Reply:
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        async with self.session.request(method, self.url + path, data=data,
                                        headers={"Content-Type": "application/json"}) as reply:
            data = await reply.read()
            try:
                text = data.decode("utf-8")
                decoded = json.loads(text) if text else None
            except ValueError:          # (UnicodeDecodeError included: a binary body)
                decoded = data.decode("utf-8", "replace")
            return Reply(reply.status, decoded, reply.headers, data)

    async def get(self, path: str) -> Reply:
        return await self.call("GET", path)

    async def put(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return await self.call("PUT", path, body, **kw)

    async def post(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return await self.call("POST", path, body, **kw)

    async def delete(self, path: str) -> Reply:
        return await self.call("DELETE", path)


@pytest.fixture
async def service(tmp_path):
    broker = BrokerService(BrokerConfig(data_dir=tmp_path / "data", sync=False, num_coordinators=2))
    await broker.start()
    yield broker
    await broker.close()


@pytest.fixture
async def server(service):
    admin = AdminServer(service, port=0)
    await admin.start()
    yield admin
    await admin.stop()


@pytest.fixture
async def api(server):
    async with aiohttp.ClientSession() as session:
        yield Api(session, server.url)


@pytest.fixture
async def client(service):
    embedded = EmbeddedClient(service)
    yield embedded
    await embedded.close()


@pytest.fixture
def admin(server, capsys):
    """Run `pyengine admin --url <server> ARGS...` (in a thread: the server runs on this loop);
    returns (exit status, parsed stdout, stderr)."""

    async def run(*args: str):
        status = await asyncio.to_thread(main, ["admin", "--url", server.url, *args])
        out, err = capsys.readouterr()
        return status, json.loads(out) if out.strip() else None, err

    return run


@contextlib.asynccontextmanager
async def restartable_broker(data_dir, **config) -> AsyncIterator[tuple[BrokerService, Api, EmbeddedClient]]:
    """A broker with its admin server and an embedded client on `data_dir`, for tests that
    stop it and start another on the same data (the fixtures above live for one test)."""
    service = BrokerService(BrokerConfig(data_dir=data_dir, sync=False, **config))
    await service.start()
    admin = AdminServer(service, port=0)
    await admin.start()
    client = EmbeddedClient(service)
    try:
        async with aiohttp.ClientSession() as session:
            yield service, Api(session, admin.url), client
    finally:
        await client.close()
        await admin.stop()
        await service.close()
