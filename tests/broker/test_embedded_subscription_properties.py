"""The embedded client's subscribe(subscription_properties=...): the properties of a
subscription it creates (each topic's, for a list of topics), an existing one keeping its own,
kept across a restart; anything but a mapping of str to str refused before anything is made."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.errors import InvalidSubscriptionPropertiesError
from pyengine.subscription_properties import MAX_SUBSCRIPTION_PROPERTIES_BYTES

T = "persistent://public/default/embedded-props"


async def test_subscribe_sets_the_properties_of_the_subscription_it_creates(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await broker.subscribe(T, "s", subscription_properties={"a": "1"})
        await consumer.close()
        again = await broker.subscribe(T, "s", subscription_properties={"b": "2"})
        assert broker.service.topics[T].subscriptions["s"].subscription_properties == {"a": "1"}
        await again.close()
        several = await broker.subscribe([T + "-x", T + "-y"], "multi", subscription_properties={"m": "v"})
        for name in (T + "-x", T + "-y"):
            assert broker.service.topics[name].subscriptions["multi"].subscription_properties == {"m": "v"}
        await several.close()
    async with Broker.embedded(tmp_path, sync=False) as broker:
        assert (await broker.service.get_topic(T)).subscriptions["s"].subscription_properties == {"a": "1"}


@pytest.mark.parametrize("properties,error", [
    ({"a": 1}, TypeError), ({1: "a"}, TypeError), ([("a", "b")], TypeError), ("a=b", TypeError),
    ({"a": None}, TypeError), ({"a": "\ud800"}, InvalidSubscriptionPropertiesError),
    ({"k": "v" * MAX_SUBSCRIPTION_PROPERTIES_BYTES}, InvalidSubscriptionPropertiesError),
])
async def test_malformed_properties_are_refused_before_anything_is_made(tmp_path, properties, error):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        with pytest.raises(error, match="subscription_properties"):
            await broker.subscribe(T, "s", subscription_properties=properties)
        assert T not in broker.service.topics
