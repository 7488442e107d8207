"""A QueueConsumer lets go of a sealed segment once it is drained (PIP-468, Consumer Assignment:
"sealed segments keep serving messages until their backlog drains and are then dropped from the
set"): no backlog left on the subscription there (every message acknowledged, by whichever
consumer) — then its per-segment consumer is closed and `segments` no longer lists it. A
message not acknowledged yet keeps the segment attached, ackable and redeliverable."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import TransactionConflictError
from pyengine.naming import TopicName
from pyengine.scalable import key_hash

T = "topic://public/default/orders"


def keys_of(low: int, high: int, count: int) -> list[str]:
    return [k for k in (f"key-{i}" for i in range(10_000)) if low <= key_hash(k) <= high][:count]


async def wait_for(condition, timeout: float = 5.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def broker_consumers(service, segment_id: int, subscription: str) -> int:
    """How many consumers the broker has on `subscription` of segment `segment_id`."""
    for name in service.list_topics():
        parsed = TopicName.parse(name)
        if parsed.is_segment and parsed.segment_id == segment_id:
            topic = await service.get_topic(name, create=False)
            sub = topic.subscriptions.get(subscription)
            return len(sub.consumers) if sub is not None else 0
    return 0


async def fill_and_split(client, service, count: int):
    """Topic T with one segment holding `count` messages, then split (children 1 and 2)."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    for i, key in enumerate(keys_of(0, 0xFFFF, count)):
        assert (await producer.send(b"m%d" % i, key=key))[0] == 0
    return scalable, producer


async def test_a_drained_sealed_segment_is_dropped(client, service):
    scalable, producer = await fill_and_split(client, service, 10)
    consumer = await client.subscribe_queue(T, "q")
    assert consumer.segments == [0]
    await scalable.split_segment(T, 0)
    await consumer.watch.wait_newer_than(0, 5)
    assert await wait_for(lambda: consumer.segments == [0, 1, 2])
    sealed = consumer._consumers[0]
    got = set()
    for _ in range(10):
        message = await consumer.receive(5)
        assert TopicName.parse(message.topic).segment_id == 0
        got.add(message.data)
        await consumer.acknowledge(message)
    assert got == {b"m%d" % i for i in range(10)}
    assert await wait_for(lambda: consumer.segments == [1, 2]), consumer.segments
    assert await wait_for(lambda: sealed._closed)             # closed (its close under way), not merely forgotten
    for _ in range(250):                                        # its CLOSE_CONSUMER answered
        if await broker_consumers(service, 0, "q") == 0:
            break
        await asyncio.sleep(0.02)
    assert await broker_consumers(service, 0, "q") == 0
    # acknowledging a message of the dropped segment again is harmless (it is acknowledged);
    # in a transaction it is a conflict, as the broker's answer to an ack of an acked message
    # (else the transaction would commit the processing of a message processed elsewhere)
    await consumer.acknowledge(message)
    txn = await client.new_transaction(scalable=True)
    with pytest.raises(TransactionConflictError, match="acknowledged already"):
        await consumer.acknowledge(message, txn=txn)
    with pytest.raises(TransactionConflictError):
        await txn.commit()                                      # as any failed ack of it
    # the children are still read; a later layout change does not attach the drained parent again
    key = keys_of(0x8000, 0xFFFF, 1)[0]
    assert (await producer.send(b"late", key=key))[0] == 2
    message = await consumer.receive(5)
    assert message.data == b"late"
    await consumer.acknowledge(message)
    await scalable.split_segment(T, 1)
    await consumer.watch.wait_newer_than(1, 5)
    assert await wait_for(lambda: consumer.segments == [2, 3, 4]), consumer.segments
    # no task kept for what was dropped: one forwarding task per segment read
    assert await wait_for(lambda: len(consumer._tasks) <= len(consumer.segments)), consumer._tasks
    await consumer.close()


async def test_an_empty_sealed_segment_is_dropped_and_not_attached_again(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    consumer = await client.subscribe_queue(T, "q")
    await scalable.split_segment(T, 0)
    await consumer.watch.wait_newer_than(0, 5)
    assert await wait_for(lambda: consumer.segments == [1, 2]), consumer.segments
    # a consumer subscribing later attaches the drained sealed segment only to find it drained
    late = await client.subscribe_queue(T, "q")
    assert await wait_for(lambda: late.segments == [1, 2]), late.segments
    await late.close()
    await consumer.close()


async def test_an_unacknowledged_message_keeps_its_sealed_segment(client, service):
    scalable, _ = await fill_and_split(client, service, 3)
    consumer = await client.subscribe_queue(T, "q")
    await scalable.split_segment(T, 0)
    await consumer.watch.wait_newer_than(0, 5)
    messages = [await consumer.receive(5) for _ in range(3)]
    held = messages.pop(1)
    for message in messages:
        await consumer.acknowledge(message)
    # the held message keeps the segment: not dropped, however long we wait
    assert not await wait_for(lambda: 0 not in consumer.segments, timeout=1.5)
    assert not consumer._consumers[0]._closed
    assert await broker_consumers(service, 0, "q") == 1
    await consumer.acknowledge(held)                            # still ackable
    assert await wait_for(lambda: consumer.segments == [1, 2]), consumer.segments
    assert await broker_consumers(service, 0, "q") == 0
    await consumer.close()


async def test_a_message_unacknowledged_elsewhere_keeps_the_segment_and_is_redelivered(client, service):
    """The backlog is the subscription's: another consumer's unacknowledged message keeps the
    sealed segment attached here, and comes here once that consumer goes away."""
    scalable, _ = await fill_and_split(client, service, 1)
    holder = await client.subscribe_queue(T, "q", receiver_queue_size=1)
    held = await holder.receive(5)                              # the only message, not acked
    other = await client.subscribe_queue(T, "q")
    await scalable.split_segment(T, 0)
    await other.watch.wait_newer_than(0, 5)
    assert await wait_for(lambda: other.segments == [0, 1, 2])
    assert not await wait_for(lambda: 0 not in other.segments, timeout=1.5)
    await holder.close()                                        # its unacked message goes back
    again = await other.receive(5)
    assert again.data == held.data and TopicName.parse(again.topic).segment_id == 0
    assert 0 in other.segments
    await other.acknowledge(again)
    assert await wait_for(lambda: other.segments == [1, 2]), other.segments
    await other.close()


async def test_an_active_segment_is_never_dropped(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    consumer = await client.subscribe_queue(T, "q")
    assert not await wait_for(lambda: consumer.segments != [0, 1], timeout=1.0)
    await consumer.close()


@pytest.mark.parametrize("closing_first", [True, False])
async def test_closing_while_a_sealed_segment_is_watched(client, service, closing_first):
    scalable, _ = await fill_and_split(client, service, 2)
    consumer = await client.subscribe_queue(T, "q")
    await scalable.split_segment(T, 0)
    await consumer.watch.wait_newer_than(0, 5)
    message = await consumer.receive(5)
    if not closing_first:
        await consumer.acknowledge(message)
    await consumer.close()
    await asyncio.sleep(0.2)
    assert consumer.segments == []
    assert all(task.done() for task in consumer._tasks)


async def test_a_segment_pruned_from_the_layout_is_let_go(client, service):
    scalable, _ = await fill_and_split(client, service, 1)
    consumer = await client.subscribe_queue(T, "q")
    await scalable.split_segment(T, 0)
    layout = await consumer.watch.wait_newer_than(0, 5)
    assert await wait_for(lambda: consumer.segments == [0, 1, 2])
    sealed = consumer._consumers[0]
    consumer._on_layout(layout.prune_segment(0))                # as a DAG update without it would
    assert await wait_for(lambda: consumer.segments == [1, 2]), consumer.segments
    assert await wait_for(lambda: sealed._closed)
    await consumer.close()
