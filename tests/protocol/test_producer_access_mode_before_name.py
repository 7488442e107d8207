"""The access mode is decided before the producer name, as Pulsar's AbstractTopic.addProducer
(incrementTopicEpochIfNeeded, then internalAddProducer's name check). A task restarted under
the same producer name (de-duplication needs a fixed name) takes the topic over with
ExclusiveWithFencing or waits for it with WaitForExclusive; an Exclusive one is
ProducerFenced. Found by an audit: all were refused as ProducerBusy."""

from __future__ import annotations

import asyncio

from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import WireClient

TOPIC = "persistent://public/default/same-name"


async def test_same_name_with_each_access_mode(server: ProtocolServer, client: WireClient, connect) -> None:
    first = await client.create_producer(TOPIC, producer_name="app", producer_access_mode=pb.Exclusive)
    assert first.producer_name == "app"
    other = await connect(server.port)
    assert (await other.create_producer(TOPIC, producer_name="app")).error == pb.ProducerBusy
    reply = await other.create_producer(TOPIC, request_id=1, producer_name="app", producer_access_mode=pb.Exclusive)
    assert reply.error == pb.ProducerFenced
    waiting = await connect(server.port)
    queued = await waiting.create_producer(TOPIC, producer_name="app", producer_access_mode=pb.WaitForExclusive)
    assert isinstance(queued, pb.CommandProducerSuccess) and not queued.producer_ready
    assert queued.producer_name == "app"
    # ExclusiveWithFencing takes it from the holder (and from the one waiting, as Pulsar).
    fencer = await connect(server.port)
    taken = await fencer.create_producer(TOPIC, producer_name="app", producer_access_mode=pb.ExclusiveWithFencing)
    assert isinstance(taken, pb.CommandProducerSuccess) and taken.producer_name == "app", taken
    assert (await client.expect("CLOSE_PRODUCER")).producer_id == 0
    assert (await waiting.expect("ERROR")).error == pb.ProducerFenced
    # WaitForExclusive of the same name gets the topic once the holder leaves.
    later = await connect(server.port)
    queued = await later.create_producer(TOPIC, producer_name="app", producer_access_mode=pb.WaitForExclusive)
    assert not queued.producer_ready
    assert isinstance(await fencer.request("CLOSE_PRODUCER", producer_id=0, request_id=1), pb.CommandSuccess)
    granted = await asyncio.wait_for(later.expect("PRODUCER_SUCCESS"), 5)
    assert granted.producer_ready, granted
    assert granted.producer_name == "app"


async def test_a_producer_without_a_name_waiting_for_the_topic_keeps_its_name(server, client, connect) -> None:
    await client.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
    waiting = await connect(server.port)
    queued = await waiting.create_producer(TOPIC, producer_access_mode=pb.WaitForExclusive)
    assert queued.producer_name and not queued.producer_ready
    await client.request("CLOSE_PRODUCER", producer_id=0, request_id=1)
    granted = await asyncio.wait_for(waiting.expect("PRODUCER_SUCCESS"), 5)
    assert granted.producer_ready and granted.producer_name == queued.producer_name
