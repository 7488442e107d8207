"""A CheckpointConsumer given a sealed segment in place of its children reads it to its end,
an open transaction's messages there included. It took "no message available" for the end
while a transaction sent to the segment before the split was still open: it acknowledged what
it had read and stopped reading. The commit then made the transaction's message readable, but
nothing read the segment again, and the subscription kept a backlog there for good, so the
controller never handed the children out: the consumer stopped for good, the committed message
and everything sent after the split undelivered."""

from __future__ import annotations

import asyncio

import pytest

T = "topic://public/default/orders"


async def backlog(scalable, segment: int) -> int:
    stats = await (await scalable.leader(T)).stats()
    return stats["segments"][str(segment)]["subscriptions"].get("s", {}).get("msgBacklog", -1)


async def receive_all(consumer, wait: float = 1.0) -> list[bytes]:
    got = []
    while True:
        try:
            got.append((await consumer.receive(wait)).data)
        except TimeoutError:
            return got


@pytest.mark.parametrize("commit", [True, False])
async def test_a_transaction_open_in_a_sealed_segment_is_waited_for(client, service, commit):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    consumer = await client.subscribe_checkpoint(T, "s", "a")
    producer = await client.create_producer(T)
    await producer.send(b"before", key="k")
    txn = await client.new_transaction(scalable=True)
    await producer.send(b"in-txn", key="k", txn=txn)
    assert (await consumer.receive(5)).data == b"before"
    await scalable.split_segment(T, 0)
    await producer.watch.wait_newer_than(0, 5)
    await producer.send(b"after", key="k")
    # the consumer read segment 0 as far as it could and moved its cursor there: only the
    # open transaction's entry is left of its backlog
    for _ in range(250):
        if consumer.assigned == [0] and await backlog(scalable, 0) == 1:
            break
        await asyncio.sleep(0.02)
    assert consumer.assigned == [0] and await backlog(scalable, 0) == 1
    if commit:
        await txn.commit()
    else:
        await txn.abort()
    assert await receive_all(consumer) == ([b"in-txn", b"after"] if commit else [b"after"])
    assert sorted(consumer.assigned) == [1, 2]
    await consumer.close()
    await producer.close()
