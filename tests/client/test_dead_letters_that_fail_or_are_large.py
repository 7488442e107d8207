"""Dead letters, as the Java client sends them: the dead letter producer chunks, so a chunked
message larger than the broker's limit reaches the DLQ (it failed there on every attempt); and a
message whose dead-lettering failed comes to the application again instead of being tried again
at once as it arrives (that looped: redelivered, refused, redelivered, thousands of times a
second)."""

from __future__ import annotations

import logging

from pyengine.client import ConsumerDeadLetterPolicy

from .test_chunking import LIMIT, _payload, small_broker, small_client  # noqa: F401  (fixtures)

TOPIC = "persistent://public/default/dead-letters"


async def _nacked_past_the_limit(client, payload: bytes, policy: ConsumerDeadLetterPolicy):
    consumer = await client.subscribe(TOPIC, "s", consumer_type="shared", negative_ack_redelivery_delay_ms=0,
                                      dead_letter_policy=policy)
    producer = await client.create_producer(TOPIC, chunking_enabled=True)
    await producer.send(payload)
    for count in range(2):
        message = await consumer.receive(5)
        assert message.redelivery_count == count and message.data == payload
        await consumer.negative_acknowledge(message)        # the second one goes to the DLQ
    return consumer


async def test_a_chunked_message_is_dead_lettered_whole(small_client):
    payload = _payload(LIMIT * 3)
    await _nacked_past_the_limit(small_client, payload, ConsumerDeadLetterPolicy(
        max_redeliver_count=1, initial_subscription_name="dlq"))
    dead = await small_client.subscribe(f"{TOPIC}-s-DLQ", "dlq")
    assert (await dead.receive(5)).data == payload


async def test_a_failed_dead_letter_comes_to_the_application_again(small_client, caplog):
    # A DLQ in a namespace that does not exist: its producer is refused every time.
    policy = ConsumerDeadLetterPolicy(max_redeliver_count=1, dead_letter_topic="persistent://public/none/dlq")
    with caplog.at_level(logging.WARNING, logger="pyengine.client.consumer"):
        consumer = await _nacked_past_the_limit(small_client, b"poison", policy)
        again = await consumer.receive(5)
    assert again.data == b"poison" and again.redelivery_count == 2
    failures = [r for r in caplog.records if "dead letter topic" in r.getMessage()]
    assert len(failures) == 1
    await consumer.acknowledge(again)
