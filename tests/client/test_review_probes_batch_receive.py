"""Review probes of batch_receive(): the C++ client caps max_num_message at the receiver queue
size (ConsumerImplBase), so a partitioned topic whose partitions together queue that many ends a
batch even when no single partition's queue is full; a batch_receive() cancelled while waiting
takes nothing, and one racing receive() callers loses and duplicates nothing; max_num_bytes
counts the payload as received (uncompressed)."""

from __future__ import annotations

import asyncio

from pyengine.client import ConsumerBatchReceivePolicy

NS = "persistent://public/default"


async def test_max_num_message_is_capped_at_the_receiver_queue_size_on_a_partitioned_topic(client, broker):
    topic = f"{NS}/probe-batch-partitioned"
    await broker.service.policies.create_partitioned_topic(topic, 3)
    consumer = await client.subscribe(topic, "sub", receiver_queue_size=10,
                                      batch_receive_policy=ConsumerBatchReceivePolicy(100, -1, 0))
    for partition in range(3):
        producer = await client.create_producer(f"{topic}-partition-{partition}")
        for i in range(5):
            await producer.send(b"%d-%d" % (partition, i))
    # 15 queued, 5 a partition: more than the receiver queue size, no partition's queue full
    batch = await asyncio.wait_for(consumer.batch_receive(), 5)
    assert len(batch) == 10


def test_the_capped_policy_keeps_bytes_and_timeout():
    policy = ConsumerBatchReceivePolicy(100, 5000, 20).within(10)
    assert (policy.max_num_message, policy.max_num_bytes, policy.timeout_ms) == (10, 5000, 20)
    unchanged = ConsumerBatchReceivePolicy(-1, 5000, 20)
    assert unchanged.within(10) is unchanged


async def test_a_cancelled_batch_receive_and_racing_receivers_lose_nothing(client):
    topic = f"{NS}/probe-batch-race"
    consumer = await client.subscribe(topic, "sub", consumer_type="shared",
                                      batch_receive_policy=ConsumerBatchReceivePolicy(3, -1, 300))
    cancelled = asyncio.ensure_future(consumer.batch_receive())
    await asyncio.sleep(0.05)
    cancelled.cancel()
    receivers = [asyncio.ensure_future(consumer.receive(timeout=5)) for _ in range(2)]
    batches = [asyncio.ensure_future(consumer.batch_receive()) for _ in range(2)]
    producer = await client.create_producer(topic, batching_enabled=False)
    for i in range(8):
        await producer.send(b"%d" % i)
    got = [m.data for m in await asyncio.gather(*receivers)]
    got += [m.data for batch in await asyncio.wait_for(asyncio.gather(*batches), 5) for m in batch]
    while True:
        try:
            got.append((await consumer.receive(timeout=0.3)).data)
        except TimeoutError:
            break
    assert sorted(got) == sorted(b"%d" % i for i in range(8))


async def test_max_num_bytes_counts_the_uncompressed_payload_of_compressed_batches(client):
    topic = f"{NS}/probe-batch-compressed"
    consumer = await client.subscribe(topic, "sub", batch_receive_policy=ConsumerBatchReceivePolicy(-1, 250, 300))
    producer = await client.create_producer(topic, compression_type="lz4", batching_enabled=True,
                                            batching_max_publish_delay_ms=60_000)
    sends = [producer.send_async(bytes([i]) * 100) for i in range(5)]
    await producer.flush()
    await asyncio.gather(*sends)            # one entry of 5 x 100 bytes, a few bytes compressed
    sizes = [[len(m.data) for m in await asyncio.wait_for(consumer.batch_receive(), 5)] for _ in range(3)]
    assert sizes == [[100, 100], [100, 100], [100]]       # as the C++ client's msg.getLength()
