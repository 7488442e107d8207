"""create_producer(initial_subscription_name=...): the broker creates the subscription with the
producer, so messages sent before any consumer subscribes are kept for it."""

from __future__ import annotations

import pytest

TOPIC = "persistent://public/default/producer-initial-sub"


async def test_messages_sent_before_the_first_consumer_are_kept(client, broker):
    producer = await client.create_producer(TOPIC, initial_subscription_name="init")
    topic = await broker.service.get_topic(TOPIC, create=False)
    assert "init" in topic.subscriptions
    for i in range(3):
        await producer.send(b"%d" % i)
    consumer = await client.subscribe(TOPIC, "init", initial_position="latest")
    assert [(await consumer.receive(timeout=5)).data for _ in range(3)] == [b"0", b"1", b"2"]


async def test_each_partition_gets_the_subscription(client, broker):
    await broker.service.policies.create_partitioned_topic(TOPIC, 2)
    await client.create_producer(TOPIC, initial_subscription_name="init")
    for i in range(2):
        topic = await broker.service.get_topic(f"{TOPIC}-partition-{i}", create=False)
        assert "init" in topic.subscriptions


async def test_a_bad_name_is_refused_before_anything_is_sent(client):
    with pytest.raises((TypeError, ValueError)):
        await client.create_producer(TOPIC, initial_subscription_name="")
    with pytest.raises(ValueError):
        await client.create_producer("topic://public/default/scalable", initial_subscription_name="init")
