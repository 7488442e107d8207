"""Two consumers subscribing to a new subscription at once join one subscription. Found by
an audit: each attached a Subscription of its own (with its own cursor), so a Shared
subscription delivered every message to both, and the acknowledgements of one were lost at
the next restart."""

import asyncio

from pyengine.broker import Broker

T = "persistent://public/default/concurrent-subscribes"


async def drain(consumer) -> int:
    got = 0
    while True:
        try:
            message = await consumer.receive(timeout=0.3)
        except TimeoutError:
            return got
        await consumer.acknowledge(message)
        got += 1


async def test_concurrent_subscribes_share_one_subscription(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        for i in range(10):
            await producer.send(b"m%d" % i)
        one, two = await asyncio.gather(
            broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest"),
            broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest"))
        topic = broker.service.topics[T]
        assert len(topic.subscriptions["s"].consumers) == 2
        assert topic.subscriptions["s"].cursor is topic.ledger.cursors["s"]
        assert sum(await asyncio.gather(drain(one), drain(two))) == 10      # each message once
    async with Broker.embedded(tmp_path) as broker:
        again = await broker.subscribe(T, "s", consumer_type="shared")
        assert await drain(again) == 0                                      # and acknowledged for good
