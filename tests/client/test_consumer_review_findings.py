"""Consumer-side findings of a review: reconnects, seeks, chunks, pattern consumers."""

import asyncio

from pyengine.client import MessageId


NS = "persistent://public/default"


async def test_multi_topic_seek_keeps_what_a_partition_sent_from_its_new_position(client, broker, monkeypatch):
    """A consumer of several topics seeking every topic (earliest) dropped all its buffered
    messages of a partitioned topic once the whole topic's seek was done: a partition whose
    own seek was answered first had already sent (and the buffer taken) messages from its new
    position by then, and those were lost (the broker counts them delivered)."""
    topic = f"{NS}/rf-seek-parted"
    await broker.service.policies.create_partitioned_topic(topic, 2)
    producer = await client.create_producer(topic, batching_enabled=False)
    for i in range(6):
        await producer.send(str(i).encode(), key=None)
    consumer = await client.subscribe([topic, f"{NS}/rf-seek-other"], "s", initial_position="earliest")
    first = [await consumer.receive(timeout=5) for _ in range(6)]
    for message in first:
        await consumer.acknowledge(message)
    per_partition = {}
    for message in first:
        per_partition.setdefault(message.message_id.partition, 0)
        per_partition[message.message_id.partition] += 1
    assert set(per_partition) == {0, 1}
    # Partition 1's subscription is slow to move (its storage, say): partition 0, moved and
    # subscribed again meanwhile, sends its messages from the new position.
    subscription = broker.service.topics[f"{topic}-partition-1"].subscriptions["s"]
    seek = subscription.seek

    async def slow_seek(*args, **kwargs):
        await asyncio.sleep(0.5)
        await seek(*args, **kwargs)
    monkeypatch.setattr(subscription, "seek", slow_seek)
    await consumer.seek(MessageId.earliest)
    again = []
    while True:
        try:
            again.append(await consumer.receive(timeout=1))
        except TimeoutError:
            break
    assert sorted(m.data for m in again) == sorted(m.data for m in first)
    await consumer.close()


async def _slow_seek_on(broker, monkeypatch, partition_topic: str, seconds: float) -> None:
    """The broker takes `seconds` to move the subscription "s" of `partition_topic`."""
    subscription = broker.service.topics[partition_topic].subscriptions["s"]
    seek = subscription.seek

    async def slow_seek(*args, **kwargs):
        await asyncio.sleep(seconds)
        await seek(*args, **kwargs)
    monkeypatch.setattr(subscription, "seek", slow_seek)


async def test_partitioned_seek_keeps_the_ack_timeout_of_what_a_moved_partition_sent(client, broker, monkeypatch):
    """A partitioned consumer's seek forgot, once every partition had moved, the ack-timeout
    tracking of each partition: messages a partition moved first had sent from its new
    position, received by the application meanwhile and never acknowledged, never timed out
    (they stayed with this consumer until it reconnected)."""
    from pyengine.client import consumer as consumer_module

    monkeypatch.setattr(consumer_module, "MIN_UNACKED_MESSAGES_TIMEOUT_MS", 1)
    topic = f"{NS}/rf-seek-ack-timeout"
    await broker.service.policies.create_partitioned_topic(topic, 2)
    producer = await client.create_producer(topic, batching_enabled=False)
    for i in range(6):
        await producer.send(str(i).encode())
    consumer = await client.subscribe(topic, "s", consumer_type="shared", initial_position="earliest",
                                      unacked_messages_timeout_ms=500)
    first = [await consumer.receive(timeout=5) for _ in range(6)]
    for message in first:
        await consumer.acknowledge(message)
    await _slow_seek_on(broker, monkeypatch, f"{topic}-partition-1", 0.6)
    seeking = asyncio.ensure_future(consumer.seek(MessageId.earliest))
    early = [await consumer.receive(timeout=5) for _ in range(3)]     # partition 0's, moved first
    assert not seeking.done() and {m.message_id.partition for m in early} == {0}
    await seeking
    again = []
    deadline = asyncio.get_running_loop().time() + 2
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        try:
            message = await consumer.receive(timeout=left)
        except TimeoutError:
            break
        again.append(message)
        await consumer.acknowledge(message)
    # partition 1's from the seek, and partition 0's once more: their ack timeout passed
    assert sorted(m.data for m in again if m.message_id.partition == 0) == sorted(m.data for m in early)
    await consumer.close()


async def test_a_rediscovery_while_a_failed_topic_closes_does_not_subscribe_it_twice(client, broker, monkeypatch):
    """A pattern consumer whose topic's consumer failed for good closes it, then subscribes the
    topic again; a rediscovery while it closed found the topic neither subscribed nor being
    subscribed again, and subscribed it too: the resubscription then replaced that consumer,
    which went on unseen (two consumers of the subscription on the topic, one of them leaked)."""
    import re

    from pyengine.client.errors import ConnectError
    from tests.client.conftest import consumers_on_broker

    topic = f"{NS}/rf-twice-a"
    await (await client.create_producer(topic)).close()
    consumer = await client.subscribe(re.compile(f"{NS}/rf-twice-.*"), "s", consumer_type="shared",
                                      pattern_auto_discovery_period=3600)
    failed = consumer._consumers[topic]
    closing, release = asyncio.Event(), asyncio.Event()
    close = failed.close

    async def slow_close() -> None:
        closing.set()
        await release.wait()
        await close()
    monkeypatch.setattr(failed, "close", slow_close)
    failed._handler_failed(next(iter(failed._handlers.values())), ConnectError("failed for good"))
    await asyncio.wait_for(closing.wait(), 5)
    await consumer._rediscover()
    release.set()
    for _ in range(100):
        await asyncio.sleep(0.05)
        if not consumer._resubscribing and topic in consumer._consumers:
            break
    await asyncio.sleep(0.3)
    assert not consumer._resubscribing and consumer.topics == [topic]
    assert consumers_on_broker(broker, topic) == 1
    await consumer.close()
    assert consumers_on_broker(broker, topic) == 0
