"""A consumer of a partitioned topic, as an audit compared it with pulsar-client-cpp: ids of
another topic are refused (acknowledged, they moved this topic's cursor past messages never
delivered), one consumer name on every partition (Failover ranks consumers by it), ids of a
single partition carry its index, and no single "last message id" across partitions."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import MessageId
from pyengine.errors import NotAllowedError
from tests.client.conftest import drain

A = "persistent://public/default/pa"
B = "persistent://public/default/pb"


async def test_a_message_of_another_topic_is_not_acknowledged_here(broker, client):
    for topic in (A, B):
        await broker.service.policies.create_partitioned_topic(topic, 2)
    on_a = await client.subscribe(A, "s", initial_position="earliest", consumer_type="failover")
    on_b = await client.subscribe(B, "s", initial_position="earliest", consumer_type="failover")
    producer_a = await client.create_producer(A)
    for _ in range(8):
        await producer_a.send(b"a")
    producer_b = await client.create_producer(B)
    message = await on_a.receive(timeout=5)
    for ack in (on_b.acknowledge_cumulative, on_b.acknowledge, on_b.negative_acknowledge):
        with pytest.raises(ValueError, match="not of"):
            await ack(message)
        with pytest.raises(ValueError, match="not of"):
            await ack(message.message_id)
    for _ in range(4):
        await producer_b.send(b"b")
    assert len(await drain(on_b)) == 4                 # nothing of B was taken as acknowledged


async def test_an_unnamed_consumer_has_one_name_on_every_partition(broker, client):
    await broker.service.policies.create_partitioned_topic(A, 4)
    consumer = await client.subscribe(A, "s")
    names = {broker.service.topics[f"{A}-partition-{i}"].subscriptions["s"].consumers[0].name for i in range(4)}
    assert names == {consumer.consumer_name}
    # so that two Failover consumers split the partitions evenly, as pulsar-client-cpp's
    first = await client.subscribe(A, "f", consumer_type="failover")
    second = await client.subscribe(A, "f", consumer_type="failover")

    def split() -> list[int]:
        active = [[c.name for c in broker.service.topics[f"{A}-partition-{i}"].subscriptions["f"].consumers
                   if c.active] for i in range(4)]
        return [sum(names == [c.consumer_name] for names in active) for c in (first, second)]

    for _ in range(100):           # the second takes its partitions after the failover delay (1 s)
        if split() == [2, 2]:
            break
        await asyncio.sleep(0.05)
    assert split() == [2, 2]


async def test_a_consumer_of_one_partition_gives_ids_of_that_partition(broker, client):
    await broker.service.policies.create_partitioned_topic(A, 2)
    producer = await client.create_producer(f"{A}-partition-1")
    sent = await producer.send(b"x")
    one = await client.subscribe(f"{A}-partition-1", "one", initial_position="earliest")
    received = await one.receive(timeout=5)
    assert received.message_id.partition == 1 and received.message_id == MessageId(sent.ledger_id, sent.entry_id, -1, 1)
    whole = await client.subscribe(A, "whole", initial_position="earliest")
    await whole.seek(received.message_id)              # refused before: "not of a partition"
    await one.acknowledge(received)


async def test_no_single_last_message_id_across_partitions(broker, client):
    await broker.service.policies.create_partitioned_topic(A, 2)
    consumer = await client.subscribe(A, "s")
    producer = await client.create_producer(f"{A}-partition-0")
    sent = await producer.send(b"x")
    with pytest.raises(NotAllowedError, match="partitioned"):
        await consumer.get_last_message_id()
    first, second = await consumer.get_last_message_ids()
    assert (first.ledger_id, first.entry_id, first.partition) == (sent.ledger_id, sent.entry_id, 0)
    assert second.entry_id == -1 and second.partition == 1
    plain = await client.subscribe(B, "s")
    assert (await plain.get_last_message_ids()) == [await plain.get_last_message_id()]


async def test_partitions_share_the_receiver_queue(broker, client):
    """As pulsar-client-cpp (maxTotalReceiverQueueSizeAcrossPartitions, 50,000 by default):
    each partition asks for min(receiver_queue_size, total / partitions) messages, so a topic
    of many partitions does not buffer that many full queues (an audit's finding)."""
    await broker.service.policies.create_partitioned_topic(A, 3)
    await client.subscribe(A, "few", max_total_receiver_queue_size_across_partitions=30)
    await client.subscribe(A, "default", receiver_queue_size=100)
    for subscription, permits in (("few", 10), ("default", 100)):
        for i in range(3):
            [consumer] = broker.service.topics[f"{A}-partition-{i}"].subscriptions[subscription].consumers
            for _ in range(100):
                if consumer.permits == permits:
                    break
                await asyncio.sleep(0.01)
            assert consumer.permits == permits
    for bad in (0, -1, "many"):
        with pytest.raises((ValueError, TypeError)):
            await client.subscribe(A, "bad", max_total_receiver_queue_size_across_partitions=bad)
