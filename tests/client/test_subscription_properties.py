"""pyengine.client's subscribe(subscription_properties=...): sent in CommandSubscribe, the
properties of the subscription the subscribe creates (every partition's), an existing one
keeping its own, also when the consumer subscribes again after a broker restart; anything but
a mapping of str to str refused before anything is sent."""

from __future__ import annotations

import pytest

from pyengine.errors import InvalidSubscriptionPropertiesError
from pyengine.subscription_properties import MAX_SUBSCRIPTION_PROPERTIES_BYTES

T = "persistent://public/default/client-props"


async def test_subscribe_sets_the_properties_of_the_subscription_it_creates(broker, client):
    consumer = await client.subscribe(T, "s", subscription_properties={"team": "billing"})
    subscription = broker.service.topics[T].subscriptions["s"]
    assert subscription.subscription_properties == {"team": "billing"}
    await subscription.update_subscription_properties({"team": "changed by the admin"})
    await broker.restart()                      # the consumer subscribes again, with its own
    producer = await client.create_producer(T)
    await producer.send(b"m")
    assert (await consumer.receive(timeout=10)).data == b"m"
    assert broker.service.topics[T].subscriptions["s"].subscription_properties == {"team": "changed by the admin"}
    await consumer.close()


async def test_every_partition_gets_them(broker, client):
    await broker.service.policies.create_partitioned_topic(T + "-p", 2)
    consumer = await client.subscribe(T + "-p", "s", subscription_properties={"k": "v"})
    for index in range(2):
        topic = broker.service.topics[f"{T}-p-partition-{index}"]
        assert topic.subscriptions["s"].subscription_properties == {"k": "v"}
    await consumer.close()


@pytest.mark.parametrize("properties,error", [
    ({"a": 1}, TypeError), ({1: "a"}, TypeError), ([("a", "b")], TypeError), ("a=b", TypeError),
    ({"a": "\ud800"}, InvalidSubscriptionPropertiesError),
    ({"k": "v" * MAX_SUBSCRIPTION_PROPERTIES_BYTES}, InvalidSubscriptionPropertiesError),
])
async def test_malformed_properties_are_refused_before_anything_is_sent(broker, client, properties, error):
    with pytest.raises(error, match="subscription_properties"):
        await client.subscribe(T, "s", subscription_properties=properties)
    assert T not in broker.service.topics
