"""Findings of a review of the broker's side of a wire connection (pyengine/protocol:
teardown, flow control, keep-alive), each pinned by a test that failed on the code as
reviewed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import BaseCommand, WireClient, metadata

Connect = Callable[..., Awaitable[WireClient]]
TOPIC = "persistent://public/default/wire-connection-review"


async def test_a_huge_flow_to_a_client_that_does_not_read_buffers_a_bounded_amount(
        server: ProtocolServer, client: WireClient, connect: Connect) -> None:
    """A consumer gave 2^32-1 permits and then read nothing: the dispatcher's pass read the
    whole backlog at once and wrote it all to the connection (its writability was never
    asked), so the broker held every byte of the backlog in memory for a client that did not
    take them (Pulsar dispatches to a consumer only while its channel is writable)."""
    entries, size = 800, 20_000                 # 16 MB of backlog
    await client.create_producer(TOPIC, producer_id=1, request_id=1)
    for sequence_id in range(entries):
        client.send_payload("SEND", metadata("p", sequence_id), b"x" * size, producer_id=1, sequence_id=sequence_id)
    for _ in range(entries):
        assert (await client.receive()).type == BaseCommand.SEND_RECEIPT
    reader = await connect(server.port)
    await reader.subscribe(TOPIC, "s", consumer_id=1, request_id=2)
    connection = next(c for c in server.connections if c.consumers)
    reader.send("FLOW", consumer_id=1, messagePermits=(1 << 32) - 1)
    await asyncio.sleep(0.5)
    buffered = connection.transport.get_write_buffer_size()
    assert buffered < 6_000_000, f"{buffered} bytes buffered for a client that reads nothing"
    # Once the client reads, everything comes, in order.
    ids = []
    for _ in range(entries):
        message, _ = await reader.message()
        ids.append((message.message_id.ledgerId, message.message_id.entryId))
    assert ids == sorted(set(ids))
