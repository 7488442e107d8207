"""A DAG watch session the broker ends on a metadata-store error is opened again by the client
(PIP-468: every change of the DAG is pushed). Found by an audit: one transient error while the
broker re-read the layout ended the session for good; the client kept the old DAG and its sends
for a split range timed out for ever."""

from __future__ import annotations

import asyncio

from pyengine.scalable import key_hash
from pyengine.scalable.watch import DagWatchSession

T = "topic://public/default/watch-fails-once"


async def test_the_client_opens_the_watch_again_after_an_error_update(client, service, monkeypatch):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"before", key="k")
    refresh, failures = DagWatchSession._refresh, [ConnectionError("the metadata store is away (once)")]

    async def flaky_refresh(session):
        if failures:
            raise failures.pop()
        return await refresh(session)
    monkeypatch.setattr(DagWatchSession, "_refresh", flaky_refresh)     # the sessions open already
    await scalable.split_segment(T, 0)             # the session's re-read of the layout fails
    layout = await producer.watch.wait_newer_than(0, 10)
    assert not failures and layout.epoch >= 1
    await scalable.split_segment(T, 1 if key_hash("k") <= 0x7FFF else 2)
    await producer.watch.wait_newer_than(layout.epoch, 10)
    segment_id, _ = await producer.send(b"after", key="k")
    assert segment_id >= 3


async def test_a_deleted_topic_ends_the_watch(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    watch = await client.watch_scalable_topic(T)
    connection = watch._connection
    await scalable.delete_topic(T)
    for _ in range(100):                       # its session ends: the broker's error update
        if watch._connection is None or not connection.dag_sessions:
            break
        await asyncio.sleep(0.02)
    assert not connection.dag_sessions
    assert watch._reopen is None                # nothing to follow: not opened again
    await watch.close()
