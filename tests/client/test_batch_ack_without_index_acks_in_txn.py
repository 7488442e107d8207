"""A consumer with `batch_index_ack_enabled=False` acknowledges a batch once all its messages are
acknowledged. Some of them may be acknowledged in a transaction (sent by batch index with the
transaction, as the Java client does whatever its batch-index setting) and the others plainly:
the batch is then complete too, and nothing the application acknowledged comes back after a
reconnect. The plain acks leave the transaction's indexes to it: an abort brings back only
what the transaction acknowledged, and acknowledging that completes the batch for good."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client

from .conftest import drain

TOPIC = "persistent://public/default/batch-txn-ack"
SIZE = 4


async def _batch(client: Client, topic: str, subscription: str):
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_messages=SIZE,
                                            batching_max_publish_delay_ms=1000)
    consumer = await client.subscribe(topic, subscription, initial_position="earliest",
                                      batch_index_ack_enabled=False)
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(SIZE)))
    received = [await consumer.receive(timeout=5) for _ in range(SIZE)]
    assert {m.message_id.entry_id for m in received} == {received[0].message_id.entry_id}
    assert [m.message_id.batch_index for m in received] == list(range(SIZE))
    return consumer, received


async def _reconnect(consumer) -> None:
    [handler] = consumer._handlers.values()
    old = handler.connection
    old.close()
    for _ in range(200):
        if handler.connection is not old and handler._ready.is_set():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the consumer did not reconnect")


async def _nothing_more(client: Client, topic: str, subscription: str, consumer) -> None:
    with pytest.raises(TimeoutError):
        message = await consumer.receive(timeout=0.5)
        pytest.fail(f"redelivered: {message.data!r} {message.message_id}")
    await consumer.close()
    again = await client.subscribe(topic, subscription, batch_index_ack_enabled=False)
    with pytest.raises(TimeoutError):
        message = await again.receive(timeout=0.5)
        pytest.fail(f"delivered to a new consumer: {message.data!r} {message.message_id}")


@pytest.mark.parametrize("txn_first", [True, False], ids=["txn-ack-first", "plain-acks-first"])
async def test_a_batch_acked_partly_in_a_committed_txn_is_not_redelivered(client, txn_first):
    topic = f"{TOPIC}-{txn_first}"
    consumer, received = await _batch(client, topic, "sub")
    txn = await client.new_transaction()
    if txn_first:
        await consumer.acknowledge(received[0], txn=txn)
    for message in received[1:]:
        await consumer.acknowledge(message)
    if not txn_first:
        await consumer.acknowledge(received[0], txn=txn)
    await txn.commit()
    await asyncio.sleep(0.05)
    await _reconnect(consumer)
    await _nothing_more(client, topic, "sub", consumer)


async def test_a_batch_acked_partly_in_a_txn_is_not_redelivered_before_the_commit(client):
    consumer, received = await _batch(client, f"{TOPIC}-open", "sub")
    txn = await client.new_transaction()
    await consumer.acknowledge(received[2], txn=txn)
    for message in received[:2] + received[3:]:
        await consumer.acknowledge(message)
    await asyncio.sleep(0.05)
    await _reconnect(consumer)
    # the transaction's message is its own (pending) until it ends; the others are acknowledged
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.5)
    await txn.commit()
    await _nothing_more(client, f"{TOPIC}-open", "sub", consumer)


async def test_an_aborted_txn_brings_back_only_its_message(client):
    topic = f"{TOPIC}-abort"
    consumer, received = await _batch(client, topic, "sub")
    txn = await client.new_transaction()
    await consumer.acknowledge(received[1], txn=txn)
    for message in received[:1] + received[2:]:
        await consumer.acknowledge(message)
    await txn.abort()
    await asyncio.sleep(0.05)
    await _reconnect(consumer)
    again = await drain(consumer)                   # acknowledged (plainly) as it comes
    assert [(m.data, m.message_id.batch_index) for m in again] == [(b"1", 1)]
    await asyncio.sleep(0.05)
    await _reconnect(consumer)
    await _nothing_more(client, topic, "sub", consumer)


async def test_a_batch_acked_wholly_in_a_txn_is_its_alone(client):
    """Every message in the transaction: no plain ack is sent at all (an abort must bring them
    all back), and the commit acknowledges the batch."""
    topic = f"{TOPIC}-all-txn"
    consumer, received = await _batch(client, topic, "sub")
    txn = await client.new_transaction()
    for message in received:
        await consumer.acknowledge(message, txn=txn)
    await txn.abort()
    await asyncio.sleep(0.05)
    await _reconnect(consumer)
    again = [await consumer.receive(timeout=5) for _ in range(SIZE)]
    assert [m.data for m in again] == [b"%d" % i for i in range(SIZE)]
    txn = await client.new_transaction()
    for message in again:
        await consumer.acknowledge(message, txn=txn)
    await txn.commit()
    await asyncio.sleep(0.05)
    await _reconnect(consumer)
    await _nothing_more(client, topic, "sub", consumer)
