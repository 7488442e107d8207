"""Findings of a review of subscription.py / topic.py: each test failed on the code as reviewed."""

from __future__ import annotations

from pyengine.broker import Broker

from .helpers import drain

T = "persistent://public/default/sub-review-findings"


async def test_abort_of_a_txn_whose_acks_a_plain_cumulative_ack_covered_leaves_the_consumer_usable(tmp_path):
    """Exclusive: a txn acks m1, then a plain cumulative ack covers m0..m4 (m1 included), then
    the txn aborts: nothing comes back (all acknowledged). A later transactional cumulative ack
    of a newly received message must be taken: the consumer holds no stale copy."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        for i in range(5):
            await producer.send(b"m%d" % i)
        got = [await consumer.receive(timeout=2) for _ in range(5)]
        txn1 = await broker.new_transaction()
        await consumer.acknowledge(got[1], txn1)
        await consumer.acknowledge_cumulative(got[4])
        await txn1.abort()
        assert await drain(consumer) == []
        await producer.send(b"m5")
        m5 = await consumer.receive(timeout=2)
        assert m5.data == b"m5"
        txn2 = await broker.new_transaction()
        await consumer.acknowledge_cumulative(m5, txn=txn2)
        await txn2.commit()
