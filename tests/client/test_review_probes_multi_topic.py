"""Review probes of multi-topic consumers and of the receive waiters they share with
`Consumer`: a receive() cancelled just after a message woke it must pass the wake-up on (the
message must not sit in the queue while another receive() waits), and a topic with a backlog
must not keep the others out of a full buffer. seek() is as pulsar-client's on several topics;
redelivery brings a buffered message once, not twice; discovery outlives a broker outage."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter, deque

import pytest

from pyengine.client import MessageId, MultiTopicsConsumer

NS = "persistent://public/default"


async def _fill(client, topic: str, count: int) -> None:
    producer = await client.create_producer(topic, batching_enabled=False)
    for i in range(count):
        await producer.send(b"%d" % i)
    await producer.close()


async def test_a_cancelled_receive_passes_its_wake_up_on_one_topic(client):
    topic = f"{NS}/probe-wake-one"
    consumer = await client.subscribe(topic, "sub")
    first = asyncio.ensure_future(consumer.receive())
    second = asyncio.ensure_future(consumer.receive(timeout=3))
    await asyncio.sleep(0.05)                   # both wait
    push = consumer._push

    def push_then_cancel_the_woken(handler, message) -> None:
        push(handler, message)
        first.cancel()                          # woken, and cancelled before it runs
    consumer._push = push_then_cancel_the_woken
    producer = await client.create_producer(topic)
    await producer.send(b"only")
    assert (await second).data == b"only"
    assert first.cancelled()


class _CancelOnAppend(deque):
    """The buffer of a MultiTopicsConsumer that cancels a receive() once a message woke it
    (call_soon: after the wake-up, before the woken task runs)."""

    victim: asyncio.Future | None = None

    def append(self, item) -> None:
        super().append(item)
        if self.victim is not None:
            asyncio.get_running_loop().call_soon(self.victim.cancel)


async def test_a_cancelled_receive_passes_its_wake_up_on_several_topics(client):
    topics = [f"{NS}/probe-wake-a", f"{NS}/probe-wake-b"]
    consumer = await client.subscribe(topics, "sub")
    assert isinstance(consumer, MultiTopicsConsumer)
    buffer = consumer._buffer = _CancelOnAppend()
    first = asyncio.ensure_future(consumer.receive())
    second = asyncio.ensure_future(consumer.receive(timeout=3))
    await asyncio.sleep(0.05)
    buffer.victim = first
    producer = await client.create_producer(topics[1])
    await producer.send(b"only")
    assert (await second).data == b"only"
    assert first.cancelled()


async def test_a_topic_with_a_backlog_does_not_keep_the_others_out_of_a_full_buffer(client):
    topics = [f"{NS}/probe-fair-a", f"{NS}/probe-fair-b"]
    for topic in topics:
        await _fill(client, topic, 60)
    consumer = await client.subscribe(topics, "sub", initial_position="earliest", receiver_queue_size=5)
    got = Counter()
    for _ in range(40):
        message = await consumer.receive(timeout=5)
        got[message.topic] += 1
    # both topics have 60 waiting: neither may have all of the first 40
    assert min(got[t] for t in topics) >= 10, got


async def test_seek_moves_one_topic_by_a_message_id_and_every_topic_by_earliest_or_time(client):
    topics = [f"{NS}/probe-seek-a", f"{NS}/probe-seek-b"]
    for topic in topics:
        await _fill(client, topic, 3)
    consumer = await client.subscribe(topics, "sub", initial_position="earliest")
    received = [await consumer.receive(timeout=5) for _ in range(6)]
    for message in received:
        await consumer.acknowledge(message)
    first_of_a = next(m for m in received if m.topic == topics[0] and m.data == b"0")
    # as pulsar-client's: a received message's id moves its own topic only (whether the id
    # itself comes again is Consumer.seek's business: pulsar-client skips it)
    await consumer.seek(first_of_a.message_id)
    again = []
    while True:
        try:
            again.append(await consumer.receive(timeout=0.3))
        except TimeoutError:
            break
    assert {m.topic for m in again} == {topics[0]} and [m.data for m in again][-2:] == [b"1", b"2"]
    await consumer.seek(MessageId.earliest)
    assert Counter(m.topic for m in [await consumer.receive(timeout=5) for _ in range(6)]) == \
        {topics[0]: 3, topics[1]: 3}
    await consumer.seek(int(time.time() * 1000) + 60_000)    # after everything: nothing comes
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.3)


@pytest.mark.parametrize("target, error, says", [
    (MessageId(1, 2), TypeError, "does not name its topic"),
    (MessageId(1, 2, topic_name=f"{NS}/probe-seek-other"), ValueError, "not one of the topics"),
    ("0", TypeError, "seek takes a MessageId or a timestamp"),
    (True, TypeError, "seek takes a MessageId or a timestamp"),
])
async def test_seek_refuses_what_names_none_of_its_topics(client, target, error, says):
    consumer = await client.subscribe([f"{NS}/probe-seek-c", f"{NS}/probe-seek-d"], "sub")
    with pytest.raises(error, match=says):
        await consumer.seek(target)


async def test_redelivering_brings_each_message_once_more_not_twice(client):
    topics = [f"{NS}/probe-redeliver-a", f"{NS}/probe-redeliver-b"]
    for topic in topics:
        await _fill(client, topic, 10)
    consumer = await client.subscribe(topics, "sub", initial_position="earliest", receiver_queue_size=4)
    await consumer.receive(timeout=5)
    await asyncio.sleep(0.1)                    # the buffer and the topics' queues full
    await consumer.redeliver_unacknowledged_messages()
    got = Counter()
    while True:
        try:
            message = await consumer.receive(timeout=0.5)
        except TimeoutError:
            break
        got[(message.topic, message.data)] += 1
        await consumer.acknowledge(message)
    # every message once: what was buffered before comes again from its topic, not also from the buffer
    assert len(got) == 20 and set(got.values()) == {1}, got


async def test_discovery_goes_on_after_the_broker_was_down(client, broker):
    await _fill(client, f"{NS}/probe-down-1", 1)
    consumer = await client.subscribe(re.compile(f"{NS}/probe-down-.*"), "sub", initial_position="earliest",
                                      pattern_auto_discovery_period=0.1)
    assert (await consumer.receive(timeout=5)).data == b"0"
    await broker.stop()
    await asyncio.sleep(0.3)                    # discoveries fail meanwhile
    await broker.start()
    await _fill(client, f"{NS}/probe-down-2", 1)
    message = await consumer.receive(timeout=10)
    assert (message.topic, message.data) == (f"{NS}/probe-down-2", b"0")


async def test_receive_without_waiting_drains_what_the_topics_hold(client):
    topics = [f"{NS}/probe-drain-a", f"{NS}/probe-drain-b"]
    for topic in topics:
        await _fill(client, topic, 10)
    consumer = await client.subscribe(topics, "sub", initial_position="earliest", receiver_queue_size=10)
    for _ in range(200):                        # every message here: in the buffer or the topics' queues
        if len(consumer._buffer) + sum(c._queued_totals()[0] for c in consumer._consumers.values()) == 20:
            break
        await asyncio.sleep(0.01)
    got = []
    while True:
        try:
            got.append(await consumer.receive(timeout=0))
        except TimeoutError:
            break
    # as on one topic: timeout=0 ends the loop only when no message is there at all
    assert len(got) == 20
