"""CommandProducer.initial_subscription_name from the official `pulsar-client` (3.13) against a
`pyengine serve` child process. Its `create_producer` has no such option in Python; the C++
client behind it sets the field on its dead letter producer from
`ConsumerDeadLetterPolicy(initial_subscription_name=...)`, so that is what sends it here: the
broker creates the subscription with the producer, before the first dead letter, and a consumer
of it asking for the latest position still gets that dead letter. Our own client's producer
option is checked on the same broker."""

from __future__ import annotations

import asyncio

import pulsar

from pyengine.client import Client

NS = "persistent://public/default"


def test_the_official_dead_letter_producer_creates_the_initial_subscription(broker, official):
    topic = f"{NS}/interop-initial-sub"
    consumer = official.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Shared, initial_position=pulsar.InitialPosition.Earliest,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(1, initial_subscription_name="dlq-init"))
    producer = official.create_producer(topic)
    producer.send(b"dead")
    producer.close()
    for _ in range(2):
        consumer.negative_acknowledge(consumer.receive(timeout_millis=5000))
    try:                                   # the dead letter is sent before the next receive ends
        consumer.receive(timeout_millis=1500)
    except pulsar.Timeout:
        pass
    consumer.close()
    late = official.subscribe(f"{topic}-s-DLQ", "dlq-init", initial_position=pulsar.InitialPosition.Latest)
    message = late.receive(timeout_millis=5000)
    assert message.data() == b"dead"
    assert message.properties()["REAL_TOPIC"] == topic
    late.close()


def test_the_official_client_reads_what_our_producer_kept_for_its_subscription(broker, official):
    topic = f"{NS}/interop-initial-sub-ours"

    async def produce() -> None:
        async with Client(broker.url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer(topic, initial_subscription_name="init")
            for i in range(3):
                await producer.send(b"%d" % i)

    asyncio.run(produce())
    consumer = official.subscribe(topic, "init", initial_position=pulsar.InitialPosition.Latest)
    assert [consumer.receive(timeout_millis=5000).data() for _ in range(3)] == [b"0", b"1", b"2"]
    consumer.close()
