"""Which consumer gets what, as Pulsar (found by an audit):

* Shared: the consumers of the highest priority (the lowest priority level) are served first,
  round-robin among them; a lower level only when none of them has permits
  (AbstractDispatcherMultipleConsumers.getNextConsumer). Before, every consumer took turns.
* Failover: the active consumer is one of the highest priority only; a partition's is picked
  among them by its index, a non-partitioned topic's on a hash ring of their names by the
  topic's hash (pickAndScheduleActiveConsumer, Pulsar >= 3.0). Before, a lower-priority
  consumer could be active, and a non-partitioned topic always went to the first name."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker

from .helpers import drain, pulsar_failover_pick

T = "persistent://public/default/priority"


async def test_shared_serves_the_highest_priority_first_and_lower_ones_when_it_is_full(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        low = await broker.subscribe(T, "s", consumer_type="shared", consumer_name="low", priority=1)
        high = [await broker.subscribe(T, "s", consumer_type="shared", consumer_name=f"high-{i}", priority=0,
                                       receiver_queue_size=3) for i in range(2)]
        for i in range(4):
            await producer.send(b"m%d" % i)
        await asyncio.sleep(0.1)
        assert [len(await drain(c, timeout=0.2)) for c in high] == [2, 2]       # round-robin among them
        assert await drain(low, timeout=0.2) == []
        for i in range(4, 12):
            await producer.send(b"m%d" % i)
        await asyncio.sleep(0.1)
        # each high one takes what its receiver queue has room for (3 permits), the rest goes low
        got_low = await drain(low, timeout=0.2)
        assert [len(await drain(c, timeout=0.2)) for c in high] == [3, 3] and len(got_low) == 2


async def test_a_partition_goes_to_a_consumer_of_the_highest_priority(tmp_path):
    partition = T + "-partition-1"
    async with Broker.embedded(tmp_path, sync=False) as broker:
        high = await broker.subscribe(partition, "s", consumer_type="failover", consumer_name="b", priority=0)
        low = await broker.subscribe(partition, "s", consumer_type="failover", consumer_name="a", priority=1)
        assert high.active and not low.active          # not partition 1 % 2 of all of them


@pytest.mark.parametrize("suffix", range(6))
async def test_a_non_partitioned_topic_goes_to_pulsars_pick_on_the_ring(tmp_path, suffix):
    topic = f"{T}-ring-{suffix}"
    names = ["a", "b", "c"]
    # The pick is under test, not the handover delay (test_failover_handover_delay.py): none.
    async with Broker.embedded(tmp_path, sync=False, active_consumer_failover_delay_time_ms=0) as broker:
        consumers = {name: await broker.subscribe(topic, "s", consumer_type="failover", consumer_name=name)
                     for name in names}
        assert {name for name, c in consumers.items() if c.active} == {pulsar_failover_pick(topic, names)}
        low = await broker.subscribe(topic, "s", consumer_type="failover", consumer_name="0", priority=5)
        assert not low.active
