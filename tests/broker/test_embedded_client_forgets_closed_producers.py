"""An embedded client forgets the producers it closed (found by an audit): closed consumers
left its list, closed producers stayed in it — an application that creates a producer per
request over a client kept for the process's life held every one of them."""

from __future__ import annotations

from pyengine.broker import Broker

T = "persistent://public/default/forgotten-producers"


async def test_closed_producers_leave_the_client(tmp_path):
    async with Broker.embedded(tmp_path / "data", sync=False) as client:
        kept = await client.create_producer(T)
        for i in range(100):
            producer = await client.create_producer(T)
            await producer.send(b"m%d" % i)
            await producer.close()
        assert client._producers == [kept]
        assert list(client.service.topics[T].producers) == [kept.producer_name]
