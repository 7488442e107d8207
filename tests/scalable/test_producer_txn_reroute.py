"""A transactional send of a ScalableProducer refused by a sealed parent and re-routed to the
child stays in the transaction (PIP-473: the decision lives above the segments): the refused
attempt was never stored, so it is no failed operation of the transaction; the re-sent one is.

The split is held between sealing the parent and publishing the layout (the controller's
`fault` hook), so the transactional sends meet the terminated parent deterministically."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import SendOutcomeUnknownError
from pyengine.client.producer import PartitionProducer
from pyengine.client.transaction import ABORTED, COMMITTED
from pyengine.errors import NotAllowedError
from pyengine.protocol import pulsar_api_pb2 as pb
from tests.scalable.test_producer_key_order_across_splits import (
    T, HeldAnswers, child_of, hold_split, read_in_lineage_order, segment_producer, wait_epoch,
)

KEYS = [f"key-{i}" for i in range(6)]


async def drain(consumer, wait: float = 0.5) -> list:
    got = []
    while True:
        try:
            got.append(await consumer.receive(timeout=wait))
        except (TimeoutError, asyncio.TimeoutError):
            return got


async def create_topic(service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)


async def refused_then_rerouted(client, service, txn):
    """Sends of `txn` of every key, all refused by the sealed parent and re-routed to the
    children; returns (producer, what was sent per key)."""
    scalable = await service.scalable_topics()
    producer = await client.create_producer(T)
    sent: dict[str, list[str]] = {key: [] for key in KEYS}
    for key in KEYS:                                       # in the parent, in the txn
        await producer.send(f"{key}/0".encode(), key=key, txn=txn)
        sent[key].append(f"{key}/0")
    split, publish = await hold_split(scalable, 0)
    tasks = []
    for i in (1, 2, 3):
        for key in KEYS:
            tasks.append(asyncio.create_task(producer.send(f"{key}/{i}".encode(), key=key, txn=txn)))
            sent[key].append(f"{key}/{i}")
    # refused by the sealed parent, waiting for the layout (a fixed 0.2 s was too short for a
    # loaded CI machine once)
    deadline = asyncio.get_running_loop().time() + 10
    while not producer._draining and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    assert producer._draining
    publish.set()
    await split
    results = await asyncio.gather(*tasks)
    assert all(sid == child_of(data.decode().split("/")[0]) for (sid, _), data in
               zip(results, (f"{k}/{i}".encode() for i in (1, 2, 3) for k in KEYS)))
    return producer, sent


async def test_a_rerouted_transactional_send_commits(client, service):
    await create_topic(service)
    watch = await client.subscribe_queue(T, "audit")
    txn = await client.new_transaction(scalable=True)
    producer, sent = await refused_then_rerouted(client, service, txn)
    assert await drain(watch, 0.3) == []                   # nothing visible before the commit
    await txn.commit()                                     # failed: the refused attempts counted
    assert txn.state == COMMITTED
    got = [m.data.decode() for m in await drain(watch, 1.0)]
    assert sorted(got) == sorted(d for datas in sent.values() for d in datas)    # all, once each
    stored = await read_in_lineage_order(client, producer)
    for key in KEYS:                                       # parent then child: in send order
        assert [data for k, data in stored if k == key] == sent[key]
    await producer.close()
    await watch.close()


async def test_a_rerouted_transactional_send_is_dropped_by_the_abort(client, service):
    await create_topic(service)
    watch = await client.subscribe_queue(T, "audit")
    txn = await client.new_transaction(scalable=True)
    producer, _ = await refused_then_rerouted(client, service, txn)
    await txn.abort()
    assert txn.state == ABORTED
    assert await drain(watch, 1.0) == []
    await producer.send(b"after", key=KEYS[0])
    assert [m.data for m in await drain(watch, 1.0)] == [b"after"]
    await producer.close()
    await watch.close()


async def test_a_rerouted_transactional_send_that_fails_in_the_child_fails_the_commit(client, service):
    """The re-sent attempt counts: refused by the child for another reason, the commit fails."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"0", key="k")
    txn = await client.new_transaction(scalable=True)
    split, publish = await hold_split(scalable, 0)
    first = asyncio.create_task(producer.send(b"1", key="k", txn=txn))
    await asyncio.sleep(0.2)                               # refused by the parent, waiting
    # the child's producer refuses it (NotAllowed)
    real_create = producer._client.create_producer

    async def create(*args, **kwargs):
        made = await real_create(*args, **kwargs)
        part = made._partitions[0]

        def refuse(handler, cmd):
            if handler is PartitionProducer.on_send_receipt:
                cmd = pb.CommandSendError(producer_id=cmd.producer_id, sequence_id=cmd.sequence_id,
                                          error=pb.NotAllowedError, message="refused by the test")
                return PartitionProducer.on_send_error, cmd
            return handler, cmd
        answers = HeldAnswers(part, rewrite=refuse)
        releasing.append(asyncio.create_task(_release_when(answers, 1)))
        return made
    releasing: list[asyncio.Task] = []
    producer._client.create_producer = create
    try:
        publish.set()
        await split
        with pytest.raises(NotAllowedError):
            await first
        await asyncio.gather(*releasing)
    finally:
        producer._client.create_producer = real_create
    with pytest.raises(NotAllowedError):
        await txn.commit()
    assert txn.state == ABORTED
    await producer.close()


async def test_a_commit_called_while_a_refused_send_waits_commits_it(client, service):
    """commit() while a send of the txn, refused by the sealed parent, waits for the layout: the
    commit waits for the send, whose attempt in the child is not refused as the txn commits."""
    await create_topic(service)
    scalable = await service.scalable_topics()
    producer = await client.create_producer(T)
    watch = await client.subscribe_queue(T, "audit")
    txn = await client.new_transaction(scalable=True)
    await producer.send(b"0", key="k", txn=txn)
    split, publish = await hold_split(scalable, 0)
    send = asyncio.create_task(producer.send(b"1", key="k", txn=txn))
    await asyncio.sleep(0.2)                               # refused by the parent, waiting
    assert not send.done()
    commit = asyncio.create_task(txn.commit())
    await asyncio.sleep(0.1)
    assert not commit.done()                               # waits for the send
    publish.set()
    await split
    assert (await send)[0] == child_of("k")
    await asyncio.wait_for(commit, 5)
    assert txn.state == COMMITTED
    assert sorted(m.data for m in await drain(watch, 1.0)) == [b"0", b"1"]
    assert [data for k, data in await read_in_lineage_order(client, producer) if k == "k"] == ["0", "1"]
    await producer.close()
    await watch.close()


async def _release_when(answers: HeldAnswers, count: int) -> None:
    await answers.wait_for(count)
    answers.release()


async def test_a_transactional_send_of_unknown_outcome_fails_the_commit(client, service):
    """The parent may have stored it (its receipt was lost with the connection, then the segment
    was found terminated): SendOutcomeUnknownError, and the commit must not go through."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"0", key="k")
    txn = await client.new_transaction(scalable=True)
    part = segment_producer(producer, 0)
    answers = HeldAnswers(part)
    pending = asyncio.create_task(producer.send(b"1", key="k", txn=txn))
    await answers.wait_for(1)                              # stored: its receipt is held here
    assert answers.errors == 0
    await scalable.split_segment(T, 0)
    await wait_epoch(producer, 1)
    part.connection.close()                                # the receipt is lost with the connection
    with pytest.raises(SendOutcomeUnknownError):
        await pending
    with pytest.raises(SendOutcomeUnknownError):
        await txn.commit()
    assert txn.state == ABORTED
    await producer.close()
