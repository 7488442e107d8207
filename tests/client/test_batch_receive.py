"""batch_receive() with a batch_receive_policy, as pulsar-client's (the C++ BatchReceivePolicy):
a batch ends at `max_num_message` messages or `max_num_bytes` bytes queued, or at `timeout_ms`
(then with what is queued: maybe nothing); on one topic and on several."""

from __future__ import annotations

import asyncio
import time

import pulsar
import pytest

from pyengine.client import AlreadyClosedError, Client, ConsumerBatchReceivePolicy
from pyengine.client.consumer import ConsumerOptions, check_batch_receive_policy

NS = "persistent://public/default"
TOPIC = f"{NS}/batch-receive"


async def subscribe_with_policy(client: Client, topic, subscription: str, policy: ConsumerBatchReceivePolicy,
                                **kwargs):
    return await client.subscribe(topic, subscription, batch_receive_policy=policy, **kwargs)


async def wait_queued(consumer, count: int) -> None:
    """Until `count` messages are in the consumer's receiver queue (sent messages travel)."""
    for _ in range(500):
        if consumer._queued_totals()[0] >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} messages never queued")


async def test_a_batch_ends_at_max_num_message_before_the_timeout(client):
    consumer = await subscribe_with_policy(client, TOPIC, "by-count", ConsumerBatchReceivePolicy(3, -1, 10_000))
    producer = await client.create_producer(TOPIC)
    pending = asyncio.ensure_future(consumer.batch_receive())
    started = time.monotonic()
    for i in range(3):
        await producer.send(b"%d" % i)
    batch = await asyncio.wait_for(pending, 5)
    assert [m.data for m in batch] == [b"0", b"1", b"2"] and time.monotonic() - started < 5
    for i in range(3, 8):
        await producer.send(b"%d" % i)
    await wait_queued(consumer, 5)
    assert [m.data for m in await consumer.batch_receive()] == [b"3", b"4", b"5"]    # at most 3
    for message in batch:
        await consumer.acknowledge(message)


async def test_a_batch_ends_at_max_num_bytes_and_holds_at_least_one_message(client):
    consumer = await subscribe_with_policy(client, TOPIC, "by-bytes", ConsumerBatchReceivePolicy(-1, 250, 10_000))
    producer = await client.create_producer(TOPIC)
    for i in range(5):
        await producer.send(bytes([i]) * 100)
    await wait_queued(consumer, 5)
    # 300 bytes would be over 250: two messages a batch
    assert [m.data[0] for m in await consumer.batch_receive()] == [0, 1]
    assert [m.data[0] for m in await consumer.batch_receive()] == [2, 3]
    await producer.send(b"x" * 400)       # over the limit by itself: a batch of its own, not a hang
    batch = await asyncio.wait_for(consumer.batch_receive(), 5)
    assert [len(m.data) for m in batch] == [100]
    batch = await asyncio.wait_for(consumer.batch_receive(), 5)
    assert [len(m.data) for m in batch] == [400]


async def test_at_the_timeout_a_batch_has_what_is_queued_or_nothing(client):
    consumer = await subscribe_with_policy(client, TOPIC, "by-time", ConsumerBatchReceivePolicy(100, -1, 200))
    producer = await client.create_producer(TOPIC)
    await producer.send(b"a")
    await producer.send(b"b")
    await wait_queued(consumer, 2)
    started = time.monotonic()
    assert [m.data for m in await consumer.batch_receive()] == [b"a", b"b"]
    assert time.monotonic() - started >= 0.15               # waited for more, up to the timeout
    started = time.monotonic()
    assert await consumer.batch_receive() == []
    assert 0.15 <= time.monotonic() - started < 2


async def test_batch_receive_of_batched_messages(client):
    consumer = await subscribe_with_policy(client, TOPIC, "batched", ConsumerBatchReceivePolicy(4, -1, 300),
                                           consumer_type="shared")
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=5,
                                            batching_max_publish_delay_ms=1000)
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(10)))
    batches = [await consumer.batch_receive() for _ in range(3)]
    assert [len(b) for b in batches] == [4, 4, 2]
    received = [m for batch in batches for m in batch]
    assert [m.data for m in received] == [b"%d" % i for i in range(10)]
    assert {m.message_id.batch_size for m in received} == {5}
    for message in received[:9]:
        await consumer.acknowledge(message)
    await consumer.redeliver_unacknowledged_messages()
    assert [m.data for m in await consumer.batch_receive()] == [b"9"]       # acked by index


async def test_batch_receive_on_several_topics(client):
    topics = [f"{NS}/batch-multi-a", f"{NS}/batch-multi-b"]
    consumer = await subscribe_with_policy(client, topics, "multi", ConsumerBatchReceivePolicy(4, -1, 300))
    for topic in topics:
        producer = await client.create_producer(topic)
        for i in range(3):
            await producer.send(f"{topic[-1]}{i}".encode())
    first = await consumer.batch_receive()
    second = await consumer.batch_receive()
    assert len(first) == 4 and len(second) == 2
    assert {m.data for m in first + second} == {b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"}
    assert await consumer.batch_receive() == []
    for message in first + second:
        await consumer.acknowledge(message)
    await consumer.redeliver_unacknowledged_messages()
    assert await consumer.batch_receive() == []


async def test_closing_ends_a_waiting_batch_receive(client):
    consumer = await subscribe_with_policy(client, TOPIC, "closing", ConsumerBatchReceivePolicy(10, -1, 0))
    pending = asyncio.ensure_future(consumer.batch_receive())     # no timeout: waits for 10
    await asyncio.sleep(0.05)
    await consumer.close()
    with pytest.raises(AlreadyClosedError):
        await asyncio.wait_for(pending, 5)


def test_the_policy_follows_the_cpp_client():
    default = ConsumerBatchReceivePolicy()
    assert (default.max_num_message, default.max_num_bytes, default.timeout_ms) == (-1, 10 * 1024 * 1024, 100)
    # neither size limit: the C++ client takes the defaults for both
    only_timeout = ConsumerBatchReceivePolicy(-1, -1, 123)
    assert (only_timeout.max_num_message, only_timeout.max_num_bytes, only_timeout.timeout_ms) == (
        -1, 10 * 1024 * 1024, 123)
    assert ConsumerBatchReceivePolicy(5, 0, 0).max_num_message == 5        # no timeout: waits for 5
    assert ConsumerOptions("s").batch_receive_policy == default
    theirs = check_batch_receive_policy(pulsar.ConsumerBatchReceivePolicy(7, 1000, 50))
    assert theirs == ConsumerBatchReceivePolicy(7, 1000, 50)


@pytest.mark.parametrize("args, error", [
    ((-1, -1, -1), ValueError),        # no limit at all
    ((0, 0, 0), ValueError),
    (("3", -1, 100), TypeError),
    ((3, 1.5, 100), TypeError),
    ((3, -1, None), TypeError),
    ((True, -1, 100), TypeError),
])
def test_malformed_policies_are_refused(args, error):
    with pytest.raises(error):
        ConsumerBatchReceivePolicy(*args)


@pytest.mark.parametrize("value", ["3", (3, -1, 100), 3])
def test_a_batch_receive_policy_of_another_type_is_refused(value):
    with pytest.raises(TypeError, match="batch_receive_policy"):
        ConsumerOptions("s", batch_receive_policy=value)


async def test_a_full_receiver_queue_ends_a_batch_without_timeout(client):
    # max_num_message above what the receiver queue holds: the batch would never end otherwise
    consumer = await subscribe_with_policy(client, TOPIC, "full", ConsumerBatchReceivePolicy(10, -1, 0),
                                           receiver_queue_size=3)
    producer = await client.create_producer(TOPIC)
    for i in range(5):
        await producer.send(b"%d" % i)
    batch = await asyncio.wait_for(consumer.batch_receive(), 5)
    assert [m.data for m in batch] == [b"0", b"1", b"2"]


async def test_a_full_buffer_ends_a_batch_on_several_topics(client):
    topics = [f"{NS}/batch-full-a", f"{NS}/batch-full-b"]
    consumer = await subscribe_with_policy(client, topics, "full", ConsumerBatchReceivePolicy(10, -1, 0),
                                           receiver_queue_size=3)
    producer = await client.create_producer(topics[0])
    for i in range(5):
        await producer.send(b"%d" % i)
    batch = await asyncio.wait_for(consumer.batch_receive(), 5)
    assert [m.data for m in batch] == [b"0", b"1", b"2"]
