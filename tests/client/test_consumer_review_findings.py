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
