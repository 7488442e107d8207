"""While the broker has stopped reading a connection (MAX_PENDING_SENDS sends being stored),
the client's PONGs cannot be read: the keep-alive does not close that connection (found by an
audit: it did, after two intervals of slow storage, and every receipt in flight was lost, so
the client sent them all again). Pulsar's PulsarHandler.handleKeepAliveTimeout forces the
close only when `waitingForPingResponse && ctx.channel().config().isAutoRead()`."""
from __future__ import annotations

import asyncio

import pytest

from pyengine.protocol import connection as connection_module
from pyengine.protocol.server import ProtocolServer
from tests.protocol.stalled_storage import StalledPublishes
from tests.protocol.wire_driver import WireClient, metadata

TOPIC = "persistent://public/default/keepalive-paused"


async def test_paused_connection_is_not_closed_by_keepalive(service, monkeypatch) -> None:
    monkeypatch.setattr(connection_module, "MAX_PENDING_SENDS", 4)
    server = ProtocolServer(service, "127.0.0.1", 0, keepalive_interval=0.2)
    await server.start()
    stalled = None
    client = await WireClient.connect(server.port)
    try:
        await client.create_producer(TOPIC)
        stalled = StalledPublishes(await service.get_topic(TOPIC), monkeypatch)    # storage that takes a while
        for seq in range(6):
            client.send_payload("SEND", metadata("p", seq), b"x", producer_id=0, sequence_id=seq)
        await client.writer.drain()
        await asyncio.sleep(0.3)
        conn = next(iter(server.connections))
        assert conn._paused, "reads should be paused by the pending sends"
        # The client is alive and answers every PING it sees; storage is slow for ~1 s.
        try:
            await client.receive(1.0)
        except TimeoutError:
            pass
        except Exception as exc:  # Closed
            pytest.fail(f"broker closed a live connection whose reads it had paused itself: {exc!r}")
        assert not conn.closed, "keep-alive closed a connection whose reads the broker paused"
    finally:
        if stalled is not None:
            await stalled.release()
        await client.close()
        await server.stop()
