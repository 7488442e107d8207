"""An embedded multi-topic consumer (`pyengine.client.pattern.MultiTopicsConsumer` over embedded
consumers) moves messages from its topics' consumers into a buffer of its own ahead of the
application. When a topic's Shared / Key_Shared consumer asks for entries again (a negative
ack, at once or after its delay), it drops its own queued copies of them
(`EmbeddedConsumer._drop_queued_entries`); the copies already moved into the parent's buffer
must go too, or the application receives them twice for one delivery (once from the stale copy,
once redelivered). The network client's: tests/client/test_multi_topic_redelivery_drops_buffered_copies.py."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter

import pytest

from pyengine.broker import Broker
from pyengine.client import MultiTopicsConsumer
from tests.broker.helpers import publish_batch
from tests.client.conftest import drain, until_buffered

NS = "persistent://public/default"
PT = f"{NS}/embedded-mt-redeliver-p"        # partitioned, 2 partitions: a list of both and of B
B = f"{NS}/embedded-mt-redeliver-b"
TOPICS = [f"{PT}-partition-0", f"{PT}-partition-1", B]
QUEUE = 6                                   # the parent's buffer and each topic's receiver queue
DELAY_MS = 100


async def _subscribe(broker, consumer_type: str = "shared", delay_ms: int = DELAY_MS):
    await broker.service.policies.create_partitioned_topic(PT, 2)
    consumer = await broker.subscribe(TOPICS, "s", consumer_type=consumer_type, initial_position="earliest",
                                      receiver_queue_size=QUEUE, negative_ack_redelivery_delay_ms=delay_ms)
    assert isinstance(consumer, MultiTopicsConsumer)
    return consumer


def _check_permits(consumer) -> None:
    """Everything received, nothing in flight: each topic's permits are the broker's, or wait
    here to be given back (none lost, none counted twice)."""
    assert not consumer._buffer
    for child in consumer._consumers.values():
        assert not child._queue
        assert child._consumer.permits + child._consumed_since_flow == QUEUE, child.topic


def _key(message_id) -> tuple[str, int, int]:
    return message_id.topic_name, message_id.ledger_id, message_id.entry_id


@pytest.mark.parametrize("consumer_type", ["shared", "key_shared"])
@pytest.mark.parametrize("delay_ms", [DELAY_MS, 0])
async def test_a_nack_by_id_of_buffered_messages_hands_each_out_once(tmp_path, consumer_type, delay_ms):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await _subscribe(broker, consumer_type, delay_ms)
        ids = {}                                # 12 messages: the parent buffers QUEUE of them
        for name in TOPICS:
            producer = await broker.create_producer(name)
            for i in range(4):
                data = f"{name.rsplit('/', 1)[1]}:{i}".encode()
                ids[data] = dataclasses.replace(await producer.send(data, key=f"k{i}"), topic_name=name)
        await until_buffered(consumer, QUEUE)
        first = await consumer.receive(timeout=5)
        await until_buffered(consumer, QUEUE)        # refilled from behind
        # The received one, and by the ids send returned (naming their topic, as a received
        # message's do) some not received yet: most of those sit in the parent's buffer.
        buffered = {_key(m.message_id) for _, _, m in list(consumer._buffer)[1::2]}
        nacked = {first.data} | {data for data, mid in ids.items() if _key(mid) in buffered}
        assert len(nacked) == 1 + len(buffered)
        for data in sorted(nacked):
            await consumer.negative_acknowledge(first if data == first.data else ids[data])
        await asyncio.sleep(delay_ms / 1000 + 0.1)
        got = await drain(consumer, timeout=0.3)
        # each once (the received one once more), with its redelivery count
        assert Counter(m.data for m in got) == Counter(list(ids))
        assert {m.data: m.redelivery_count for m in got} == {data: int(data in nacked) for data in ids}
        _check_permits(consumer)


@pytest.mark.parametrize("consumer_type", ["shared", "key_shared"])
async def test_a_second_nack_while_the_redelivered_copy_is_buffered_hands_it_out_once(tmp_path, consumer_type):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await _subscribe(broker, consumer_type)
        producer = await broker.create_producer(B)
        await producer.send(b"m", key="k")
        first = await consumer.receive(timeout=5)
        await consumer.negative_acknowledge(first)
        await until_buffered(consumer, 1)                # its redelivery, moved into the parent's buffer
        assert consumer._buffer[0][2].redelivery_count == 1
        await consumer.negative_acknowledge(first)  # asked for again meanwhile
        await asyncio.sleep(DELAY_MS / 1000 + 0.1)
        got = await drain(consumer, timeout=0.3)
        assert [(m.data, m.redelivery_count) for m in got] == [(b"m", 2)]
        _check_permits(consumer)


@pytest.mark.parametrize("consumer_type", ["shared", "key_shared"])
@pytest.mark.parametrize("delay_ms", [DELAY_MS, 0])
async def test_a_nack_of_one_message_of_a_batch_drops_the_buffered_rest_of_it(tmp_path, consumer_type, delay_ms):
    """The whole entry comes again: its other messages in the parent's buffer must not come twice."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await _subscribe(broker, consumer_type, delay_ms)
        producer = await broker.create_producer(B)
        await publish_batch(broker, producer, [b"b0", b"b1", b"b2", b"b3"])
        await producer.send(b"after")
        first = await consumer.receive(timeout=5)
        assert first.data == b"b0"
        await until_buffered(consumer, 4)                # b1..b3 and "after"
        await consumer.negative_acknowledge(first)
        await asyncio.sleep(delay_ms / 1000 + 0.1)
        got = await drain(consumer, timeout=0.3)
        assert Counter(m.data for m in got) == Counter([b"b0", b"b1", b"b2", b"b3", b"after"])
        counts = {m.data: m.redelivery_count for m in got}
        assert counts == {b"b0": 1, b"b1": 1, b"b2": 1, b"b3": 1, b"after": 0}
        _check_permits(consumer)


@pytest.mark.parametrize("consumer_type", ["exclusive", "failover"])
@pytest.mark.parametrize("delay_ms", [DELAY_MS, 0])
async def test_a_nack_on_a_single_consumer_subscription_hands_the_buffered_messages_out_once(
        tmp_path, consumer_type, delay_ms):
    """There a nack asks for everything unacknowledged again, in order (the topic's consumer
    drops its whole queue): the parent's copies of that topic go too."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await _subscribe(broker, consumer_type, delay_ms)
        sent = []
        for name in TOPICS:
            producer = await broker.create_producer(name)
            for i in range(4):
                data = f"{name.rsplit('/', 1)[1]}:{i}".encode()
                await producer.send(data)
                sent.append(data)
        await until_buffered(consumer, QUEUE)
        first = await consumer.receive(timeout=5)
        await until_buffered(consumer, QUEUE)
        assert any(m.topic == first.topic for _, _, m in consumer._buffer)
        await consumer.negative_acknowledge(first)
        await asyncio.sleep(delay_ms / 1000 + 0.1)
        got = await drain(consumer, timeout=0.3)
        assert Counter(m.data for m in got) == Counter(sent)
        for name in TOPICS:
            prefix = name.rsplit("/", 1)[1].encode() + b":"
            mine = [m.data for m in got if m.data.startswith(prefix)]
            assert mine == [data for data in sent if data.startswith(prefix)]
        _check_permits(consumer)
