"""Edges of the producer access modes found by an audit, each as Pulsar's broker has it:

* A WaitForExclusive producer still queued was already a producer of its connection: its
  SENDs were stored while another producer held the topic exclusively, and a PRODUCER again
  got PRODUCER_SUCCESS. Pulsar's ServerCnx closes the connection on such a SEND ("producer is
  not ready") and answers the PRODUCER ServiceNotReady (it is being created).
* A producer fenced by an ExclusiveWithFencing one while its own creation was still running
  came to life afterwards, and stored what it sent with no receipt.
* ExclusiveWithFencing left the WaitForExclusive producers queued, so the next of them took
  the topic once the fencer left; Pulsar's incrementTopicEpochIfNeeded fails them (Fenced)."""

from __future__ import annotations

import asyncio

from pyengine.protocol import pulsar_api_pb2 as pb
from tests.protocol.wire_driver import BaseCommand, metadata

TOPIC = "persistent://public/default/producer-access-edges"


async def _queued(server, connect, producer_id: int = 0):
    waiter = await connect(server.port)
    queued = await waiter.create_producer(TOPIC, producer_id=producer_id, producer_access_mode=pb.WaitForExclusive)
    assert isinstance(queued, pb.CommandProducerSuccess) and not queued.producer_ready
    return waiter


async def test_a_queued_producer_cannot_send_and_is_not_created_twice(server, service, client, connect):
    holder = await client.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
    assert holder.producer_ready
    again = await _queued(server, connect)
    reply = await again.create_producer(TOPIC, producer_id=0, request_id=1, producer_access_mode=pb.WaitForExclusive)
    assert isinstance(reply, pb.CommandError) and reply.error == pb.ServiceNotReady
    sender = await _queued(server, connect)
    sender.send_payload("SEND", metadata("p", 0), b"sneaked in", producer_id=0, sequence_id=0)
    assert await sender.closed()
    topic = await service.get_topic(TOPIC)
    assert topic.ledger.number_of_entries == 0
    assert (await client.publish(0, 0, b"by the holder")).type == BaseCommand.SEND_RECEIPT


async def test_a_queued_producer_gets_the_topic_when_it_is_free(server, client, connect):
    await client.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
    waiter = await _queued(server, connect)
    assert isinstance(await client.request("CLOSE_PRODUCER", producer_id=0, request_id=1), pb.CommandSuccess)
    granted = await waiter.expect("PRODUCER_SUCCESS")
    assert granted.producer_ready and granted.topic_epoch == 2
    assert (await waiter.publish(0, 0, b"now it may")).type == BaseCommand.SEND_RECEIPT


async def test_exclusive_with_fencing_fences_the_queued_producers_too(server, client, connect):
    await client.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
    waiter = await _queued(server, connect)
    fencer = await connect(server.port)
    reply = await fencer.create_producer(TOPIC, producer_access_mode=pb.ExclusiveWithFencing)
    assert isinstance(reply, pb.CommandProducerSuccess) and reply.producer_ready
    failed = await waiter.expect("ERROR")
    assert failed.error == pb.ProducerFenced
    await fencer.request("CLOSE_PRODUCER", producer_id=0, request_id=1)
    other = await connect(server.port)
    reply = await other.create_producer(TOPIC, producer_access_mode=pb.Exclusive)      # nobody took it
    assert isinstance(reply, pb.CommandProducerSuccess) and reply.producer_ready


async def test_a_producer_fenced_while_being_created_is_not_created(server, service, connect, monkeypatch):
    topic = await service.get_topic(TOPIC)
    real_open = topic.open_subscription

    async def slow_open(*args, **kwargs):          # storage that takes a moment
        await asyncio.sleep(0.3)
        return await real_open(*args, **kwargs)
    monkeypatch.setattr(topic, "open_subscription", slow_open)
    shared = await connect(server.port)
    shared.send("PRODUCER", topic=TOPIC, producer_id=0, request_id=0, initial_subscription_name="init")
    await asyncio.sleep(0.1)                        # its creation waits on its initial subscription
    fencer = await connect(server.port)
    reply = await fencer.create_producer(TOPIC, producer_access_mode=pb.ExclusiveWithFencing)
    assert isinstance(reply, pb.CommandProducerSuccess) and reply.producer_ready
    answer = await shared.receive(3)
    assert answer.type == BaseCommand.ERROR and answer.error.error == pb.ServiceNotReady
    assert (await fencer.publish(0, 0, b"the fencer's")).type == BaseCommand.SEND_RECEIPT


async def test_the_topic_epoch_survives_a_restart(tmp_path):
    """The epoch of the last exclusive grant is stored with the topic (Pulsar's
    `pulsar.topic.epoch` ledger property): after a restart a producer of an older grant is
    fenced. It was kept in memory only, so the older producer got the topic back and the newer
    one was then fenced."""
    from tests.client.conftest import NetworkBroker
    from tests.protocol.wire_driver import WireClient

    broker = NetworkBroker(tmp_path / "data")
    await broker.start()
    try:
        for expected_epoch in (1, 2):                   # A's grant, then B's after A left
            producer = await WireClient.connect(broker.port)
            granted = await producer.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
            assert granted.topic_epoch == expected_epoch
            await producer.close()
            await asyncio.sleep(0.1)
        await broker.restart()
        old = await WireClient.connect(broker.port)
        refused = await old.create_producer(TOPIC, producer_access_mode=pb.Exclusive, topic_epoch=1)
        assert isinstance(refused, pb.CommandError) and refused.error == pb.ProducerFenced
        await old.close()
        newer = await WireClient.connect(broker.port)
        granted = await newer.create_producer(TOPIC, producer_access_mode=pb.Exclusive, topic_epoch=2)
        assert isinstance(granted, pb.CommandProducerSuccess) and granted.topic_epoch == 2
        await newer.close()
    finally:
        await broker.stop()
