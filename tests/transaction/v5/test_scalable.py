"""v5 transactions over topic:// scalable topics through pyengine.client: several segments, two
namespaces, a split and a merge in the middle of open transactions. Visibility is atomic for
the QueueConsumer (nothing of a transaction before its commit, all of it after, nothing of an
aborted one), commits of transactions whose segments were sealed complete at once, and nothing
is lost or duplicated; transactional acks across sealed and live segments commit and abort."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from pyengine.client import Client
from pyengine.protocol.pulsar_api_pb2 import CommandSubscribe  # noqa: F401  (the wire's types)
from tests.protocol.conftest import server, service  # noqa: F401  (fixtures)

A = "topic://public/default/orders"
B = "topic://public/other/payments"


@pytest.fixture
async def client(server, service):
    service.service_url = f"pulsar://127.0.0.1:{server.port}"     # as `pyengine serve` sets it
    async with Client(f"pulsar://127.0.0.1:{server.port}", operation_timeout_seconds=10) as client:
        yield client


async def drain(consumer, wait: float = 0.3) -> list:
    got = []
    while True:
        try:
            got.append(await consumer.receive(timeout=wait))
        except (TimeoutError, asyncio.TimeoutError):
            return got


async def test_split_and_merge_mid_transaction(client, service):
    await service.policies.create_namespace("public/other")
    scalable = await service.scalable_topics()
    await scalable.create_topic(A, 2)
    await scalable.create_topic(B, 1)
    orders = await client.create_producer(A)
    payments = await client.create_producer(B)
    watch_a = await client.subscribe_queue(A, "audit")
    watch_b = await client.subscribe_queue(B, "audit")
    stream = await client.subscribe_stream(A, "ordered", "c1")       # ordered, from the start
    keys = [f"k{i}" for i in range(24)]

    committed = await client.new_transaction(scalable=True)
    aborted = await client.new_transaction(scalable=True)
    for key in keys:
        await orders.send(f"c-{key}".encode(), key=key, txn=committed)
        await orders.send(f"a-{key}".encode(), key=key, txn=aborted)
    await payments.send(b"c-pay", txn=committed)
    await payments.send(b"a-pay", txn=aborted)
    await orders.send(b"plain-before", key="k0")

    await scalable.split_segment(A, 0)                  # seals segment 0 mid-transaction
    await orders.watch.wait_newer_than(0, 5)
    for key in keys:                                     # re-routed to the children, same txn
        await orders.send(f"c2-{key}".encode(), key=key, txn=committed)
    layout = await scalable.get_layout(A)
    children = sorted(s.segment_id for s in layout.active_segments)
    await scalable.merge_segments(A, children[1], children[2])   # seals two more
    await orders.watch.wait_newer_than(layout.epoch, 5)
    for key in keys[:6]:
        await orders.send(f"c3-{key}".encode(), key=key, txn=committed)
        await orders.send(f"a3-{key}".encode(), key=key, txn=aborted)

    # plain messages before the first open txn entry of a segment may show; none of the txns
    before = [m.data for m in await drain(watch_a) + await drain(watch_b)]
    assert not [d for d in before if d.startswith((b"c", b"a"))], before

    started = time.perf_counter()
    await committed.commit()                             # its parents are sealed: no waiting
    await aborted.abort()
    assert time.perf_counter() - started < 5

    seen = [m for m in before if False] + [m.data for m in await drain(watch_a, 1.0) + await drain(watch_b, 1.0)]
    seen += before
    counts = Counter(seen)
    expected = {f"c-{k}".encode() for k in keys} | {f"c2-{k}".encode() for k in keys} | \
        {f"c3-{k}".encode() for k in keys[:6]} | {b"c-pay", b"plain-before"}
    assert set(counts) == expected, set(counts) ^ expected
    assert all(n == 1 for n in counts.values()), [d for d, n in counts.items() if n > 1]

    # the ordered StreamConsumer sees the same atomic outcome, each key in send order; its acks
    # go in a transaction: the children of a split are handed out once the parent's commit lands
    ack_txn = await client.new_transaction(scalable=True)
    ordered: list[bytes] = []
    while True:
        try:
            message = await stream.receive(timeout=1.0 if ack_txn is not None else 3.0)
        except (TimeoutError, asyncio.TimeoutError):
            if ack_txn is None:
                break
            await ack_txn.commit()                  # releases the sealed parents' children
            ack_txn = None
            continue
        ordered.append(message.data)
        if ack_txn is not None:
            await stream.acknowledge(message, txn=ack_txn)
        else:
            await stream.acknowledge(message)
    assert Counter(ordered) == Counter(expected - {b"c-pay"})
    for key in keys:
        mine = [d for d in ordered if d.endswith(f"-{key}".encode())]
        assert mine == [d for d in (f"c-{key}".encode(), f"c2-{key}".encode(), f"c3-{key}".encode())
                        if d in expected], (key, mine)
    await stream.close()

    # consume-and-ack in a transaction across sealed and live segments
    worker = await client.subscribe_queue(A, "work")
    work = await drain(worker, 1.0)
    assert {m.data for m in work} == expected - {b"c-pay"}
    undo = await client.new_transaction(scalable=True)
    for message in work:
        await worker.acknowledge(message, txn=undo)
    await undo.abort()                                   # nothing acked: all delivered again
    for consumer in worker._consumers.values():
        await consumer.redeliver_unacknowledged_messages()
    again = await drain(worker, 1.0)
    assert Counter(m.data for m in again) == Counter(m.data for m in work)
    done = await client.new_transaction(scalable=True)
    for message in again:
        await worker.acknowledge(message, txn=done)
    await done.commit()
    await asyncio.sleep(0.2)
    for consumer in worker._consumers.values():
        await consumer.redeliver_unacknowledged_messages()
    assert await drain(worker, 0.5) == []
    # every participant cleaned up: no op records left once decisions are materialised
    for _ in range(200):
        if not await service.v5.store.list_prefix("/txn-op/"):
            break
        await asyncio.sleep(0.01)
    assert len(await service.v5.store.list_prefix("/txn-op/")) == 0
