"""A CheckpointConsumer resumed from a checkpoint, whose checkpoint() is taken while what it
read ahead waits in its queue (nothing received yet), still names where it resumed from. It
named nothing for the segment (no message of it handed out yet), so a consumer resumed from
that checkpoint read the segment from its start: everything before the first checkpoint
came a second time."""

from __future__ import annotations

import asyncio

T = "topic://public/default/orders"


async def test_a_checkpoint_taken_before_anything_is_received_keeps_the_resumed_position(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    for i in range(10):
        await producer.send(b"m%d" % i, key="k")
    first = await client.subscribe_checkpoint(T, "cp", "a")
    assert [(await first.receive(5)).data for _ in range(3)] == [b"m0", b"m1", b"m2"]
    saved = first.checkpoint()
    await first.close()

    second = await client.subscribe_checkpoint(T, "cp", "b", checkpoint=saved)
    for _ in range(250):                        # the rest read ahead into the queue, not received
        if second._queue.qsize() == 7:
            break
        await asyncio.sleep(0.02)
    assert second._queue.qsize() == 7
    again = second.checkpoint()
    await second.close()

    third = await client.subscribe_checkpoint(T, "cp", "c", checkpoint=again)
    received = []
    while True:
        try:
            received.append((await third.receive(0.5)).data)
        except TimeoutError:
            break
    assert received == [b"m%d" % i for i in range(3, 10)]
    await third.close()
    await producer.close()
