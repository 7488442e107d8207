"""A StreamConsumer that loses a segment and is given it back hands out only what its new
subscription of the segment delivers. What it had read ahead before losing it stayed queued
and, its segment assigned again, was handed out as well: the messages the other consumer had
processed and acknowledged meanwhile came a second time, and the rest twice, out of order
(the stale copies first, then the new subscription's redelivery)."""

from __future__ import annotations

import asyncio

T = "topic://public/default/orders"


async def test_messages_read_before_a_segment_was_lost_are_not_handed_out_when_it_comes_back(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    b = await client.subscribe_stream(T, "s", "b")
    assert b.assigned == [0]
    producer = await client.create_producer(T)
    for i in range(10):
        await producer.send(b"m%d" % i, key="k")
    for _ in range(250):                        # all read ahead into b's queue, none received
        if b._queue.qsize() == 10:
            break
        await asyncio.sleep(0.02)
    assert b._queue.qsize() == 10
    a = await client.subscribe_stream(T, "s", "a")          # takes segment 0 (first by name)
    assert a.assigned == [0]
    for i in range(5):                          # a processes the first half
        message = await a.receive(5)
        assert message.data == b"m%d" % i
        await a.acknowledge(message)
    await a.close()                             # segment 0 goes back to b
    for _ in range(250):
        if b.assigned == [0]:
            break
        await asyncio.sleep(0.02)
    assert b.assigned == [0]
    received = []
    while True:
        try:
            message = await b.receive(0.5)
        except TimeoutError:
            break
        received.append(message.data)
        await b.acknowledge(message)
    assert received == [b"m%d" % i for i in range(5, 10)]
    await b.close()
    await producer.close()
