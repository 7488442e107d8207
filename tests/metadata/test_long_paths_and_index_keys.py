"""Long paths and long index keys work on every backend, as ephemeral records, indexed records
and in every read. Found by an audit: LMDB refuses keys over 511 bytes, and the LMDB store failed
such writes half-way — committing the half: an ephemeral record that outlived its session (and a
restart), a record changed without its index entry or notification, a v5 ack op record of a
long subscription refused yet listed. Pulsar puts no limit on topic or subscription names, and
they are percent-encoded in paths (a non-ASCII character takes up to 12 bytes), so a few hundred
characters take a key past 511 bytes."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.metadata import NotificationType
from pyengine.naming import TopicName
from pyengine.scalable.resources import ScalableTopicResources
from pyengine.transaction.coordinator.metadata_records import IDX_ACKS, OpRecord, declare_indexes, op_prefix
from pyengine_kernels import Position, TxnId

CREATED, MODIFIED, DELETED = NotificationType.CREATED, NotificationType.MODIFIED, NotificationType.DELETED

# paths whose keys are around LMDB's limits: the record key is `ms:r<path>` (511 bytes for a path
# of 507), the ephemeral one `ms:e<session id><path>` (a path of 499)
LENGTHS = [470, 475, 476, 477, 499, 500, 506, 507, 508, 509, 600, 4000]


def long_path(length: int, tag: str = "") -> str:
    head = f"/long/{tag}"
    return head + "p" * (length - len(head))


async def drain(watch) -> list:
    got = []
    while True:
        try:
            got.append(await watch.next(timeout=0.5 if not got else 0.2))
        except (TimeoutError, asyncio.TimeoutError):
            return got


async def test_long_ephemeral_records_live_and_die_with_their_session(store):
    session = await store.create_session(5)
    watch = await store.watch("/long/", prefix=True)
    paths = [long_path(n) for n in LENGTHS]
    for path in paths:
        record = await store.put(path, b"v", session=session)
        assert record.ephemeral and record.version == 0
        assert (await store.get(path)).session_id == session.id
    assert [r.path for r in await store.list_prefix("/long/")] == sorted(paths, key=str.encode)
    await session.close()
    assert [await store.get(path) for path in paths] == [None] * len(paths)
    assert len(await store.list_prefix("/long/")) == 0
    events = [(n.type, n.path) for n in await drain(watch)]
    assert [e for e in events if e[0] is CREATED] == [(CREATED, path) for path in paths]
    assert sorted(e[1] for e in events if e[0] is DELETED) == sorted(paths)


async def test_long_paths_in_every_read(store):
    base = "/t/" + "d" * 480
    names = ["a", "b" * 30, "c" * 40 + "/x", "c" * 40 + "/y" * 10, "é" * 20]
    paths = [f"{base}/{name}" for name in names] + [long_path(n, "s") for n in (300, 480, 600)]
    for i, path in enumerate(paths):
        await store.put(path, b"%d" % i)
    expected = sorted(paths, key=str.encode)
    assert [r.path for r in await store.list_prefix("/")] == expected
    paged, after = [], None
    while True:
        page = await store.list_prefix("/", after=after, limit=2)
        paged += [r.path for r in page]
        if not page.more:
            break
        after = page.last_path
    assert paged == expected
    assert await store.get_children(base) == sorted({n.split("/")[0] for n in names}, key=str.encode)
    assert await store.get_children("/t") == ["d" * 480]
    updated = await store.put(paths[1], b"new", expected_version=0)
    assert updated.version == 1 and (await store.get(paths[1])).value == b"new"
    await store.delete(paths[0], expected_version=0)
    assert await store.get(paths[0]) is None
    await store.delete_recursive(base)
    assert [r.path for r in await store.list_prefix("/")] == sorted(paths[-3:], key=str.encode)


async def test_long_sequential_children(store):
    parent = "/seq/" + "q" * 600 + "/"
    made = [(await store.put(parent, b"%d" % i, sequential=True)).path for i in range(3)]
    assert made == [f"{parent}{i:010d}" for i in range(3)]
    assert await store.get_children(parent[:-1]) == [f"{i:010d}" for i in range(3)]
    await store.delete_recursive(parent[:-1])
    assert (await store.put(parent, b"again", sequential=True)).path == f"{parent}{0:010d}"


async def test_long_index_keys_are_indexed_and_watched(store):
    store.declare_index("byval", "/idx/", lambda record: record.value.decode())
    first = await store.put("/idx/rec", b"short")
    watch = await store.range_watch("byval", since=first.mod_revision)
    long_value = b"k" * 600
    updated = await store.put("/idx/rec", long_value, expected_version=0)
    assert updated.version == 1
    assert [r.path for r in await store.range_query("byval", start="k")] == ["/idx/rec"]
    assert [r.path for r in await store.range_query("byval", prefix=long_value.decode())] == ["/idx/rec"]
    assert await store.range_query("byval", prefix="short") == []
    for i in range(3):     # entries of one long key, ordered by path
        await store.put(f"/idx/rec{i}", long_value)
    assert [r.path for r in await store.range_query("byval", prefix=long_value.decode())] == \
        ["/idx/rec", "/idx/rec0", "/idx/rec1", "/idx/rec2"]
    got = [(n.type, n.path, n.index_key) for n in await drain(watch)]
    assert got[:2] == [(DELETED, "/idx/rec", "short"), (CREATED, "/idx/rec", long_value.decode())]
    await store.delete("/idx/rec")
    assert [r.path for r in await store.range_query("byval")] == ["/idx/rec0", "/idx/rec1", "/idx/rec2"]


async def test_a_v5_ack_op_of_a_long_subscription_is_indexed(store):
    declare_indexes(store)
    txn = TxnId(5 << 32, 42)
    segment = "segment://public/default/orders/0000-ffff-1"
    subscription = "sub-" + "x" * 450           # legal in Pulsar
    op = OpRecord("ack", segment, Position(3, 7), subscription)
    watch = await store.watch(op_prefix(txn), prefix=True)
    written = await store.put(op_prefix(txn), op.encode(), sequential=True, partition_key=str(txn))
    assert [r.path for r in await store.list_prefix(op_prefix(txn))] == [written.path]
    assert [r.path for r in await store.range_query(IDX_ACKS, prefix=(segment, subscription))] == [written.path]
    assert [(n.type, n.path) for n in await drain(watch)] == [(CREATED, written.path)]


async def test_scalable_records_of_long_names(store):
    resources = ScalableTopicResources(store)
    topic = TopicName.parse("topic://public/default/" + "orders-" + "t" * 150)
    subscription = "abonnement-" + "ü" * 60 + "-" + "s" * 60        # percent-encoded: 12 bytes a ü
    path = resources.consumer_path(topic, subscription, "consumer-1")
    assert len(path.encode()) > 511
    record = await store.create(path, b"{}")
    assert (await store.get(path)).version == record.version == 0
    subscriptions = resources.subscription_path(topic, subscription)
    assert await store.get_children(subscriptions) == ["consumers"]
    assert [r.path for r in await store.list_prefix(subscriptions)] == [path]
