"""Closing a scalable producer or consumer releases it: the client no longer holds it (a
long-lived client opening and closing them would otherwise keep every one, with its watch)."""

from __future__ import annotations

T = "topic://public/default/orders"


async def test_closed_scalable_producers_and_consumers_are_not_kept(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    for _ in range(3):
        producer = await client.create_producer(T)
        await producer.send(b"x", key="k")
        queue = await client.subscribe_queue(T, "q")
        stream = await client.subscribe_stream(T, "s", "c1")
        checkpoint = await client.subscribe_checkpoint(T, "cp", "c1")
        for closable in (producer, queue, stream, checkpoint):
            await closable.close()
    assert client._core.open_objects == []
