"""A producer the broker closed (fenced, disconnected): SENDs the client wrote before it saw
the CLOSE_PRODUCER are ignored rather than closing the connection, but only for a while, as
Apache's ServerCnx.recentlyClosedProducers (one keep-alive interval). A client that never
creates that producer again (fenced for good) must not leave its id on the connection for the
connection's whole life: a long-lived connection would collect one per fenced producer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import WireClient, metadata

TOPIC = "persistent://public/default/recently-closed-producers"
INTERVAL = 0.3


@pytest.fixture
async def quick_server(service: BrokerService) -> AsyncIterator[ProtocolServer]:
    server = ProtocolServer(service, "127.0.0.1", 0, keepalive_interval=INTERVAL)
    await server.start()
    yield server
    await server.stop()


async def test_the_id_of_a_fenced_producer_is_forgotten_after_a_keepalive_interval(quick_server) -> None:
    one = await WireClient.connect(quick_server.port)
    two = await WireClient.connect(quick_server.port)
    try:
        assert isinstance(await one.create_producer(TOPIC, producer_id=5, request_id=1), pb.CommandProducerSuccess)
        (connection,) = [c for c in quick_server.connections if c.producers]
        reply = await two.create_producer(TOPIC, producer_id=0, request_id=1,
                                          producer_access_mode=pb.ExclusiveWithFencing)
        assert isinstance(reply, pb.CommandProducerSuccess), reply
        assert (await one.expect("CLOSE_PRODUCER")).producer_id == 5
        # A send written before the client saw the close is ignored, the connection lives on.
        one.send_payload("SEND", metadata("p", 0), b"late", producer_id=5, sequence_id=0)
        assert isinstance(await one.request("PING"), pb.CommandPong)
        assert 5 in connection._recently_closed_producers
        # The client gives that producer up for good (ProducerFenced): the id does not stay.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10 * INTERVAL
        while 5 in connection._recently_closed_producers and loop.time() < deadline:
            assert isinstance(await one.request("PING"), pb.CommandPong)     # stays talkative
            await asyncio.sleep(INTERVAL / 5)
        assert 5 not in connection._recently_closed_producers
        assert not connection.closed
    finally:
        await one.close()
        await two.close()
