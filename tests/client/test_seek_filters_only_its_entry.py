"""A consumer's seek(message id) drops only the id's own entry (the id, and its batch before
it), as the C++ and Java clients do. Found by an audit: the client dropped every earlier entry
for the consumer's whole life, so when the subscription was moved back (another consumer's
seek, an admin's reset) this consumer silently dropped those messages: never handed out,
never acknowledged, held by it for good."""

from __future__ import annotations

import asyncio

from .conftest import drain

T = "persistent://public/default/seek-filter"


async def received(consumer, timeout: float = 0.5) -> list[bytes]:
    return [message.data for message in await drain(consumer, timeout)]


async def test_a_subscription_moved_back_is_read_again(client, broker):
    consumer = await client.subscribe(T, "s", initial_position="earliest")
    producer = await client.create_producer(T)
    ids = [await producer.send(b"%d" % i) for i in range(10)]
    await consumer.seek(ids[5])
    assert await received(consumer) == [b"6", b"7", b"8", b"9"]
    subscription = broker.service.topics[T].subscriptions["s"]
    await subscription.seek(subscription.topic.ledger.first_position())    # as an admin's reset
    # all of them but the seek's own id, which a consumer keeps dropping as pulsar-client does
    assert await received(consumer) == [b"%d" % i for i in range(10) if i != 5]


async def test_a_seek_into_a_batch_still_drops_the_batch_before_the_id(client):
    producer = await client.create_producer(T, batching_enabled=True, batching_max_publish_delay_ms=50)
    ids = await asyncio.gather(*(producer.send(b"%d" % i) for i in range(6)))
    assert len({(m.ledger_id, m.entry_id) for m in ids}) == 1            # one batch entry
    consumer = await client.subscribe(T, "s", initial_position="earliest")
    await consumer.seek(ids[3])
    assert await received(consumer) == [b"4", b"5"]
    await producer.send(b"after")
    assert await received(consumer) == [b"after"]


async def test_a_seek_into_a_batch_acknowledges_the_batch_before_the_id_on_the_broker(client, broker):
    """As the Java client: the SEEK carries the ack set of the id's index and those after it,
    and the broker's cursor holds the batch's earlier indexes acknowledged. Before, only the
    seeking consumer dropped them: another consumer of the subscription (or this one after a
    reconnect) got them again."""
    producer = await client.create_producer(T, batching_enabled=True, batching_max_publish_delay_ms=50)
    ids = await asyncio.gather(*(producer.send(b"%d" % i) for i in range(6)))
    assert ids[3].batch_size == 6
    consumer = await client.subscribe(T, "s", initial_position="earliest")
    await consumer.seek(ids[3])
    subscription = broker.service.topics[T].subscriptions["s"]
    assert subscription.cursor.batch_ack_set(subscription.cursor.read_position) == [0b111000]
    await consumer.close()
    other = await client.subscribe(T, "s")
    assert await received(other) == [b"3", b"4", b"5"]        # no local filter: the broker's
    await other.seek(ids[5])
    await other.close()
    assert await received(await client.subscribe(T, "s")) == [b"5"]
