"""CommandSubscribe.subscription_properties (PIP-105): the properties of the durable
subscription the SUBSCRIBE creates, ignored when it exists already (as Pulsar's
asyncOpenCursor, which opens an existing cursor as it is), kept in memory for a reader's
subscription; refused when they cannot be kept, with nothing created."""

from __future__ import annotations

from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from pyengine.subscription_properties import MAX_SUBSCRIPTION_PROPERTIES_BYTES
from tests.protocol.wire_driver import WireClient

T = "persistent://public/default/props"


def key_values(**properties: str) -> list[pb.KeyValue]:
    return [pb.KeyValue(key=key, value=value) for key, value in properties.items()]


async def test_a_subscribe_that_creates_the_subscription_sets_its_properties(
        service: BrokerService, server: ProtocolServer, client: WireClient) -> None:
    properties = [*key_values(a="1", b="2"), pb.KeyValue(key="a", value="last")]
    reply = await client.subscribe(T, "s", subscription_properties=properties)
    assert isinstance(reply, pb.CommandSuccess), reply
    topic = await service.get_topic(T)
    assert topic.subscriptions["s"].subscription_properties == {"a": "last", "b": "2"}
    client.send("CLOSE_CONSUMER", consumer_id=0, request_id=1)
    await client.expect("SUCCESS")
    # Subscribing again with others changes nothing: the subscription exists.
    reply = await client.subscribe(T, "s", consumer_id=1, request_id=2, subscription_properties=key_values(c="3"))
    assert isinstance(reply, pb.CommandSuccess), reply
    assert topic.subscriptions["s"].subscription_properties == {"a": "last", "b": "2"}


async def test_a_subscribe_without_properties_creates_a_subscription_with_none(
        service: BrokerService, server: ProtocolServer, client: WireClient) -> None:
    await client.subscribe(T, "plain")
    assert (await service.get_topic(T)).subscriptions["plain"].subscription_properties == {}


async def test_a_readers_subscription_holds_its_properties_in_memory(
        service: BrokerService, server: ProtocolServer, client: WireClient) -> None:
    await client.subscribe(T, "reader-sub", durable=False, subscription_properties=key_values(r="1"))
    topic = await service.get_topic(T)
    assert "reader-sub" not in topic.subscriptions
    assert topic.non_durable_subscriptions()["reader-sub"].subscription_properties == {"r": "1"}


async def test_properties_too_large_are_refused_and_create_nothing(
        service: BrokerService, server: ProtocolServer, client: WireClient) -> None:
    large = key_values(k="v" * MAX_SUBSCRIPTION_PROPERTIES_BYTES)
    reply = await client.subscribe(T, "big", subscription_properties=large)
    assert reply.error == pb.NotAllowedError and "more than" in reply.message, reply
    assert "big" not in (await service.get_topic(T)).subscriptions
    # The connection goes on.
    await client.subscribe(T, "fine", consumer_id=1, request_id=1, subscription_properties=key_values(a="b"))
    assert (await service.get_topic(T)).subscriptions["fine"].subscription_properties == {"a": "b"}
