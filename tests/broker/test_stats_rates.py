"""Rates in the topic stats (Pulsar's msgRateIn, msgThroughputIn, msgRateOut, msgThroughputOut),
computed every stats interval over the interval since the last (rates.py), and the message
and byte counters they come from: per topic, publisher, subscription and consumer."""

from __future__ import annotations

import asyncio
import time

import pytest

from pyengine.admin.stats import partitioned_topic_stats, topic_stats
from pyengine.broker import Broker
from pyengine.broker.rates import RateCounter
from pyengine.broker.service import BrokerConfig

T = "persistent://public/default/rates"


def test_a_rate_is_over_the_interval_since_the_last_update():
    counter = RateCounter(now=100.0)
    counter.add(30, 3000)
    assert (counter.msg_rate, counter.byte_rate) == (0.0, 0.0)       # not computed before an interval
    counter.update(102.0)
    assert (counter.msg_rate, counter.byte_rate) == (15.0, 1500.0)
    counter.update(102.0)                                             # no time passed: kept
    assert counter.msg_rate == 15.0
    counter.add(4, 40)
    counter.update(106.0)
    assert (counter.msgs, counter.bytes, counter.msg_rate, counter.byte_rate) == (34, 3040, 1.0, 10.0)


async def test_topic_publisher_subscription_and_consumer_rates(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest", consumer_name="c")
        topic = broker.service.topics[T]
        start = time.monotonic()
        topic.update_rates(start)
        for i in range(10):
            await producer.send(b"x" * 100)
        for _ in range(10):
            await consumer.acknowledge(await consumer.receive(timeout=5))
        topic.update_rates(start + 2.0)
        stats = topic_stats(topic)
        size = stats["bytesInCounter"] / 10                            # one stored entry each
        assert (stats["msgInCounter"], stats["msgRateIn"], stats["msgThroughputIn"]) == (10, 5.0, 5 * size)
        assert (stats["msgOutCounter"], stats["msgRateOut"], stats["msgThroughputOut"]) == (10, 5.0, 5 * size)
        [publisher] = stats["publishers"]
        assert (publisher["msgInCounter"], publisher["msgRateIn"]) == (10, 5.0)
        sub = stats["subscriptions"]["s"]
        assert (sub["msgOutCounter"], sub["bytesOutCounter"], sub["msgRateOut"]) == (10, 10 * size, 5.0)
        [consumer_stats] = sub["consumers"]
        assert (consumer_stats["msgOutCounter"], consumer_stats["msgRateOut"]) == (10, 5.0)
        topic.update_rates(start + 4.0)                                # a quiet interval
        assert topic_stats(topic)["msgRateIn"] == 0.0 and topic_stats(topic)["msgOutCounter"] == 10
        whole = partitioned_topic_stats(1, {T: topic})
        assert (whole["msgOutCounter"], whole["subscriptions"]["s"]["msgOutCounter"]) == (10, 10)


async def test_the_broker_updates_the_rates_every_stats_interval(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, stats_update_interval_s=0.05) as broker:
        producer = await broker.create_producer(T)
        topic = broker.service.topics[T]
        rounds = broker.service.stats_update.rounds
        await asyncio.gather(*(producer.send(b"m") for _ in range(50)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while topic_stats(topic)["msgRateIn"] == 0.0:
            assert loop.time() < deadline, "the rates were never updated"
            await asyncio.sleep(0.01)
        assert broker.service.stats_update.rounds > rounds


@pytest.mark.parametrize("interval", [0, -1, 86401, True, "60"])
def test_a_bad_stats_interval_is_refused(tmp_path, interval):
    with pytest.raises(ValueError, match="stats_update_interval_s"):
        BrokerConfig(data_dir=tmp_path, stats_update_interval_s=interval)
