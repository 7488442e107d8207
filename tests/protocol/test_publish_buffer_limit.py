"""The broker's publish buffer (Apache's maxMessagePublishBufferSizeInMB): when the bytes of the
sends being stored, over every connection, reach the limit, the connections with producers are
no longer read until half of it is left. Before, only the count of sends per connection was
bounded (1000), so a few connections sending 5 MB messages could hold gigabytes."""
from __future__ import annotations

import asyncio

import pytest

from pyengine.protocol.server import ProtocolServer
from tests.protocol.stalled_storage import StalledPublishes
from tests.protocol.wire_driver import WireClient, metadata

STALLED = "persistent://public/default/buffer-stalled"
OTHER = "persistent://public/default/buffer-other"


async def fill_the_buffer(server: ProtocolServer, heavy: WireClient, stalled: StalledPublishes) -> None:
    """Four 1 KiB sends of `heavy`'s producer 0, held being stored: the 4000-byte buffer is full."""
    for seq in range(4):
        heavy.send_payload("SEND", metadata("p", seq), b"x" * 1024, producer_id=0, sequence_id=seq)
    await heavy.writer.drain()
    for _ in range(100):
        if len(stalled) == 4:
            break
        await asyncio.sleep(0.01)
    assert len(stalled) == 4 and server.publish_buffer_bytes >= 4000


async def test_a_full_publish_buffer_stops_reading_producers_until_half_is_left(service, monkeypatch) -> None:
    server = ProtocolServer(service, "127.0.0.1", 0, max_publish_buffer_bytes=4000)
    await server.start()
    stalled = None
    heavy = await WireClient.connect(server.port)
    light = await WireClient.connect(server.port)
    bystander = await WireClient.connect(server.port)
    try:
        await heavy.create_producer(STALLED)
        await light.create_producer(OTHER)
        stalled = StalledPublishes(await service.get_topic(STALLED), monkeypatch)

        await fill_the_buffer(server, heavy, stalled)

        # Another producer's connection is not read meanwhile (its topic is not slow) ...
        light.send_payload("SEND", metadata("q", 0), b"small", producer_id=0, sequence_id=0)
        await light.writer.drain()
        with pytest.raises(TimeoutError):
            await light.receive(0.3)
        # ... a connection without producers is.
        assert (await bystander.request("LOOKUP", topic=OTHER, request_id=1)).request_id == 1

        await stalled.release(1)                # ~3 KiB left: still more than half
        assert (await heavy.expect("SEND_RECEIPT")).sequence_id == 0
        with pytest.raises(TimeoutError):
            await light.receive(0.3)
        await stalled.release(2)                # ~1 KiB left: reading again
        assert [(await heavy.expect("SEND_RECEIPT")).sequence_id for _ in range(2)] == [1, 2]
        receipt = await light.expect("SEND_RECEIPT")
        assert (receipt.producer_id, receipt.sequence_id) == (0, 0)
        await stalled.release(1)
        assert (await heavy.expect("SEND_RECEIPT")).sequence_id == 3
        assert server.publish_buffer_bytes == 0
    finally:
        if stalled is not None:
            await stalled.release()
        for client in (heavy, light, bystander):
            await client.close()
        await server.stop()


@pytest.mark.parametrize("limit", [0, -2, 1.5, True, "1"])
def test_the_limit_must_be_positive_or_minus_one(service, limit) -> None:
    with pytest.raises(ValueError, match="max_publish_buffer_bytes"):
        ProtocolServer(service, "127.0.0.1", 0, max_publish_buffer_bytes=limit)


async def test_no_limit(service) -> None:
    server = ProtocolServer(service, "127.0.0.1", 0, max_publish_buffer_bytes=-1)
    await server.start()
    client = await WireClient.connect(server.port)
    try:
        await client.create_producer(OTHER)
        assert (await client.publish(0, 0, b"x" * 100_000)).send_receipt.sequence_id == 0
        assert server.publish_buffer_bytes == 0
    finally:
        await client.close()
        await server.stop()


async def test_a_producer_created_while_the_buffer_is_full_is_not_read_after_its_send(service, monkeypatch) -> None:
    """The broker's publish buffer is full: a connection that had no producer at the moment it
    filled (a producer that reconnects, a new client) must not go on being read while it sends,
    or the buffer's bound holds only for the connections that happened to have producers then
    (Apache checks the threshold on every send: its connection stops being read)."""
    server = ProtocolServer(service, "127.0.0.1", 0, max_publish_buffer_bytes=4000)
    await server.start()
    stalled = None
    heavy = await WireClient.connect(server.port)
    late = await WireClient.connect(server.port)
    try:
        await heavy.create_producer(STALLED)
        stalled = StalledPublishes(await service.get_topic(STALLED), monkeypatch)
        await fill_the_buffer(server, heavy, stalled)

        # A producer created now (its connection had none when the buffer filled) ...
        assert (await late.create_producer(OTHER)).producer_name
        # ... has the send it wrote stored (it was read before anything was known) ...
        assert (await late.publish(0, 0, b"first")).send_receipt.sequence_id == 0
        # ... and is then no longer read, as every connection that sends while it is full.
        late.send_payload("SEND", metadata("q", 1), b"second", producer_id=0, sequence_id=1)
        await late.writer.drain()
        with pytest.raises(TimeoutError):
            await late.receive(0.3)
        await stalled.release()                 # empty: everyone is read again
        assert (await late.expect("SEND_RECEIPT")).sequence_id == 1
        assert server.publish_buffer_bytes == 0
    finally:
        if stalled is not None:
            await stalled.release()
        for client in (heavy, late):
            await client.close()
        await server.stop()
