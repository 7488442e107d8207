"""A send of a transaction that fails before it is under way (too big, a full queue, a
closed producer) fails the commit: the transaction is aborted and nothing of it is seen.
Found by an audit: such sends were never tracked, so commit() committed the others, as if
the failed message had not been part of the transaction (the Java client registers a send
with its transaction before it can fail)."""

from __future__ import annotations

import pytest

from pyengine.client.errors import AlreadyClosedError, MessageTooBigError, ProducerQueueIsFullError

T = "persistent://public/default/txn-failed-send"


async def nothing_visible(client, topic: str) -> None:
    consumer = await client.subscribe(topic, "watch", initial_position="earliest")
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.5)
    await consumer.close()


async def test_a_message_too_big_fails_the_commit(client):
    producer = await client.create_producer(T)
    txn = await client.new_transaction()
    await producer.send(b"first", txn=txn)
    with pytest.raises(MessageTooBigError):
        await producer.send(b"x" * (6 * 1024 * 1024), txn=txn)
    with pytest.raises(MessageTooBigError):
        await txn.commit()
    assert txn.state == "aborted"
    await nothing_visible(client, T)


async def test_a_full_queue_fails_the_commit(client):
    producer = await client.create_producer(T, max_pending_messages=1, block_if_queue_full=False,
                                            batching_enabled=True, batching_max_publish_delay_ms=500)
    txn = await client.new_transaction()
    first = producer.send_async(b"first", txn=txn)
    with pytest.raises(ProducerQueueIsFullError):
        for _ in range(10):
            producer.send_async(b"more", txn=txn)
    await first
    with pytest.raises(ProducerQueueIsFullError):
        await txn.commit()
    await nothing_visible(client, T)


async def test_a_closed_producer_fails_the_commit(client):
    producer = await client.create_producer(T)
    txn = await client.new_transaction()
    await producer.send(b"first", txn=txn)
    await producer.close()
    with pytest.raises(AlreadyClosedError):
        await producer.send(b"second", txn=txn)
    with pytest.raises(AlreadyClosedError):
        await txn.commit()
    await nothing_visible(client, T)
