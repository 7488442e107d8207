"""A MultiTopicsConsumer (a list of topics, a pattern) moves messages from its topics' consumers
into a buffer of its own ahead of the application. When a topic's Shared / Key_Shared consumer
asks for entries again (a negative ack, at once or after its delay; an ack timeout), it drops
its own queued copies of them (`Consumer._drop_queued_entries`, Java's
removeExpiredMessagesFromQueue); the copies already moved into the parent's buffer must go too,
or the application receives them twice for one delivery: once from the stale copy, once
redelivered (with two different redelivery counts). The same when a topic's consumer has
everything unacknowledged sent again: a nack on Exclusive / Failover, a reconnect. Over the
network here; the embedding API's is
tests/client/test_embedded_multi_topic_redelivery_drops_buffered_copies.py."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter

import pytest

from pyengine.client import MultiTopicsConsumer
from pyengine.client import consumer as consumer_module
from tests.client.conftest import drain, until_buffered

NS = "persistent://public/default"
P = f"{NS}/mt-redeliver-p"          # partitioned, 2 partitions
B = f"{NS}/mt-redeliver-b"
QUEUE = 6                           # the parent's buffer and each partition's receiver queue
DELAY_MS = 100


async def _subscribe(client, consumer_type: str = "shared", delay_ms: int = DELAY_MS, **options):
    consumer = await client.subscribe([P, B], "s", consumer_type=consumer_type, initial_position="earliest",
                                      receiver_queue_size=QUEUE, negative_ack_redelivery_delay_ms=delay_ms,
                                      **options)
    assert isinstance(consumer, MultiTopicsConsumer)
    return consumer


async def _check_permits(broker, consumer) -> None:
    """Everything received and acknowledged, nothing in flight: each partition's permits are
    the broker's, or wait on the client to be given back (none lost, none counted twice)."""
    for child in consumer._consumers.values():
        for handler in child._handlers.values():
            assert handler.queued == 0
            [on_broker] = broker.service.topics[handler.topic].subscriptions["s"].consumers
            for _ in range(100):
                if on_broker.permits + handler._consumed_since_flow == QUEUE:
                    break
                await asyncio.sleep(0.01)
            assert on_broker.permits + handler._consumed_since_flow == QUEUE, handler


async def _send_all(client, per_topic: int) -> dict[bytes, object]:
    """`per_topic` messages on each of P's two partitions and on B; their ids (naming their
    topic, as a received message's do) by payload."""
    ids = {}
    for name, partition in ((f"{P}-partition-0", 0), (f"{P}-partition-1", 1), (B, -1)):
        producer = await client.create_producer(name, batching_enabled=False)
        for i in range(per_topic):
            data = f"{name.rsplit('/', 1)[1]}:{i}".encode()
            sent = await producer.send(data)
            ids[data] = dataclasses.replace(sent, partition=partition, topic_name=name)
        await producer.close()
    return ids


@pytest.mark.parametrize("consumer_type", ["shared", "key_shared"])
@pytest.mark.parametrize("delay_ms", [DELAY_MS, 0])
async def test_a_nack_by_id_of_buffered_messages_hands_each_out_once(broker, client, consumer_type, delay_ms):
    await broker.service.policies.create_partitioned_topic(P, 2)
    ids = await _send_all(client, 4)                    # 12 messages: the parent buffers QUEUE of them
    consumer = await _subscribe(client, consumer_type, delay_ms)
    await until_buffered(consumer, QUEUE)
    first = await consumer.receive(timeout=5)
    await until_buffered(consumer, QUEUE)                    # refilled from behind
    # The received one, and by the ids send returned some not received yet: most of those
    # sit in the parent's buffer (the rest in a topic's receiver queue).
    buffered = [m.message_id for _, _, m in consumer._buffer]
    nacked = {first.data} | {data for data, mid in ids.items() if mid in buffered[1::2]}
    assert len(nacked) == 1 + len(buffered[1::2])
    for data in sorted(nacked):
        await consumer.negative_acknowledge(first if data == first.data else ids[data])
    await asyncio.sleep(delay_ms / 1000 + 0.1)
    got = await drain(consumer, timeout=0.5)
    # each once (the received one once more), with its redelivery count
    assert Counter(m.data for m in got) == Counter(list(ids))
    assert {m.data: m.redelivery_count for m in got} == {data: int(data in nacked) for data in ids}
    await _check_permits(broker, consumer)


@pytest.mark.parametrize("consumer_type", ["shared", "key_shared"])
async def test_a_second_nack_while_the_redelivered_copy_is_buffered_hands_it_out_once(broker, client,
                                                                                      consumer_type):
    await broker.service.policies.create_partitioned_topic(P, 2)
    consumer = await _subscribe(client, consumer_type)
    producer = await client.create_producer(B)
    await producer.send(b"m")
    first = await consumer.receive(timeout=5)
    await consumer.negative_acknowledge(first)
    await until_buffered(consumer, 1)                    # its redelivery, moved into the parent's buffer
    assert consumer._buffer[0][2].redelivery_count == 1
    await consumer.negative_acknowledge(first)      # asked for again meanwhile
    await asyncio.sleep(DELAY_MS / 1000 + 0.1)
    got = await drain(consumer, timeout=0.5)
    assert [(m.data, m.redelivery_count) for m in got] == [(b"m", 2)]
    await _check_permits(broker, consumer)


@pytest.mark.parametrize("delay_ms", [DELAY_MS, 0])
async def test_a_nack_of_one_message_of_a_batch_drops_the_buffered_rest_of_it(broker, client, delay_ms):
    """The whole entry comes again: its other messages in the parent's buffer must not come twice."""
    await broker.service.policies.create_partitioned_topic(P, 2)
    consumer = await _subscribe(client, "shared", delay_ms)
    producer = await client.create_producer(B, batching_enabled=True, batching_max_messages=4,
                                            batching_max_publish_delay_ms=1000)
    await asyncio.gather(*(producer.send(b"b%d" % i) for i in range(4)))
    await producer.send(b"after")
    first = await consumer.receive(timeout=5)
    assert first.data == b"b0"
    await until_buffered(consumer, 4)                    # b1..b3 and "after"
    await consumer.negative_acknowledge(first)
    await asyncio.sleep(delay_ms / 1000 + 0.1)
    got = await drain(consumer, timeout=0.5)
    assert Counter(m.data for m in got) == Counter([b"b0", b"b1", b"b2", b"b3", b"after"])
    counts = {m.data: m.redelivery_count for m in got}
    assert counts == {b"b0": 1, b"b1": 1, b"b2": 1, b"b3": 1, b"after": 0}
    await _check_permits(broker, consumer)


async def test_an_ack_timeout_of_one_message_of_a_batch_drops_the_buffered_rest_of_it(broker, client,
                                                                                       monkeypatch):
    """The topic's consumer asks for the entry again on its ack timeout: the same."""
    monkeypatch.setattr(consumer_module, "MIN_UNACKED_MESSAGES_TIMEOUT_MS", 1)
    await broker.service.policies.create_partitioned_topic(P, 2)
    consumer = await _subscribe(client, "shared", unacked_messages_timeout_ms=300)
    for child in consumer._consumers.values():
        child._unacked.tick_ms = 100               # not part of the API: C++'s tickDurationInMs
    producer = await client.create_producer(B, batching_enabled=True, batching_max_messages=4,
                                            batching_max_publish_delay_ms=1000)
    await asyncio.gather(*(producer.send(b"b%d" % i) for i in range(4)))
    first = await consumer.receive(timeout=5)      # not acknowledged: it times out
    assert first.data == b"b0"
    await until_buffered(consumer, 3)                    # b1..b3, not received before the timeout
    await asyncio.sleep(0.8)
    got = await drain(consumer, timeout=0.5)
    assert Counter(m.data for m in got) == Counter([b"b0", b"b1", b"b2", b"b3"])
    assert {m.redelivery_count for m in got} == {1}
    await _check_permits(broker, consumer)


def _in_order_once(got, ids) -> None:
    """Each message once, and each topic's in the order it was sent."""
    assert Counter(m.data for m in got) == Counter(list(ids))
    for name in {data.split(b":")[0] for data in ids}:
        mine = [m.data for m in got if m.data.split(b":")[0] == name]
        assert mine == sorted(mine, key=lambda data: int(data.split(b":")[1])), mine


@pytest.mark.parametrize("consumer_type", ["exclusive", "failover"])
@pytest.mark.parametrize("delay_ms", [DELAY_MS, 0])
async def test_a_nack_on_a_single_consumer_subscription_hands_the_buffered_messages_out_once(
        broker, client, consumer_type, delay_ms):
    """There a nack asks for everything unacknowledged again, in order (the topic's consumer
    drops its whole queue): the parent's copies of that topic go too."""
    await broker.service.policies.create_partitioned_topic(P, 2)
    ids = await _send_all(client, 4)
    consumer = await _subscribe(client, consumer_type, delay_ms)
    await until_buffered(consumer, QUEUE)
    first = await consumer.receive(timeout=5)
    await until_buffered(consumer, QUEUE)
    topic_of_first = first.topic
    assert any(m.topic == topic_of_first for _, _, m in consumer._buffer)
    await consumer.negative_acknowledge(first)
    await asyncio.sleep(delay_ms / 1000 + 0.1)
    got = await drain(consumer, timeout=0.5)
    _in_order_once(got, ids)
    await _check_permits(broker, consumer)


async def test_a_reconnect_drops_the_buffered_messages_the_broker_sends_again(broker, client):
    """A topic's consumer that connects again gets everything unacknowledged again: the copies
    in the parent's buffer are of the old delivery."""
    await broker.service.policies.create_partitioned_topic(P, 2)
    ids = await _send_all(client, 4)
    consumer = await _subscribe(client, "exclusive")
    await until_buffered(consumer, QUEUE)
    received = [await consumer.receive(timeout=5) for _ in range(2)]
    for message in received:
        await consumer.acknowledge(message)
    await until_buffered(consumer, QUEUE)
    _, handler, _ = consumer._buffer[0]
    old = handler.connection
    old.close()                         # the connection drops: the consumers connect again
    for _ in range(500):
        if handler.connection not in (None, old):
            break
        await asyncio.sleep(0.01)
    assert handler.connection not in (None, old)
    await asyncio.sleep(0.3)            # the broker sends the unacknowledged again
    got = received + await drain(consumer, timeout=1.0)
    _in_order_once(got, ids)
    await _check_permits(broker, consumer)
