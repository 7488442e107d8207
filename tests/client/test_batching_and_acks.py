"""Batching producers, batch-index acks, negative acks, redelivery counts, subscription types."""

import asyncio

import pytest

from pyengine.client import CumulativeAcknowledgementNotAllowedError

TOPIC = "persistent://public/default/batches"


async def test_a_batch_is_one_entry_with_one_id_per_message(client):
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=5,
                                            batching_max_publish_delay_ms=1000)
    consumer = await client.subscribe(TOPIC, "sub", initial_position="earliest")
    ids = await asyncio.gather(*(producer.send(b"b-%d" % i, key=f"k{i}") for i in range(5)))
    assert len({(i.ledger_id, i.entry_id) for i in ids}) == 1
    assert [i.batch_index for i in ids] == list(range(5)) and {i.batch_size for i in ids} == {5}
    received = [await consumer.receive(timeout=5) for _ in range(5)]
    assert [m.message_id for m in received] == ids
    assert [m.data for m in received] == [b"b-%d" % i for i in range(5)]
    assert [m.partition_key for m in received] == [f"k{i}" for i in range(5)]
    assert [m.sequence_id for m in received] == list(range(5))


async def test_a_batch_goes_out_after_its_delay(client):
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=100,
                                            batching_max_publish_delay_ms=20)
    message_id = await asyncio.wait_for(producer.send(b"alone"), 2)
    assert message_id.batch_index == 0 and message_id.batch_size == 1


async def test_flush_sends_the_open_batch(client):
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=100,
                                            batching_max_publish_delay_ms=60_000)
    futures = [producer.send_async(b"%d" % i) for i in range(3)]
    await asyncio.wait_for(producer.flush(), 2)
    assert all(f.done() for f in futures) and {f.result().batch_size for f in futures} == {3}


async def test_batch_index_acks_redeliver_only_the_unacked_messages(client):
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=5,
                                            batching_max_publish_delay_ms=1000)
    consumer = await client.subscribe(TOPIC, "index", initial_position="earliest")
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(5)))
    received = [await consumer.receive(timeout=5) for _ in range(5)]
    await consumer.acknowledge(received[0])
    await consumer.acknowledge(received[1])
    await consumer.acknowledge(received[3])
    await asyncio.sleep(0.05)
    await consumer.redeliver_unacknowledged_messages()
    again = [await consumer.receive(timeout=5) for _ in range(2)]
    assert [m.data for m in again] == [b"2", b"4"]
    # Count 0: Pulsar's single-active-consumer dispatcher counts no redeliveries.
    assert all(m.redelivery_count == 0 for m in again)


async def test_without_batch_index_acks_a_batch_is_acked_when_complete(client):
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=3,
                                            batching_max_publish_delay_ms=1000)
    consumer = await client.subscribe(TOPIC, "whole", initial_position="earliest", batch_index_ack_enabled=False)
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(6)))
    received = [await consumer.receive(timeout=5) for _ in range(6)]
    for message in received[:4]:              # the first batch entirely, one of the second
        await consumer.acknowledge(message)
    await asyncio.sleep(0.05)
    await consumer.redeliver_unacknowledged_messages()
    assert [(await consumer.receive(timeout=5)).data for _ in range(3)] == [b"3", b"4", b"5"]


async def test_negative_ack_redelivers_after_the_delay_with_a_count(client):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "nack", consumer_type="shared", initial_position="earliest",
                                      negative_ack_redelivery_delay_ms=100)
    for i in range(3):
        await producer.send(b"%d" % i)
    received = [await consumer.receive(timeout=5) for _ in range(3)]
    await consumer.negative_acknowledge(received[1])
    for message in (received[0], received[2]):
        await consumer.acknowledge(message)
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.05)      # not before the delay
    again = await consumer.receive(timeout=5)
    assert again.data == b"1" and again.redelivery_count == 1


async def test_negative_ack_on_an_exclusive_subscription(client):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "nack-x", initial_position="earliest",
                                      negative_ack_redelivery_delay_ms=50)
    await producer.send(b"a")
    first = await consumer.receive(timeout=5)
    await consumer.negative_acknowledge(first)
    again = await consumer.receive(timeout=5)
    # Count 0: Pulsar's single-active-consumer dispatcher counts no redeliveries.
    assert again.message_id == first.message_id and again.redelivery_count == 0


async def test_cumulative_ack_is_refused_on_shared_subscriptions(client):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "shared", consumer_type="shared", initial_position="earliest")
    await producer.send(b"x")
    message = await consumer.receive(timeout=5)
    with pytest.raises(CumulativeAcknowledgementNotAllowedError):
        await consumer.acknowledge_cumulative(message)


async def test_cumulative_ack_inside_a_batch_keeps_the_rest_of_it(client):
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=3,
                                            batching_max_publish_delay_ms=1000)
    consumer = await client.subscribe(TOPIC, "cum", initial_position="earliest")
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(6)))
    received = [await consumer.receive(timeout=5) for _ in range(6)]
    # All of batch one and, with batch-index acks (as the C++ client), batch two up to it.
    await consumer.acknowledge_cumulative(received[4])
    await asyncio.sleep(0.05)
    await consumer.close()
    again = await client.subscribe(TOPIC, "cum")
    assert (await again.receive(timeout=5)).data == b"5"
    with pytest.raises(TimeoutError):
        await again.receive(timeout=0.3)


async def test_shared_consumers_split_the_messages(client):
    producer = await client.create_producer(TOPIC)
    first = await client.subscribe(TOPIC, "split", consumer_type="shared", receiver_queue_size=5)
    second = await client.subscribe(TOPIC, "split", consumer_type="shared", receiver_queue_size=5)
    for i in range(40):
        producer.send_async(b"%d" % i)
    await producer.flush()
    got = []

    async def drain(consumer):
        while True:
            try:
                message = await consumer.receive(timeout=0.5)
            except TimeoutError:
                return
            got.append((consumer, int(message.data)))
            await consumer.acknowledge(message)
    await asyncio.gather(drain(first), drain(second))
    assert sorted(n for _, n in got) == list(range(40))
    assert {c for c, _ in got} == {first, second}


async def test_failover_has_one_active_consumer(client):
    first = await client.subscribe(TOPIC, "fo", consumer_type="failover", consumer_name="a")
    second = await client.subscribe(TOPIC, "fo", consumer_type="failover", consumer_name="b")
    await asyncio.sleep(0.1)
    assert [first.active, second.active].count(True) == 1


async def test_key_shared_keeps_a_key_on_one_consumer(client):
    producer = await client.create_producer(TOPIC)
    consumers = [await client.subscribe(TOPIC, "ks", consumer_type="key_shared") for _ in range(2)]
    for i in range(30):
        producer.send_async(b"%d" % i, key=f"key-{i % 4}")
    await producer.flush()
    owner = {}

    async def drain(consumer):
        while True:
            try:
                message = await consumer.receive(timeout=0.5)
            except TimeoutError:
                return
            assert owner.setdefault(message.partition_key, consumer) is consumer
            await consumer.acknowledge(message)
    await asyncio.gather(*(drain(c) for c in consumers))
    assert len(owner) == 4
