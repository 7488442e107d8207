"""`pyengine.client`'s `send(..., deliver_after=timedelta)` against a `pyengine serve` child
process, consumed by the official `pulsar-client` (3.13) on a Shared subscription: the
delayed message comes after the ones sent later, no sooner than its delay, and the official
client reads the same deliver_at_time semantics (it is unbatched even with batching on); and
a delay beyond the topic's maxDeliveryDelayInMillis is refused with NotAllowedError."""

from __future__ import annotations

import asyncio
import datetime
import time

import pulsar
import pytest

from pyengine.client import Client, NotAllowedError

NS = "persistent://public/default"


async def send_from_ours(url: str, topic: str, batching: bool) -> None:
    async with Client(url, operation_timeout_seconds=10) as client:
        producer = await client.create_producer(topic, batching_enabled=batching)
        futures = [producer.send_async(b"later", deliver_after=datetime.timedelta(milliseconds=1500))]
        futures += [producer.send_async(f"now{i}".encode()) for i in range(3)]
        ids = await asyncio.gather(*futures)
        assert ids[0].batch_index == -1
        await producer.close()


@pytest.mark.parametrize("batching", [False, True])
def test_official_shared_consumer_receives_our_deliver_after_at_its_time(broker, official, batching):
    topic = f"{NS}/delayed-from-ours-{int(batching)}"
    consumer = official.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    sent = time.monotonic()
    asyncio.run(send_from_ours(broker.url, topic, batching))
    prompt = []
    for _ in range(3):
        message = consumer.receive(timeout_millis=2000)
        consumer.acknowledge(message)
        prompt.append(message.data())
    assert prompt == [b"now0", b"now1", b"now2"]
    late = consumer.receive(timeout_millis=5000)
    assert late.data() == b"later"
    assert time.monotonic() - sent >= 1.45
    assert late.redelivery_count() == 0
    consumer.acknowledge(late)


def test_a_delay_beyond_the_topic_limit_is_refused(broker, official):
    topic = f"{NS}/delayed-from-ours-limited"
    official.create_producer(topic).send(b"create")

    broker.admin("POST", "/admin/v2/persistent/public/default/delayed-from-ours-limited/delayedDelivery",
                 {"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 1000})
    assert broker.admin("GET", "/admin/v2/persistent/public/default/delayed-from-ours-limited/delayedDelivery") \
        == {"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 1000}

    async def scenario() -> None:
        async with Client(broker.url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer(topic)
            with pytest.raises(NotAllowedError, match="Exceeds max allowed delivery delay of 1000 milliseconds"):
                await producer.send(b"too-late", deliver_after=datetime.timedelta(seconds=5))
            await producer.send(b"ok", deliver_after=datetime.timedelta(milliseconds=200))
    asyncio.run(scenario())
