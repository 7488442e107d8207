"""The official client's dead-letter policy on an Exclusive subscription: as with Pulsar, whose
single-active dispatcher sends every message with redelivery count 0 (RedeliveryTrackerDisabled),
a negatively acknowledged message keeps coming back and never goes to the dead-letter topic.
Found by an audit: the broker raised the count, and the client, which sends no message of an
Exclusive subscription to the dead-letter topic, dropped it once past max_redeliver_count:
neither delivered again nor dead-lettered, stuck in the backlog."""

from __future__ import annotations

import pulsar
import pytest

NS = "persistent://public/default"


def test_a_nacked_message_keeps_coming_back_with_count_0(official: pulsar.Client) -> None:
    topic = f"{NS}/exclusive-dlq"
    dead_letters = official.subscribe(topic + "-DLQ", "watch", initial_position=pulsar.InitialPosition.Earliest)
    consumer = official.subscribe(
        topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive, initial_position=pulsar.InitialPosition.Earliest,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=1, dead_letter_topic=topic + "-DLQ"))
    official.create_producer(topic).send(b"hello")
    for _ in range(3):
        message = consumer.receive(timeout_millis=5000)
        assert (message.data(), message.redelivery_count()) == (b"hello", 0)
        consumer.negative_acknowledge(message)
    consumer.acknowledge(consumer.receive(timeout_millis=5000))
    with pytest.raises(pulsar.Timeout):
        dead_letters.receive(timeout_millis=300)
