"""A broker restarted on the same data dir with other ports serves its scalable topics again:
the segments stored in its data dir are owned by its new URL. Found by an audit: their owner
records kept the old URL, and lookups sent clients to the dead address for good (DESIGN.md:
a restart recovers everything; `--port 0` picks a free port)."""

from __future__ import annotations

import asyncio

from pyengine.client import Client
from pyengine.testing import ServeProcess

T = "topic://public/default/moved"


async def produce(url: str) -> None:
    async with Client(url, operation_timeout_seconds=10) as client:
        producer = await client.create_producer(T)
        await producer.send(b"before the restart", key="k")


async def subscribe(url: str) -> None:
    async with Client(url, operation_timeout_seconds=10) as client:
        await (await client.subscribe_queue(T, "q")).close()


async def consume(url: str) -> list[bytes]:
    async with Client(url, operation_timeout_seconds=10) as client:
        consumer = await client.subscribe_queue(T, "q")
        return [(await asyncio.wait_for(consumer.receive(), 10)).data]


def test_segments_follow_the_broker_to_its_new_port(tmp_path):
    broker = ServeProcess(tmp_path / "data")
    try:
        broker.start()
        broker.admin("PUT", "/admin/v2/scalable/public/default/moved?numInitialSegments=2")
        asyncio.run(subscribe(broker.url))
        asyncio.run(produce(broker.url))
        old_port = broker.port
        broker.kill()
        broker.port = broker.http_port = 0               # free ports: others than before
        broker.start()
        assert broker.port != old_port
        assert asyncio.run(consume(broker.url)) == [b"before the restart"]
    finally:
        broker.stop()
