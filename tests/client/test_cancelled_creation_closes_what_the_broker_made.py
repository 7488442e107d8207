"""A subscribe() or create_producer() cancelled after the broker created some of what it asked
for (some partitions, some topics of a list, or a single topic whose answer came in the turn of
the cancel) closes all of it, as Pulsar's clients close what they give up creating: left alone,
it held the exclusive subscription (ConsumerBusy) or the producer name (ProducerBusy) for
nobody (found by an audit)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client.connection import ClientConnection
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import command_body
from tests.client.conftest import answer_late, consumers_on_broker, producers_on_broker

T = pb.BaseCommand
TOPIC = "persistent://public/default/cancelled-creation"


def creation_topic(cmd) -> str | None:
    if cmd.type == T.SUBSCRIBE:
        return cmd.subscribe.topic
    if cmd.type == T.PRODUCER:
        return cmd.producer.topic
    return None


async def cancelled(creating: asyncio.Future, after: float | None) -> None:
    """`creating` ends cancelled: by this call `after` seconds (None: by someone else)."""
    if after is not None:
        await asyncio.sleep(after)
        creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    await asyncio.sleep(0.2)              # the CLOSE_CONSUMER / CLOSE_PRODUCER reach the broker


async def test_a_cancelled_partitioned_subscribe_closes_the_partitions_subscribed(broker, client, monkeypatch):
    await broker.service.policies.create_partitioned_topic(TOPIC, 3)
    await client.get_topic_partitions(TOPIC)                 # connected
    answer_late(monkeypatch, 1.0, lambda cmd: (creation_topic(cmd) or "").endswith("-partition-2"))
    await cancelled(asyncio.ensure_future(client.subscribe(TOPIC, "s")), 0.3)
    assert [consumers_on_broker(broker, f"{TOPIC}-partition-{i}") for i in range(3)] == [0, 0, 0]
    monkeypatch.undo()
    await client.subscribe(TOPIC, "s")                        # exclusive: nobody holds it


async def test_a_cancelled_multi_topic_subscribe_closes_the_topics_subscribed(broker, client, monkeypatch):
    topics = [f"{TOPIC}-{i}" for i in range(3)]
    await client.get_topic_partitions(topics[0])
    answer_late(monkeypatch, 1.0, lambda cmd: creation_topic(cmd) == topics[2])
    await cancelled(asyncio.ensure_future(client.subscribe(topics, "s")), 0.3)
    assert [consumers_on_broker(broker, topic) for topic in topics] == [0, 0, 0]
    monkeypatch.undo()
    await client.subscribe(topics, "s")


async def test_a_cancelled_partitioned_create_producer_closes_the_partitions_created(broker, client, monkeypatch):
    await broker.service.policies.create_partitioned_topic(TOPIC, 3)
    await client.get_topic_partitions(TOPIC)
    answer_late(monkeypatch, 1.0, lambda cmd: (creation_topic(cmd) or "").endswith("-partition-2"))
    await cancelled(asyncio.ensure_future(client.create_producer(TOPIC, producer_name="named")), 0.3)
    assert [producers_on_broker(broker, f"{TOPIC}-partition-{i}") for i in range(3)] == [0, 0, 0]
    monkeypatch.undo()
    await client.create_producer(TOPIC, producer_name="named")      # the name is free


@pytest.mark.parametrize("kind", ["consumer", "producer"])
async def test_a_creation_cancelled_as_its_answer_arrives_is_closed(broker, client, monkeypatch, kind):
    """The cancel lands in the turn the broker's answer is taken: the creation is given up, and
    what the broker created is closed (Python 3.11's wait_for went on with the answer instead,
    leaving the consumer READY for nobody)."""
    await client.get_topic_partitions(TOPIC)
    requests: set[int] = set()
    creating: list[asyncio.Future] = []
    send_request, settle = ClientConnection.send_request, ClientConnection._settle

    def sending(connection, cmd):
        if creation_topic(cmd) == TOPIC:
            requests.add(command_body(cmd).request_id)
        return send_request(connection, cmd)

    def settling(connection, cmd) -> None:
        settle(connection, cmd)
        if command_body(cmd).request_id in requests:
            creating[0].cancel()
    monkeypatch.setattr(ClientConnection, "send_request", sending)
    monkeypatch.setattr(ClientConnection, "_settle", settling)
    creating.append(asyncio.ensure_future(client.subscribe(TOPIC, "s") if kind == "consumer"
                                          else client.create_producer(TOPIC, producer_name="named")))
    await cancelled(creating[0], None)
    assert (consumers_on_broker(broker, TOPIC), producers_on_broker(broker, TOPIC)) == (0, 0)
    assert client._core.open_objects == []
    monkeypatch.undo()
    if kind == "consumer":
        await client.subscribe(TOPIC, "s")
    else:
        await client.create_producer(TOPIC, producer_name="named")
