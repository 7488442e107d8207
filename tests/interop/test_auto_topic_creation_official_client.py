"""Auto topic and subscription creation as the official `pulsar-client` meets them: refused
where a namespace turns them off, and a missing topic made partitioned by the client's own
lookup of the partitioned metadata where that is the namespace's type (its producer then spreads
over the partitions and its consumer reads them all)."""

from __future__ import annotations

import pulsar
import pytest

from pyengine.testing import ServeProcess
from tests.interop.conftest import QUIET


@pytest.fixture
def namespace(broker: ServeProcess, request: pytest.FixtureRequest) -> str:
    name = f"public/auto-{request.node.name.replace('_', '-')[:40]}"
    broker.admin("PUT", f"/admin/v2/namespaces/{name}")
    return name


def test_producers_and_consumers_of_missing_topics_are_refused_where_creation_is_off(
        broker: ServeProcess, official: pulsar.Client, namespace: str) -> None:
    broker.admin("POST", f"/admin/v2/namespaces/{namespace}/autoTopicCreation", {"allowAutoTopicCreation": False})
    topic = f"persistent://{namespace}/missing"
    with pytest.raises(pulsar.TopicNotFound):
        official.create_producer(topic)
    with pytest.raises(pulsar.TopicNotFound):
        official.subscribe(topic, "sub")
    broker.admin("PUT", f"/admin/v2/persistent/{namespace}/made")          # created on purpose: served
    producer = official.create_producer(f"persistent://{namespace}/made")
    producer.send(b"x")
    producer.close()


def test_a_missing_topic_is_made_partitioned_by_the_clients_lookup(broker: ServeProcess, official: pulsar.Client,
                                                                   namespace: str) -> None:
    broker.admin("POST", f"/admin/v2/namespaces/{namespace}/autoTopicCreation",
                 {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 3})
    topic = f"persistent://{namespace}/spread"
    consumer = official.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = official.create_producer(topic, batching_enabled=False,
                                        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(9):
        producer.send(f"m{i}".encode())
    producer.close()
    assert official.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(3)]
    received = set()
    for _ in range(9):
        message = consumer.receive(timeout_millis=10_000)
        received.add(message.data())
        consumer.acknowledge(message)
    assert received == {f"m{i}".encode() for i in range(9)}
    assert broker.admin("GET", f"/admin/v2/persistent/{namespace}/spread/partitions") == {"partitions": 3}
    consumer.close()


def test_a_missing_subscription_is_refused_where_subscription_creation_is_off(
        broker: ServeProcess, official: pulsar.Client, namespace: str) -> None:
    broker.admin("POST", f"/admin/v2/namespaces/{namespace}/autoSubscriptionCreation",
                 {"allowAutoSubscriptionCreation": False})
    topic = f"persistent://{namespace}/subscribed"
    broker.admin("PUT", f"/admin/v2/persistent/{namespace}/subscribed")
    # The C++ client takes SubscriptionNotFound for retryable (lib/ResultUtils.h), as against
    # Apache's broker: it asks again until its operation timeout.
    impatient = pulsar.Client(broker.url, logger=QUIET, operation_timeout_seconds=2)
    try:
        with pytest.raises(pulsar.Timeout):
            impatient.subscribe(topic, "new-sub")
    finally:
        impatient.close()
    assert "new-sub" not in broker.admin("GET", f"/admin/v2/persistent/{namespace}/subscribed/subscriptions")
    broker.admin("PUT", f"/admin/v2/persistent/{namespace}/subscribed/subscription/made")
    official.subscribe(topic, "made").close()
    reader = official.create_reader(topic, pulsar.MessageId.earliest)          # not a durable subscription
    reader.close()
