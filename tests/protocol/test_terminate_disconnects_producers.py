"""Terminating a topic disconnects its producers, as Pulsar's PersistentTopic.terminate does:
the client is told (CLOSE_PRODUCER) and, reconnecting, refused with TopicTerminated (found by
an audit: the producers stayed attached until their next send)."""

from __future__ import annotations

from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from tests.protocol.wire_driver import WireClient

TOPIC = "persistent://public/default/terminated"


async def test_terminate_closes_the_producers(service: BrokerService, client: WireClient) -> None:
    assert isinstance(await client.create_producer(TOPIC), pb.CommandProducerSuccess)
    await service.topics[TOPIC].terminate()
    assert (await client.expect("CLOSE_PRODUCER")).producer_id == 0
    reply = await client.create_producer(TOPIC, request_id=1)
    assert reply.error == pb.TopicTerminatedError
