"""Partitions added to a partitioned topic later (Pulsar's autoUpdatePartitions): producers and
consumers read the partition count again every `partitions_update_interval` seconds, route to
and subscribe the new partitions, and never drop one."""

from __future__ import annotations

import asyncio
import math
import re
from collections import Counter

import pytest

from pyengine.client import Client
from pyengine.client.router import key_partition

TOPIC = "persistent://public/default/growing"
INTERVAL = 0.05


@pytest.fixture
async def two_partitions(broker):
    await broker.service.policies.create_partitioned_topic(TOPIC, 2)
    return TOPIC


@pytest.fixture
async def fast_client(broker):
    async with Client(broker.url, operation_timeout_seconds=10, partitions_update_interval=INTERVAL) as client:
        yield client


async def _until(condition, timeout: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "not within the timeout"
        await asyncio.sleep(INTERVAL / 2)


async def _receive(consumer, count: int) -> list:
    messages = [await consumer.receive(timeout=3) for _ in range(count)]
    for message in messages:
        await consumer.acknowledge(message)
    return messages


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (math.nan, ValueError), (math.inf, ValueError),
                                        ("60", TypeError), (True, TypeError), (None, TypeError)])
def test_malformed_intervals_are_refused(bad, error):
    with pytest.raises(error, match="partitions_update_interval"):
        Client("pulsar://127.0.0.1:6650", partitions_update_interval=bad)


async def test_zero_turns_the_updates_off(broker, two_partitions):
    async with Client(broker.url, partitions_update_interval=0) as client:
        producer = await client.create_producer(two_partitions)
        consumer = await client.subscribe(two_partitions, "off")
        await broker.service.policies.update_partitions(two_partitions, 3)
        await asyncio.sleep(INTERVAL * 4)
        assert producer._partitions_update is None and consumer._partitions_update is None
        assert {(await producer.send(b"x")).partition for _ in range(6)} == {0, 1}


async def test_producer_and_consumer_take_on_new_partitions(broker, fast_client, two_partitions):
    producer = await fast_client.create_producer(two_partitions)
    consumer = await fast_client.subscribe(two_partitions, "grow")      # at the latest position
    before = [await producer.send(b"b%d" % i) for i in range(4)]
    assert Counter(m.partition for m in before) == {0: 2, 1: 2}
    await broker.service.policies.update_partitions(two_partitions, 4)
    await _until(lambda: len(producer._partitions) == 4 and len(consumer._handlers) == 4)
    after = [await producer.send(b"a%d" % i) for i in range(8)]
    assert Counter(m.partition for m in after) == {0: 2, 1: 2, 2: 2, 3: 2}
    keys = [f"key-{i}" for i in range(12)]
    keyed = [await producer.send(b"k", key=key) for key in keys]
    assert [m.partition for m in keyed] == [key_partition(key, 4) for key in keys]
    assert {key_partition(key, 4) for key in keys} - {0, 1}            # some keys moved to the new partitions
    received = await _receive(consumer, 4 + 8 + 12)
    assert Counter(m.message_id.partition for m in received) == Counter(
        m.partition for m in before + after + keyed)
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.2)


async def test_a_new_partition_is_consumed_from_its_start(broker, fast_client, two_partitions):
    """The producer reaches a new partition before the consumer subscribes it: what was sent
    there meanwhile is still received (the broker does not carry the subscription over)."""
    async with Client(broker.url, partitions_update_interval=0.5) as slow_client:
        consumer = await slow_client.subscribe(two_partitions, "late", consumer_type="shared")
        producer = await fast_client.create_producer(two_partitions)
        await broker.service.policies.update_partitions(two_partitions, 3)
        await _until(lambda: len(producer._partitions) == 3)
        assert len(consumer._handlers) == 2
        sent = [await producer.send(b"%d" % i) for i in range(6)]
        assert {m.partition for m in sent} == {0, 1, 2}
        received = await _receive(consumer, 6)
        assert sorted(m.data for m in received) == sorted(b"%d" % i for i in range(6))


async def test_partitions_are_never_dropped_and_failed_updates_are_tried_again(broker, fast_client, two_partitions,
                                                                               monkeypatch):
    producer = await fast_client.create_producer(two_partitions)
    consumer = await fast_client.subscribe(two_partitions, "keep")
    lookup = fast_client._core.lookup
    real_partitions = lookup.partitions
    # fewer partitions, none, then failures: each update changes nothing
    answers: list[int | Exception] = [1, 1, 0, 0, ConnectionError("broker away"), ConnectionError("broker away")]

    async def partitions(topic: str) -> int:
        if not answers:
            return await real_partitions(topic)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(lookup, "partitions", partitions)
    await _until(lambda: not answers)
    assert len(producer._partitions) == 2 and sorted(consumer._handlers) == [0, 1]
    assert {(await producer.send(b"x")).partition for _ in range(4)} == {0, 1}
    await broker.service.policies.update_partitions(two_partitions, 3)
    await _until(lambda: len(producer._partitions) == 3 and len(consumer._handlers) == 3)
    assert {(await producer.send(b"x")).partition for _ in range(3)} == {0, 1, 2}


async def test_a_multi_topics_consumer_takes_on_new_partitions(broker, fast_client, two_partitions):
    plain = "persistent://public/default/growing-plain"
    by_list = await fast_client.subscribe([two_partitions, plain], "multi")
    by_pattern = await fast_client.subscribe(re.compile("persistent://public/default/growing.*"), "pattern",
                                             pattern_auto_discovery_period=60)
    producer = await fast_client.create_producer(two_partitions)
    await broker.service.policies.update_partitions(two_partitions, 3)
    await _until(lambda: len(producer._partitions) == 3
                 and all(len(c._consumers[two_partitions]._handlers) == 3 for c in (by_list, by_pattern)))
    sent = [await producer.send(b"%d" % i) for i in range(6)]
    assert {m.partition for m in sent} == {0, 1, 2}
    for consumer in (by_list, by_pattern):
        received = await _receive(consumer, 6)
        assert Counter(m.message_id.partition for m in received) == {0: 2, 1: 2, 2: 2}


async def test_closing_stops_the_updates(fast_client, two_partitions):
    producer = await fast_client.create_producer(two_partitions)
    consumer = await fast_client.subscribe(two_partitions, "closing")
    tasks = [producer._partitions_update, consumer._partitions_update]
    assert all(task is not None and not task.done() for task in tasks)
    await producer.close()
    await consumer.close()
    await asyncio.sleep(0)
    assert all(task.done() for task in tasks)
