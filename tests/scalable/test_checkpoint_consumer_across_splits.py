"""A CheckpointConsumer across a split: it keeps reading (its children are not held back
forever behind a parent that it never acknowledges on the subscription), what it had read
ahead of the split is still handed out, and a parent whose two children it is assigned is
read once, so `checkpoint()` names exactly what was handed out and a consumer resumed from it
loses nothing."""

from __future__ import annotations

import asyncio


T = "topic://public/default/orders"


async def receive_all(consumer, wait: float = 0.5) -> list[str]:
    got = []
    while True:
        try:
            got.append((await consumer.receive(wait)).data.decode())
        except TimeoutError:
            return got


def in_key_order(received: list[str]) -> bool:
    order: dict[str, list[int]] = {}
    for item in received:
        key, index = item.split(":")
        order.setdefault(key, []).append(int(index))
    return all(v == sorted(v) for v in order.values())


async def test_a_checkpoint_consumer_follows_a_split_keeping_what_it_read_ahead(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    keys = [f"key-{i}" for i in range(8)]
    sent = [f"{keys[i % 8]}:{i}" for i in range(40)]
    for item in sent:
        await producer.send(item.encode(), key=item.split(":")[0])
    consumer = await client.subscribe_checkpoint(T, "cp", "a")
    received = [(await consumer.receive(5)).data.decode() for _ in range(3)]
    for _ in range(100):                        # the rest read ahead into the queue
        if consumer._queue.qsize() == 37:
            break
        await asyncio.sleep(0.02)
    assert consumer._queue.qsize() == 37
    await scalable.split_segment(T, 0)
    await producer.watch.wait_newer_than(0, 5)
    for i in range(40, 80):
        item = f"{keys[i % 8]}:{i}"
        await producer.send(item.encode(), key=keys[i % 8])
        sent.append(item)
    received += await receive_all(consumer)
    assert sorted(received) == sorted(sent)                        # none lost, none twice
    assert in_key_order(received)
    assert sorted(consumer.assigned) == [1, 2]


async def test_a_checkpoint_over_a_parent_read_for_two_children_resumes_without_loss(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    sent = [f"k{i}:{i}" for i in range(200)]
    for item in sent:
        await producer.send(item.encode(), key=item.split(":")[0])
    await scalable.split_segment(T, 0)          # the 200 stay in sealed parent 0
    await producer.watch.wait_newer_than(0, 5)
    consumer = await client.subscribe_checkpoint(T, "cp", "a")    # assigned both children
    assert sorted(consumer.assigned) == [1, 2]
    received = [(await consumer.receive(5)).data.decode() for _ in range(60)]
    saved = consumer.checkpoint()
    await consumer.close()
    resumed = await client.subscribe_checkpoint(T, "cp2", "b", checkpoint=saved)
    received += await receive_all(resumed)
    assert sorted(received) == sorted(sent)                        # none lost, none twice
    assert in_key_order(received)
