"""Unsubscribe of a partitioned topic's consumer when one partition refuses it, against
pulsar-client-cpp (its consumer of a partitioned topic is the MultiTopicsConsumerImpl): every
partition is tried, the error is raised, and the consumer stays open so that the unsubscribe
can be retried once the refusal is gone."""

from __future__ import annotations

import pytest

from pyengine.client.handler import CLOSED
from pyengine.errors import MetadataError

TOPIC = "persistent://public/default/parted-unsub"


@pytest.fixture
async def partitioned(broker):
    await broker.service.policies.create_partitioned_topic(TOPIC, 3)
    return TOPIC


def _subscriptions(broker, partition: int) -> set[str]:
    topic = broker.service.topics.get(f"{TOPIC}-partition-{partition}")
    return set(topic.subscriptions) if topic is not None else set()


async def test_an_unsubscribe_refused_on_one_partition_keeps_the_consumer_open_for_a_retry(
        broker, client, partitioned):
    consumer = await client.subscribe(partitioned, "s", consumer_type="shared")
    # Another consumer of the Shared subscription on partition 1: the broker refuses (as Apache,
    # a MetadataError) to delete the subscription there while it is connected.
    other = await client.subscribe(f"{TOPIC}-partition-1", "s", consumer_type="shared")
    with pytest.raises(MetadataError, match="shared consumer attempting to unsubscribe"):
        await consumer.unsubscribe()
    assert [_subscriptions(broker, i) for i in range(3)] == [set(), {"s"}, set()]   # the others went
    consumer._check_open()                      # still open: not closed, no failure kept
    await other.close()
    await consumer.unsubscribe()                # the retry goes through on partition 1, and closes
    assert [_subscriptions(broker, i) for i in range(3)] == [set(), set(), set()]
    assert all(handler.state == CLOSED for handler in consumer._handlers.values())
    assert consumer._closed
