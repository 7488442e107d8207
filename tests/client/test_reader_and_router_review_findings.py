"""Findings of a review of the client's readers and partitioned producers: each test failed on
the code as reviewed."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from pyengine.client.message import MessageId


async def test_create_reader_refuses_a_start_id_of_another_topic(client):
    """Reader.seek refuses a message id naming another topic ("names no entry of this one"), but
    create_reader takes one silently and starts at whatever sits at that position here."""
    producer = await client.create_producer("persistent://public/default/reader-other-a")
    other = await client.create_producer("persistent://public/default/reader-other-b")
    await other.send(b"x")
    reader_a = await client.create_reader("persistent://public/default/reader-other-a", MessageId.earliest)
    await producer.send(b"a0")
    received = await reader_a.read_next(timeout=5)
    assert received.message_id.topic_name
    with pytest.raises(ValueError):
        await reader_a.seek(dataclasses.replace(received.message_id,
                                                topic_name="persistent://public/default/reader-other-b"))
    with pytest.raises(ValueError):
        await client.create_reader("persistent://public/default/reader-other-b", received.message_id)
    # its own topic's id is taken, by the topic's full name or its short one
    for name in ("persistent://public/default/reader-other-a", "reader-other-a"):
        reader = await client.create_reader(name, received.message_id, start_message_id_inclusive=True)
        assert (await reader.read_next(timeout=5)).data == b"a0"
        await reader.close()


async def test_keyless_messages_in_a_transaction_go_round_robin(broker, client):
    """Producer.send_async in a transaction (_send_async_in_txn) asks the router for a partition,
    and when that partition is not registered with the transaction yet (the fast path does not
    apply) asks it again for the slow path (_partition_in_txn): round robin moves twice per send.
    On two partitions every keyless send of the transaction lands on the same partition."""
    topic = "persistent://public/default/txn-round-robin"
    await broker.service.policies.create_partitioned_topic(topic, 2)
    producer = await client.create_producer(topic, send_timeout_ms=0)
    producer._router._turn = 0
    txn = await client.new_transaction()
    ids = await asyncio.gather(*(producer.send_async(b"m%d" % i, txn=txn) for i in range(4)))
    await txn.commit()
    assert sorted(m.partition for m in ids) == [0, 0, 1, 1]
