"""ScalableProducer: a key's sends keep their order whatever mix of transactional and plain
sends. A transactional send that its segment's producer could not queue at once (its queue
full: the message waits there, unqueued, for room and for the transaction's registration of
the segment) used to let the key's next send go all the same: a plain send then took the free
room first and was stored before it, in the child of a split as in any segment.

The segment producers queue one message at a time (max_pending_messages=1), so the second send
of the key always meets a full queue."""

from __future__ import annotations

import asyncio

from pyengine.client.transaction import COMMITTED
from tests.scalable.test_producer_key_order_across_splits import T, child_of, hold_split, read_in_lineage_order


async def test_transactional_and_plain_sends_of_a_key_keep_their_order_across_a_split(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T, max_pending_messages=1)
    stream = await client.subscribe_stream(T, "audit", "c1")
    await producer.send(b"0", key="k")
    txn = await client.new_transaction(scalable=True)
    split, publish = await hold_split(scalable, 0)
    sends = [asyncio.create_task(producer.send(b"1", key="k", txn=txn)),
             asyncio.create_task(producer.send(b"2", key="k", txn=txn)),
             asyncio.create_task(producer.send(b"3", key="k"))]
    await asyncio.sleep(0.2)                      # refused by the sealed parent, waiting
    assert producer._draining
    publish.set()
    await split
    assert {sid for sid, _ in await asyncio.gather(*sends)} == {child_of("k")}
    await txn.commit()
    assert txn.state == COMMITTED
    assert [data for key, data in await read_in_lineage_order(client, producer) if key == "k"] == ["0", "1", "2", "3"]
    got = []
    for _ in range(4):                            # ordered: the parent's, acked, then the child's
        message = await stream.receive(timeout=5)
        got.append(message.data)
        await stream.acknowledge(message)
    assert got == [b"0", b"1", b"2", b"3"]
    assert not producer._waiting and not producer._draining
    await producer.close()
    await stream.close()


async def test_a_plain_send_waits_behind_a_transactional_one_its_segment_holds(client, service):
    """No split: a transactional send held by the full queue of the segment's producer (the
    transaction's registration of the segment unanswered yet) is stored before the plain send
    issued after it; so for any mix of the two."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T, max_pending_messages=1)
    await producer.send(b"0", key="k")
    txn = await client.new_transaction(scalable=True)
    in_txn = [True, True, False, True, False, False, True]
    sends = [asyncio.create_task(producer.send(str(i).encode(), key="k", txn=txn if transactional else None))
             for i, transactional in enumerate(in_txn, 1)]
    await asyncio.gather(*sends)
    await txn.commit()
    expected = [str(i) for i in range(len(in_txn) + 1)]
    assert [data for key, data in await read_in_lineage_order(client, producer) if key == "k"] == expected
    assert not producer._waiting
    await producer.close()
