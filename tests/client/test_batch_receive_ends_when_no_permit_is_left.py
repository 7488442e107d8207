"""batch_receive() without a timeout ends once the receiver queue holds every message the
broker may still send (found by an audit): it waited for max_num_message messages for ever
when the queue could not reach it - messages taken by receive() whose permits were not given
back yet (under half a queue), or partitions whose queues are cut to
max_total_receiver_queue_size_across_partitions / partitions."""

from __future__ import annotations

import asyncio

from pyengine.client import ConsumerBatchReceivePolicy

NS = "persistent://public/default"


async def test_a_batch_after_some_receives_takes_what_the_permits_allow(client):
    topic = f"{NS}/batch-after-receives"
    consumer = await client.subscribe(topic, "sub", receiver_queue_size=10,
                                      batch_receive_policy=ConsumerBatchReceivePolicy(10, -1, 0))
    producer = await client.create_producer(topic)
    for i in range(30):
        await producer.send(b"%d" % i)
    # 4 taken: under half the queue, their permits are not given back; 6 stay queued, no more come
    received = [await consumer.receive(timeout=5) for _ in range(4)]
    batch = await asyncio.wait_for(consumer.batch_receive(), 5)
    assert [m.data for m in received + batch] == [b"%d" % i for i in range(10)]
    # the batch gave the permits back: the next batch is a full one
    batch = await asyncio.wait_for(consumer.batch_receive(), 5)
    assert [m.data for m in batch] == [b"%d" % i for i in range(10, 20)]


async def test_a_batch_on_partitions_whose_queues_add_up_to_less_than_the_queue_size(client, broker):
    topic = f"{NS}/batch-small-queues-of-partitions"
    await broker.service.policies.create_partitioned_topic(topic, 3)
    consumer = await client.subscribe(topic, "sub", receiver_queue_size=10,
                                      max_total_receiver_queue_size_across_partitions=6,
                                      batch_receive_policy=ConsumerBatchReceivePolicy(10, -1, 0))
    producer = await client.create_producer(topic)
    for i in range(30):
        await producer.send(b"%d" % i)
    batch = await asyncio.wait_for(consumer.batch_receive(), 5)
    assert len(batch) == 6                  # 2 a partition: all the broker may send for now
