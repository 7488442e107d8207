"""Review probes of the consumer limits: subscribes racing each other are counted as they are
added, and an Exclusive subscription's own error comes before the subscription's limit."""

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.errors import ConsumerBusyError

T = "persistent://public/default/connection-review"


async def test_concurrent_subscribes_stay_within_the_topic_and_subscription_limits(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_consumers_per_topic=1) as broker:
        await broker.create_producer(T)
        results = await asyncio.gather(broker.subscribe(T, "a"), broker.subscribe(T, "b"), return_exceptions=True)
        assert [type(r) for r in results].count(ConsumerBusyError) == 1
        assert broker.service.topics[T].number_of_consumers() == 1
    async with Broker.embedded(tmp_path / "2", sync=False, max_consumers_per_subscription=1) as broker:
        results = await asyncio.gather(*(broker.subscribe(T, "s", consumer_type="shared") for _ in range(3)),
                                       return_exceptions=True)
        assert [type(r) for r in results].count(ConsumerBusyError) == 2
        assert len(broker.service.topics[T].subscriptions["s"].consumers) == 1


async def test_a_second_exclusive_consumer_gets_the_exclusive_error_at_the_limit(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_consumers_per_subscription=1) as broker:
        await broker.subscribe(T, "e", consumer_type="exclusive")
        with pytest.raises(ConsumerBusyError, match="exclusive"):
            await broker.subscribe(T, "e", consumer_type="exclusive")
