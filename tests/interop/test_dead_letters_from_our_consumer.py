"""`pyengine.client`'s dead letter policy against a `pyengine serve` child process, next to the
official `pulsar-client` (3.13) doing the same: the official client produces, our consumer nacks
until its messages go to the dead letter topic, and the official client reads them there (from
the initial subscription our consumer created). The official consumer's own DLQ, on a twin
topic, shows the same deliveries, the same default topic name and the same properties."""

from __future__ import annotations

import asyncio
import re

import pulsar

from pyengine.client import Client, ConsumerDeadLetterPolicy

NS = "persistent://public/default"
ORIGIN_ID = re.compile(r"^\(\d+,\d+,-?\d+,-?\d+\)$")      # the C++ client's MessageId form


def produce(official: pulsar.Client, topic: str) -> None:
    producer = official.create_producer(topic, batching_enabled=True, batching_max_messages=3,
                                        batching_max_publish_delay_ms=50)
    for i in range(3):
        producer.send_async(b"m%d" % i, None, partition_key=f"k{i}", properties={"n": str(i)})
    producer.send(b"m3", partition_key="k3", properties={"n": "3"})      # unbatched (after a flush)
    producer.close()


def official_dead_letters(official: pulsar.Client, topic: str) -> list[int]:
    consumer = official.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                  initial_position=pulsar.InitialPosition.Earliest,
                                  negative_ack_redelivery_delay_ms=100,
                                  dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(2))
    counts = []
    while True:
        try:
            message = consumer.receive(timeout_millis=2000)
        except pulsar.Timeout:
            break
        counts.append(message.redelivery_count())
        consumer.negative_acknowledge(message)
    consumer.close()
    return sorted(counts)


async def our_dead_letters(url: str, topic: str) -> list[int]:
    async with Client(url, operation_timeout_seconds=10) as client:
        policy = ConsumerDeadLetterPolicy(max_redeliver_count=2, initial_subscription_name="dlq-reader")
        consumer = await client.subscribe(topic, "s", consumer_type="shared", initial_position="earliest",
                                          negative_ack_redelivery_delay_ms=100, dead_letter_policy=policy)
        counts = []
        while True:
            try:
                message = await consumer.receive(timeout=2)
            except TimeoutError:
                break
            counts.append(message.redelivery_count)
            await consumer.negative_acknowledge(message)
        await consumer.close()
        return sorted(counts)


def read_dlq(official: pulsar.Client, topic: str, subscription: str, initial) -> list[pulsar.Message]:
    consumer = official.subscribe(topic, subscription, initial_position=initial)
    got = []
    while True:
        try:
            message = consumer.receive(timeout_millis=1500)
        except pulsar.Timeout:
            break
        consumer.acknowledge(message)
        got.append(message)
    consumer.close()
    return sorted(got, key=lambda m: m.data())


def test_official_client_reads_our_dead_letters_as_it_writes_its_own(broker, official):
    theirs, ours = f"{NS}/dlq-official", f"{NS}/dlq-ours"
    produce(official, theirs)
    produce(official, ours)

    their_counts = official_dead_letters(official, theirs)
    our_counts = asyncio.run(our_dead_letters(broker.url, ours))
    assert our_counts == their_counts == sorted([0, 1, 2] * 4)      # max_redeliver_count + 1 deliveries

    their_dead = read_dlq(official, f"{theirs}-s-DLQ", "check", pulsar.InitialPosition.Earliest)
    # "latest" finds them all: our consumer created the subscription before the first dead letter
    our_dead = read_dlq(official, f"{ours}-s-DLQ", "dlq-reader", pulsar.InitialPosition.Latest)
    assert [m.data() for m in our_dead] == [m.data() for m in their_dead] == [b"m0", b"m1", b"m2", b"m3"]
    for mine, official_one in zip(our_dead, their_dead):
        assert mine.partition_key() == official_one.partition_key()
        assert set(mine.properties()) == set(official_one.properties()) == {"n", "REAL_TOPIC", "ORIGIN_MESSAGE_ID"}
        assert mine.properties()["n"] == official_one.properties()["n"]
        assert mine.properties()["REAL_TOPIC"] == ours and official_one.properties()["REAL_TOPIC"] == theirs
        assert ORIGIN_ID.match(mine.properties()["ORIGIN_MESSAGE_ID"])
        assert ORIGIN_ID.match(official_one.properties()["ORIGIN_MESSAGE_ID"])

    # the originals were acknowledged: nothing is left for the subscription
    leftover = official.subscribe(ours, "s", consumer_type=pulsar.ConsumerType.Shared)
    try:
        leftover.receive(timeout_millis=800)
        raise AssertionError("a dead-lettered message came back")
    except pulsar.Timeout:
        pass
    leftover.close()
