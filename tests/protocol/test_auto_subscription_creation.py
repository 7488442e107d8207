"""Auto subscription creation on the wire (Pulsar's allowAutoSubscriptionCreation and its
namespace and topic overrides): a consumer of a durable subscription that does not exist is
refused with SubscriptionNotFound where it is off; a reader, an existing subscription and a
producer's initial subscription (refused NotAllowed, as Pulsar) are checked too."""

from __future__ import annotations

import dataclasses

from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from tests.protocol.wire_driver import WireClient

TOPIC = "persistent://public/default/subs"


async def test_a_missing_durable_subscription_is_refused_where_creation_is_off(service: BrokerService,
                                                                                client: WireClient) -> None:
    topic = await service.get_topic(TOPIC)
    await topic.open_subscription("existing", "earliest")
    service.policies.auto_subscription_creation_default = False
    refused = await client.subscribe(TOPIC, "new-sub", request_id=1)
    assert (refused.request_id, refused.error) == (1, pb.SubscriptionNotFound)
    assert "new-sub" not in topic.subscriptions
    assert (await client.subscribe(TOPIC, "existing", consumer_id=1, request_id=2)).request_id == 2
    client.send("SUBSCRIBE", topic=TOPIC, subscription="reader-sub", subType=pb.CommandSubscribe.Exclusive,
                consumer_id=2, request_id=3, durable=False)
    assert (await client.expect("SUCCESS")).request_id == 3              # a reader's subscription is made


async def test_the_topic_override_wins_over_the_namespace_over_the_broker(service: BrokerService,
                                                                          client: WireClient) -> None:
    await service.get_topic(TOPIC)
    policies = service.policies
    await policies.set_topic_policy(TOPIC, "autoSubscriptionCreation", {"allowAutoSubscriptionCreation": False})
    assert (await client.subscribe(TOPIC, "a", request_id=1)).error == pb.SubscriptionNotFound
    await policies.set_topic_policy(TOPIC, "autoSubscriptionCreation", None)
    await policies.set_policies("public/default", dataclasses.replace(
        policies.policies("public/default"), auto_subscription_creation_override={"allowAutoSubscriptionCreation": False}))
    assert (await client.subscribe(TOPIC, "b", consumer_id=1, request_id=2)).error == pb.SubscriptionNotFound
    await policies.set_topic_policy(TOPIC, "autoSubscriptionCreation", {"allowAutoSubscriptionCreation": True})
    assert (await client.subscribe(TOPIC, "c", consumer_id=2, request_id=3)).request_id == 3
    assert "c" in (await service.get_topic(TOPIC)).subscriptions


async def test_a_producers_initial_subscription_is_not_created_where_creation_is_off(service: BrokerService,
                                                                                     client: WireClient) -> None:
    await service.get_topic(TOPIC)
    service.policies.auto_subscription_creation_default = False
    refused = await client.create_producer(TOPIC, request_id=1, initial_subscription_name="init")
    assert (refused.request_id, refused.error) == (1, pb.NotAllowedError)
    assert "auto subscription creation is not allowed" in refused.message
    topic = await service.get_topic(TOPIC)
    assert "init" not in topic.subscriptions and not topic.producers
