"""An embedded Shared/Key_Shared consumer that asks for messages again (a negative ack, at once
or after its delay) while copies of them still sit in its receiver queue drops those copies,
giving their permits back, as the network client's `_drop_queued_entries` and the Java
client's removeExpiredMessagesFromQueue do: the broker sends them again, and kept, they were
handed to the application twice for one delivery (once from the old copy, once from the new,
with two different redelivery counts). A redeliver-all (Shared, Failover) drops the whole
queue, as before."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from pyengine.broker import Broker
from tests.broker.helpers import drain, publish_batch

T = "persistent://public/default/embedded-redelivery-drops-queued"
QUEUE = 10
DELAY_MS = 100


async def _queued(consumer, count: int) -> None:
    """Until `count` messages sit in the consumer's receiver queue (none handed out)."""
    for _ in range(500):
        if len(consumer._queue) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(consumer._queue)} messages queued, not {count}")


def _check_permits(consumer) -> None:
    """Everything received and nothing in flight: every permit of the receiver queue is the
    broker's, or waits here to be given back (none lost, none counted twice)."""
    assert not consumer._queue
    assert consumer._consumer.permits + consumer._consumed_since_flow == QUEUE


async def _subscribe(broker, consumer_type: str, delay_ms: int = DELAY_MS):
    return await broker.subscribe(T, "s", consumer_type=consumer_type, initial_position="earliest",
                                  receiver_queue_size=QUEUE, negative_ack_redelivery_delay_ms=delay_ms)


@pytest.mark.parametrize("consumer_type", ["shared", "key_shared"])
@pytest.mark.parametrize("delay_ms", [DELAY_MS, 0])
async def test_a_nack_of_queued_messages_hands_each_out_once(tmp_path, consumer_type, delay_ms):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await _subscribe(broker, consumer_type, delay_ms)
        ids = [await producer.send(b"m%d" % i, key="k%d" % (i % 2)) for i in range(5)]
        await _queued(consumer, 5)
        # Nacked by id while still queued (the ids send returned): the broker sends them again.
        await consumer.negative_acknowledge(ids[1])
        await consumer.negative_acknowledge(ids[3])
        await asyncio.sleep(delay_ms / 1000 + 0.2)
        got = await drain(consumer)
        assert Counter(m.data for m in got) == Counter(b"m%d" % i for i in range(5))      # each once
        counts = {m.data: m.redelivery_count for m in got}
        assert counts == {b"m0": 0, b"m1": 1, b"m2": 0, b"m3": 1, b"m4": 0}
        _check_permits(consumer)


@pytest.mark.parametrize("consumer_type", ["shared", "key_shared"])
async def test_a_second_nack_while_the_redelivered_copy_is_queued_hands_it_out_once(tmp_path, consumer_type):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await _subscribe(broker, consumer_type)
        await producer.send(b"m", key="k")
        first = await consumer.receive(timeout=5)
        await consumer.negative_acknowledge(first)
        await _queued(consumer, 1)                  # its redelivery, not received yet
        await consumer.negative_acknowledge(first)  # asked for again meanwhile
        await asyncio.sleep(DELAY_MS / 1000 + 0.2)
        got = await drain(consumer)
        assert [(m.data, m.redelivery_count) for m in got] == [(b"m", 2)]
        _check_permits(consumer)


@pytest.mark.parametrize("consumer_type", ["shared", "key_shared"])
async def test_a_nack_of_one_message_of_a_batch_drops_the_queued_rest_of_it(tmp_path, consumer_type):
    """The whole entry comes again: its other messages still queued must not come twice."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await _subscribe(broker, consumer_type)
        await publish_batch(broker, producer, [b"b0", b"b1", b"b2", b"b3"])
        await producer.send(b"after")
        first = await consumer.receive(timeout=5)
        assert first.data == b"b0"
        await _queued(consumer, 4)                  # b1..b3 and "after"
        await consumer.negative_acknowledge(first)
        await asyncio.sleep(DELAY_MS / 1000 + 0.2)
        got = await drain(consumer)
        assert Counter(m.data for m in got) == Counter([b"b0", b"b1", b"b2", b"b3", b"after"])
        counts = {m.data: m.redelivery_count for m in got}
        assert counts == {b"b0": 1, b"b1": 1, b"b2": 1, b"b3": 1, b"after": 0}
        _check_permits(consumer)


@pytest.mark.parametrize("consumer_type", ["shared", "key_shared", "failover"])
async def test_a_redeliver_all_with_messages_queued_hands_each_out_once(tmp_path, consumer_type):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await _subscribe(broker, consumer_type)
        for i in range(5):
            await producer.send(b"m%d" % i, key="k")
        handed = [await consumer.receive(timeout=5) for _ in range(2)]
        assert [m.data for m in handed] == [b"m0", b"m1"]
        await _queued(consumer, 3)
        await consumer.redeliver_unacknowledged_messages()
        got = await drain(consumer)
        assert sorted(m.data for m in got) == [b"m%d" % i for i in range(5)]              # each once
        if consumer_type != "failover":     # (a single active consumer's redeliveries carry no count)
            assert {m.redelivery_count for m in got} == {1}
        _check_permits(consumer)
