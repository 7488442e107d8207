"""A topic closed for its deletion tells its network clients, as Pulsar's PersistentTopic.close /
delete (with clients connected, force) do through Producer.disconnect and the subscriptions'
disconnect: CLOSE_PRODUCER and CLOSE_CONSUMER, on a connection that stays open for the client's
other producers and consumers. Found by an audit: the producers were not told, their next SEND
was answered SEND_ERROR ServiceNotReady, and the official client closes its whole connection on
any SEND_ERROR but ChecksumError (dropping every other producer and consumer on it).

While the topic is being deleted (closed, its deletion under way) a PRODUCER or SUBSCRIBE is
refused with ServiceNotReady (Pulsar's TopicFencedException, which clients retry), also one
that attached just before the close began and was still being created: it was answered
PRODUCER_SUCCESS for the dying topic."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.access_modes import TOPIC_EPOCH_PROPERTY
from tests.protocol.wire_driver import BaseCommand, WireClient, metadata

DELETED = "persistent://public/default/deleted-under-its-clients"
OTHER = "persistent://public/default/next-to-the-deleted-one"


def _held_deletion(service: BrokerService, monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """The topic's deletion stops once the topic is closed, until the second event is set:
    (closed, go on)."""
    closed, go_on = asyncio.Event(), asyncio.Event()
    topic = service.topics[DELETED]
    delete = topic.delete

    async def held(*args, **kwargs):
        await topic.close()
        closed.set()
        await go_on.wait()
        return await delete(*args, **kwargs)

    monkeypatch.setattr(topic, "delete", held)
    return closed, go_on


async def _commands(client: WireClient, count: int) -> list[pb.BaseCommand]:
    return [await client.receive() for _ in range(count)]


async def test_the_deleted_topics_producers_and_consumers_are_closed_and_the_connection_stays(
        service: BrokerService, client: WireClient) -> None:
    assert isinstance(await client.create_producer(DELETED, producer_id=1, request_id=1), pb.CommandProducerSuccess)
    assert isinstance(await client.subscribe(DELETED, "s", consumer_id=1, request_id=2, permits=10),
                      pb.CommandSuccess)
    assert isinstance(await client.create_producer(OTHER, producer_id=2, request_id=3), pb.CommandProducerSuccess)
    assert isinstance(await client.subscribe(OTHER, "s", consumer_id=2, request_id=4, permits=10),
                      pb.CommandSuccess)
    assert (await client.publish(1, 0, b"old", producer_name="a")).type == BaseCommand.SEND_RECEIPT
    assert (await client.message())[0].consumer_id == 1

    await service.delete_topic(DELETED)
    told = await _commands(client, 2)
    assert sorted(BaseCommand.Type.Name(c.type) for c in told) == ["CLOSE_CONSUMER", "CLOSE_PRODUCER"]
    assert [c.close_producer.producer_id for c in told if c.type == BaseCommand.CLOSE_PRODUCER] == [1]
    assert [c.close_consumer.consumer_id for c in told if c.type == BaseCommand.CLOSE_CONSUMER] == [1]
    # A SEND the client wrote before it saw the close is dropped, not a reason to close the
    # connection (Apache's recentlyClosedProducers).
    client.send_payload("SEND", metadata("a", 1), b"late", producer_id=1, sequence_id=1)
    await client.no_command(0.3)

    # The other topic's producer and consumer go on, on the same connection.
    assert (await client.publish(2, 0, b"other", producer_name="b")).type == BaseCommand.SEND_RECEIPT
    message, data = await client.message()
    assert message.consumer_id == 2 and data.endswith(b"other")

    # Reconnecting (the same ids, as the clients do), they find the topic created again.
    assert isinstance(await client.create_producer(DELETED, producer_id=1, request_id=5, producer_name="a"),
                      pb.CommandProducerSuccess)
    assert isinstance(await client.subscribe(DELETED, "s", consumer_id=1, request_id=6, permits=10),
                      pb.CommandSuccess)
    assert (await client.publish(1, 1, b"new", producer_name="a")).type == BaseCommand.SEND_RECEIPT
    message, data = await client.message()
    assert message.consumer_id == 1 and data.endswith(b"new")     # the old message went with the topic
    await client.no_command(0.3)


async def test_creations_on_a_topic_being_deleted_are_refused_as_retriable(
        service: BrokerService, client: WireClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also an Exclusive producer whose topic epoch was being stored as the deletion began:
    it had passed the topic's checks, and was answered PRODUCER_SUCCESS for the dying topic."""
    topic = await service.get_topic(DELETED)
    storing, stored = asyncio.Event(), asyncio.Event()
    set_property = topic.ledger.set_property

    async def slow_set_property(key: str, value: str) -> None:
        await set_property(key, value)
        if key == TOPIC_EPOCH_PROPERTY:
            storing.set()
            await stored.wait()

    monkeypatch.setattr(topic.ledger, "set_property", slow_set_property)
    client.send("PRODUCER", topic=DELETED, producer_id=1, request_id=1, producer_access_mode=pb.Exclusive)
    await asyncio.wait_for(storing.wait(), 5)
    closed, go_on = _held_deletion(service, monkeypatch)
    deleting = asyncio.ensure_future(service.delete_topic(DELETED))
    await asyncio.wait_for(closed.wait(), 5)
    stored.set()
    refused = await client.expect("ERROR")
    assert (refused.request_id, refused.error) == (1, pb.ServiceNotReady), refused

    # While the deletion goes on: refused (retriable), never attached to the closed topic.
    refused = await client.create_producer(DELETED, producer_id=2, request_id=2)
    assert (refused.request_id, refused.error) == (2, pb.ServiceNotReady), refused
    refused = await client.subscribe(DELETED, "s", consumer_id=1, request_id=3)
    assert (refused.request_id, refused.error) == (3, pb.ServiceNotReady), refused
    assert not topic.producers and not topic.consumers()

    go_on.set()
    await asyncio.wait_for(deleting, 5)
    # The retries find the topic created again.
    assert isinstance(await client.create_producer(DELETED, producer_id=1, request_id=4,
                                                   producer_access_mode=pb.Exclusive), pb.CommandProducerSuccess)
    assert service.topics[DELETED] is not topic
    assert isinstance(await client.subscribe(DELETED, "s", consumer_id=1, request_id=5), pb.CommandSuccess)
