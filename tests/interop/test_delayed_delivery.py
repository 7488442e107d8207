"""Delayed delivery with the official `pulsar-client` (3.13, the C++ client) against a
`pyengine serve` child process: `send(..., deliver_after=...)` / `deliver_at=` sets
MessageMetadata.deliver_at_time; a Shared subscription receives the message at its time
while other messages flow at once; an Exclusive one receives it at once (Pulsar ignores the
delay there). The C++ client never batches a delayed message (ProducerImpl::canAddToBatch)."""

from __future__ import annotations

import time
from datetime import timedelta

import pulsar
import pytest

NS = "persistent://public/default"


def receive_or_none(consumer: pulsar.Consumer, timeout_ms: int) -> pulsar.Message | None:
    try:
        return consumer.receive(timeout_millis=timeout_ms)
    except pulsar.Timeout:
        return None


@pytest.mark.parametrize("batching", [False, True])
def test_shared_subscription_receives_deliver_after_message_at_its_time(official, batching):
    topic = f"{NS}/delayed-shared-{int(batching)}"
    consumer = official.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = official.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=5)
    # Delays of seconds, so that the prompt messages' "at once" has room on a loaded machine
    # (delays of 2 and 1.5 s left it 1.4 s for five sends and three receives).
    sent = time.monotonic()
    producer.send(b"after-6s", deliver_after=timedelta(seconds=6))
    producer.send(b"at-5500ms", deliver_at=int(time.time() * 1000) + 5500)
    for i in range(3):
        producer.send(f"now{i}".encode())
    prompt = []
    for _ in range(3):
        message = consumer.receive(timeout_millis=5000)
        consumer.acknowledge(message)
        prompt.append(message.data())
    assert prompt == [b"now0", b"now1", b"now2"]
    assert time.monotonic() - sent < 5
    early = receive_or_none(consumer, 200)
    assert early is None, f"received {early.data()!r} before its time"
    first = consumer.receive(timeout_millis=10_000)
    assert first.data() == b"at-5500ms" and time.monotonic() - sent >= 5.4
    consumer.acknowledge(first)
    second = consumer.receive(timeout_millis=10_000)
    assert second.data() == b"after-6s" and time.monotonic() - sent >= 5.9
    assert second.redelivery_count() == 0
    consumer.acknowledge(second)
    assert receive_or_none(consumer, 300) is None
    producer.close()
    consumer.close()


def test_exclusive_subscription_receives_it_at_once(official):
    topic = f"{NS}/delayed-exclusive"
    consumer = official.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Exclusive)
    producer = official.create_producer(topic)
    sent = time.monotonic()
    producer.send(b"delayed", deliver_after=timedelta(seconds=30))
    producer.send(b"plain")
    got = [consumer.receive(timeout_millis=20_000).data() for _ in range(2)]
    assert got == [b"delayed", b"plain"] and time.monotonic() - sent < 20      # not its 30 s delay
    producer.close()
    consumer.close()


def test_negative_ack_of_a_delivered_delayed_message_redelivers_it(official):
    topic = f"{NS}/delayed-nack"
    consumer = official.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                  negative_ack_redelivery_delay_ms=100)
    producer = official.create_producer(topic)
    producer.send(b"delayed", deliver_after=timedelta(milliseconds=500))
    first = consumer.receive(timeout_millis=5000)
    consumer.negative_acknowledge(first)
    again = consumer.receive(timeout_millis=5000)
    assert again.data() == b"delayed" and again.message_id() == first.message_id()
    assert again.redelivery_count() == 1
    consumer.acknowledge(again)
    producer.close()
    consumer.close()
