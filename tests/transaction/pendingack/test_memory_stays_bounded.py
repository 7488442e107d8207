"""A subscription's pending-ack handle forgets the txns that ended on it (found by an audit):
its index of acking txns per coordinator was emptied only by low watermarks, which v5 (PIP-473)
does not have — every v5 txn that ever acked on a subscription stayed in it for good."""

from __future__ import annotations

import asyncio

from pyengine.broker import Broker

SEGMENT = "segment://public/default/bounded/0000-ffff-0"
ROUNDS = 120


async def test_v5_txns_that_acked_are_forgotten_once_ended(tmp_path):
    async with Broker.embedded(tmp_path / "data", sync=False) as client:
        producer = await client.create_producer(SEGMENT)
        consumer = await client.subscribe(SEGMENT, "s")
        handle = client.service.topics[SEGMENT].subscriptions["s"].pending_ack
        for i in range(ROUNDS):
            await producer.send(b"m%d" % i)
            message = await consumer.receive(timeout=5)
            txn = await client.new_transaction(version=5)
            await consumer.acknowledge(message, txn=txn)
            await (txn.commit() if i % 2 else txn.abort())
            if i % 2 == 0:                       # aborted: delivered again, acked plainly
                await consumer.acknowledge(await consumer.receive(timeout=5))
        for _ in range(200):                     # the header watch materialises the last ones
            if not handle._deciding and not handle._records:
                break
            await asyncio.sleep(0.02)
        assert not handle._records
        assert not handle._txns._known
        assert sum(len(heap) for heap in handle._txns._heaps.values()) <= 64
