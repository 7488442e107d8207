"""Pulsar's maxProducersPerTopic, maxConsumersPerTopic and maxConsumersPerSubscription: a
producer or consumer past the limit is refused with ProducerBusy / ConsumerBusy and Pulsar's
words; 0 (the default) is no limit; a topic policy overrides the namespace's, which overrides
the broker's."""

import pytest

from pyengine.broker import Broker
from pyengine.errors import ConsumerBusyError, ProducerBusyError

T = "persistent://public/default/connection-limits"


async def test_no_limit_by_default(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        for _ in range(5):
            await broker.create_producer(T)
            await broker.subscribe(T, "s", consumer_type="shared")


async def test_producers_past_the_limit_are_refused_until_one_leaves(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_producers_per_topic=2) as broker:
        first = await broker.create_producer(T)
        await broker.create_producer(T)
        with pytest.raises(ProducerBusyError, match="^Topic reached max producers limit$"):
            await broker.create_producer(T)
        await first.close()
        await broker.create_producer(T)


async def test_consumers_past_the_topic_limit_are_refused_before_their_subscription_is_made(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_consumers_per_topic=2) as broker:
        await broker.subscribe(T, "a", consumer_type="shared")
        second = await broker.subscribe(T, "a", consumer_type="shared")
        with pytest.raises(ConsumerBusyError, match="^Topic reached max consumers limit$"):
            await broker.subscribe(T, "b")
        assert "b" not in broker.service.topics[T].subscriptions
        await second.close()
        await broker.subscribe(T, "b")


async def test_consumers_past_the_subscription_limit_are_refused(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_consumers_per_subscription=2) as broker:
        for sub_type in ("shared", "failover", "key_shared"):
            await broker.subscribe(T, sub_type, consumer_type=sub_type)
            await broker.subscribe(T, sub_type, consumer_type=sub_type)
            with pytest.raises(ConsumerBusyError, match="^Subscription reached max consumers limit$"):
                await broker.subscribe(T, sub_type, consumer_type=sub_type)
        await broker.subscribe(T, "other", consumer_type="shared")          # another subscription
        with pytest.raises(ConsumerBusyError, match="^(?!Subscription reached)"):
            await broker.subscribe(T, "shared", consumer_type="exclusive")   # the type's error first


async def test_a_topic_policy_overrides_the_namespace_and_the_broker(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_producers_per_topic=5) as broker:
        policies = broker.service.policies
        namespace = policies.policies("public/default")
        namespace.max_producers_per_topic = 1
        await policies.set_policies("public/default", namespace)
        await broker.create_producer(T)
        with pytest.raises(ProducerBusyError):
            await broker.create_producer(T)
        await policies.set_topic_policy(T, "maxProducerPerTopic", 0)        # 0: no limit
        await broker.create_producer(T)
        await broker.create_producer(T)
