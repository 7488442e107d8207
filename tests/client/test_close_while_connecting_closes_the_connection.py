"""Client.close() while a connection to a broker waits for its CONNECTED (found by an audit):
the close cancelled the handshake but left the TCP connection open, known to nobody (once the
broker answered, it PINGed the broker for ever after the close); and the operation waiting for
that connection ended cancelled, though nobody had cancelled it. Now the connection is closed
and the operation fails with AlreadyClosedError, as the Java and C++ clients fail it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pyengine.client import Client
from pyengine.client.errors import AlreadyClosedError

TOPIC = "persistent://public/default/t"


class SilentBroker:
    """A TCP server that reads the CONNECT and never answers it (a broker slow to answer)."""

    def __init__(self) -> None:
        self.received = asyncio.Event()       # the CONNECT came in: the handshake waits
        self.ended = asyncio.Event()          # the client closed the connection
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.read(65536):
                self.received.set()
        except ConnectionError:
            pass
        self.ended.set()
        writer.close()


@pytest.fixture
async def silent_broker() -> AsyncIterator[SilentBroker]:
    broker = SilentBroker()
    server = await asyncio.start_server(broker._serve, "127.0.0.1", 0)
    broker.port = server.sockets[0].getsockname()[1]
    try:
        yield broker
    finally:
        server.close()
        await server.wait_closed()


async def _close_during_the_handshake(broker: SilentBroker) -> asyncio.Future:
    """A lookup waiting for its connection's CONNECTED when the client closes; the lookup."""
    client = Client(f"pulsar://127.0.0.1:{broker.port}", operation_timeout_seconds=30,
                    connection_timeout_ms=30_000)
    lookup = asyncio.ensure_future(client.get_topic_partitions(TOPIC))
    await broker.received.wait()
    await client.close()
    return lookup


async def test_a_connection_whose_handshake_is_under_way_at_close_is_closed(silent_broker):
    lookup = await _close_during_the_handshake(silent_broker)
    done, _ = await asyncio.wait([asyncio.ensure_future(silent_broker.ended.wait())], timeout=1)
    assert done, "the connection whose handshake was under way is still open after close()"
    await asyncio.wait([lookup], timeout=1)


async def test_the_operation_waiting_for_it_fails_as_closed_not_cancelled(silent_broker):
    lookup = await _close_during_the_handshake(silent_broker)
    await asyncio.wait([lookup], timeout=1)
    assert lookup.done()
    assert not lookup.cancelled(), "the lookup ended cancelled, though nobody cancelled it"
    with pytest.raises(AlreadyClosedError):
        lookup.result()
