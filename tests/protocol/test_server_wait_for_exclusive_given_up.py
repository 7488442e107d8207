"""A WaitForExclusive producer that stops waiting (its client closes it, or its connection
goes) leaves nothing behind: its creation ends, so the broker still stops cleanly, and the
topic goes to the next producer when it is free."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import BaseCommand, WireClient

Connect = Callable[..., Awaitable[WireClient]]
TOPIC = "persistent://public/default/wait-for-exclusive-given-up"


async def _queued(server: ProtocolServer, connect: Connect, producer_id: int = 0) -> WireClient:
    waiter = await connect(server.port)
    queued = await waiter.create_producer(TOPIC, producer_id=producer_id,
                                          producer_access_mode=pb.WaitForExclusive)
    assert isinstance(queued, pb.CommandProducerSuccess) and not queued.producer_ready
    return waiter


async def test_a_waiting_producer_that_is_closed_or_disconnected_does_not_stall_stop(
        service: BrokerService, connect: Connect) -> None:
    server = ProtocolServer(service, "127.0.0.1", 0)
    await server.start()
    try:
        holder = await connect(server.port)
        await holder.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
        closing = await _queued(server, connect)
        assert isinstance(await closing.request("CLOSE_PRODUCER", producer_id=0, request_id=1), pb.CommandSuccess)
        leaving = await _queued(server, connect)
        await leaving.close()
        # The holder lets go: the next producer gets the topic at once, nobody is still queued.
        await holder.request("CLOSE_PRODUCER", producer_id=0, request_id=1)
        other = await connect(server.port)
        reply = await other.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
        assert isinstance(reply, pb.CommandProducerSuccess) and reply.producer_ready, reply
    finally:
        await asyncio.wait_for(server.stop(), 5)
