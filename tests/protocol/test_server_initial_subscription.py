"""CommandProducer.initial_subscription_name: the broker creates that durable subscription, at
the earliest position, with the producer when the topic has none of that name (Pulsar's
ServerCnx.handleProducer)."""

from __future__ import annotations

from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from tests.protocol.wire_driver import WireClient

TOPIC = "persistent://public/default/initial-sub"


async def test_the_subscription_exists_once_the_producer_is_created(client: WireClient,
                                                                   service: BrokerService) -> None:
    reply = await client.create_producer(TOPIC, initial_subscription_name="init")
    assert isinstance(reply, pb.CommandProducerSuccess)
    topic = await service.get_topic(TOPIC, create=False)
    assert "init" in topic.subscriptions
    assert not topic.subscriptions["init"].consumers


async def test_messages_sent_before_any_consumer_are_kept_for_it(client: WireClient) -> None:
    await client.create_producer(TOPIC, initial_subscription_name="init")
    for i in range(3):
        receipt = await client.publish(0, i, b"m%d" % i)
        assert receipt.type == pb.BaseCommand.SEND_RECEIPT
    # a consumer asking for the latest position: the subscription exists, so it is not used
    await client.subscribe(TOPIC, "init", earliest=False, permits=10)
    assert [(await client.message())[1] for _ in range(3)] == [b"m0", b"m1", b"m2"]
    await client.no_command()


async def test_an_existing_subscription_is_left_as_it_is(client: WireClient, service: BrokerService) -> None:
    await client.create_producer(TOPIC, producer_id=0, request_id=1)
    await client.publish(0, 0, b"old")
    await client.subscribe(TOPIC, "s", earliest=False, request_id=2)      # after "old"
    await client.request("CLOSE_CONSUMER", consumer_id=0, request_id=3)
    topic = await service.get_topic(TOPIC, create=False)
    existing = topic.subscriptions["s"]
    await client.create_producer(TOPIC, producer_id=1, request_id=4, initial_subscription_name="s")
    assert topic.subscriptions["s"] is existing
    await client.publish(1, 0, b"new", producer_name="p1")
    # not re-created at the earliest position: "old" stays behind it
    await client.subscribe(TOPIC, "s", consumer_id=5, request_id=5, permits=10)
    assert (await client.message())[1] == b"new"
    await client.no_command()


async def test_without_the_field_no_subscription_is_created(client: WireClient, service: BrokerService) -> None:
    await client.create_producer(TOPIC)
    topic = await service.get_topic(TOPIC, create=False)
    assert not [name for name in topic.subscriptions if not name.startswith("__")]


async def test_an_unusable_name_fails_the_producer(client: WireClient, service: BrokerService) -> None:
    async def fail(*args: object, **kwargs: object) -> None:
        raise OSError("disk gone")

    topic = await service.get_topic(TOPIC)
    topic.open_subscription = fail  # type: ignore[method-assign]
    reply = await client.create_producer(TOPIC, initial_subscription_name="init")
    assert isinstance(reply, pb.CommandError)
    assert "Failed to create the initial subscription" in reply.message
    del topic.open_subscription
    # the producer id is free again: a second try works
    reply = await client.create_producer(TOPIC, request_id=1, initial_subscription_name="init")
    assert isinstance(reply, pb.CommandProducerSuccess)
    assert "init" in topic.subscriptions
