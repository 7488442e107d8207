"""Multi-topic consumers, as pulsar-client's `subscribe`: a list of topics, or a compiled regex of
one namespace's topics (re-discovered every `pattern_auto_discovery_period` seconds). Messages
of every topic are received by one consumer and acknowledged on their own topic, in and out
of transactions; malformed topics and patterns are refused."""

from __future__ import annotations

import asyncio
import re

import pytest

from pyengine.client import AlreadyClosedError, MultiTopicsConsumer

NS = "persistent://public/default"


async def _fill(client, topics: list[str], per_topic: int = 3) -> set[bytes]:
    sent = set()
    for topic in topics:
        producer = await client.create_producer(topic)
        for i in range(per_topic):
            data = f"{topic.rsplit('/', 1)[1]}:{i}".encode()
            await producer.send(data, key=f"k{i}")
            sent.add(data)
        await producer.close()
    return sent


async def _receive(consumer, count: int, timeout: float = 5.0) -> list:
    return [await consumer.receive(timeout=timeout) for _ in range(count)]


async def test_a_pattern_receives_and_acknowledges_the_matching_topics_only(client, broker):
    await broker.service.policies.create_partitioned_topic(f"{NS}/orders-p", 2)
    expected = await _fill(client, [f"{NS}/orders-1", f"{NS}/orders-2", f"{NS}/orders-p"])
    await _fill(client, [f"{NS}/payments-1", f"{NS}/xorders-1"])            # not matching
    consumer = await client.subscribe(re.compile(f"{NS}/orders-.*"), "sub", initial_position="earliest")
    assert isinstance(consumer, MultiTopicsConsumer)
    assert consumer.topics == [f"{NS}/orders-1", f"{NS}/orders-2", f"{NS}/orders-p"]
    received = await _receive(consumer, len(expected))
    assert {m.data for m in received} == expected
    for message in received:
        await consumer.acknowledge(message)
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.3)
    await consumer.close()
    # acknowledged on each topic: a new consumer of the subscription gets nothing again
    again = await client.subscribe(re.compile(f"{NS}/orders-.*"), "sub", initial_position="earliest")
    with pytest.raises(TimeoutError):
        await again.receive(timeout=0.5)
    await again.close()


async def test_a_pattern_without_domain_or_namespace_is_of_public_default(client):
    expected = await _fill(client, [f"{NS}/short-a"])
    consumer = await client.subscribe(re.compile("short-.*"), "sub", initial_position="earliest")
    assert consumer.topics == [f"{NS}/short-a"]
    assert {m.data for m in await _receive(consumer, 3)} == expected


async def test_discovery_picks_up_new_topics_and_drops_gone_ones(client, monkeypatch):
    await _fill(client, [f"{NS}/late-1"], per_topic=1)
    consumer = await client.subscribe(re.compile(f"{NS}/late-.*"), "sub", initial_position="earliest",
                                      pattern_auto_discovery_period=0.05)
    assert (await consumer.receive(timeout=5)).data == b"late-1:0"
    producer = await client.create_producer(f"{NS}/late-2")        # created after the subscription
    await producer.send(b"new topic")
    message = await consumer.receive(timeout=5)
    assert (message.data, message.topic) == (b"new topic", f"{NS}/late-2")
    assert consumer.topics == [f"{NS}/late-1", f"{NS}/late-2"]
    await consumer.acknowledge(message)
    # late-1 is gone from the namespace's topics: its consumer is closed, the other one stays
    core = client._core
    listed = core.topics_of_namespace

    async def without_late_1(namespace: str, mode: int) -> list[str]:
        return [t for t in await listed(namespace, mode) if t != f"{NS}/late-1"]
    dropped = consumer._consumers[f"{NS}/late-1"]
    monkeypatch.setattr(core, "topics_of_namespace", without_late_1)
    for _ in range(100):
        if consumer.topics == [f"{NS}/late-2"]:
            break
        await asyncio.sleep(0.02)
    assert consumer.topics == [f"{NS}/late-2"]
    with pytest.raises(AlreadyClosedError):
        await dropped.receive(timeout=0)
    await producer.send(b"still here")
    assert (await consumer.receive(timeout=5)).data == b"still here"


async def test_a_list_of_topics_acknowledged_in_a_transaction(client):
    topics = [f"{NS}/list-a", f"{NS}/list-b"]
    expected = await _fill(client, topics)
    consumer = await client.subscribe(topics + [topics[0]], "sub", initial_position="earliest")
    assert consumer.topics == topics
    received = await _receive(consumer, len(expected))
    assert {m.data for m in received} == expected
    assert {m.topic for m in received} == set(topics)
    txn = await client.new_transaction()
    for message in received:
        await consumer.acknowledge(message, txn=txn)
    await txn.commit()
    await consumer.redeliver_unacknowledged_messages()
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.5)


async def test_close_closes_every_topic_consumer(client):
    await _fill(client, [f"{NS}/closing-a", f"{NS}/closing-b"], per_topic=1)
    consumer = await client.subscribe([f"{NS}/closing-a", f"{NS}/closing-b"], "sub")
    children = list(consumer._consumers.values())
    waiting = asyncio.ensure_future(consumer.receive())
    await asyncio.sleep(0.05)
    await consumer.close()
    with pytest.raises(AlreadyClosedError):
        await waiting
    for child in children:
        with pytest.raises(AlreadyClosedError):
            await child.receive(timeout=0)
    # the subscription is free again on both topics (Exclusive: a second consumer would be refused)
    again = await client.subscribe([f"{NS}/closing-a", f"{NS}/closing-b"], "sub")
    await again.close()


@pytest.mark.parametrize("pattern", [
    "persistent://public/.*/orders-.*",               # across namespaces
    "persistent://.*/default/orders-.*",              # across tenants
    "(persistent|non-persistent)://public/default/x",  # across domains
    "topic://public/default/orders-.*",               # not a pattern domain
    "public/default",                                 # no topic part
    "persistent://public/default/",
])
async def test_a_pattern_must_be_within_one_namespace(client, pattern):
    with pytest.raises(ValueError, match="pattern"):
        await client.subscribe(re.compile(pattern), "sub")


@pytest.mark.parametrize("topics, error, says", [
    ([], ValueError, "at least one topic"), ((), ValueError, "at least one topic"),
    ([f"{NS}/a", 3], TypeError, "string, not int"), ([None], TypeError, "string, not NoneType"),
    ([f"{NS}/a", "persistent://bad name/x/y/z"], ValueError, "bad name"),
    (["topic://public/default/scalable"], ValueError, "scalable"),
])
async def test_a_malformed_list_of_topics_is_refused(client, topics, error, says):
    with pytest.raises(error, match=says):
        await client.subscribe(topics, "sub")


@pytest.mark.parametrize("period, error", [(0, ValueError), (-1, ValueError), ("60", TypeError), (True, TypeError)])
async def test_a_bad_discovery_period_is_refused(client, period, error):
    with pytest.raises(error, match="pattern_auto_discovery_period must be"):
        await client.subscribe(re.compile(f"{NS}/x-.*"), "sub", pattern_auto_discovery_period=period)


async def test_negative_and_cumulative_acknowledgements_go_to_the_message_topic(client):
    topics = [f"{NS}/nack-a", f"{NS}/nack-b"]
    await _fill(client, topics, per_topic=2)
    consumer = await client.subscribe(topics, "sub", initial_position="earliest",
                                      negative_ack_redelivery_delay_ms=50)
    received = await _receive(consumer, 4)
    last_of = {m.topic: m for m in received}
    nacked = last_of[topics[0]]
    await consumer.acknowledge_cumulative(last_of[topics[1]])      # both of nack-b
    for message in received:
        if message.topic == topics[0] and message is not nacked:
            await consumer.acknowledge(message)
    await consumer.negative_acknowledge(nacked)
    again = await consumer.receive(timeout=5)
    # Count 0: an exclusive subscription (Pulsar's single-active-consumer dispatcher counts none).
    assert (again.topic, again.data, again.redelivery_count) == (nacked.topic, nacked.data, 0)
    await consumer.acknowledge_cumulative(again)
    await consumer.redeliver_unacknowledged_messages()
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.5)
