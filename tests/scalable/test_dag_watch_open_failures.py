"""Opening a DAG watch session that fails leaves nothing behind, and one whose connection
drops before the first update is opened again on a new connection instead of waiting out the
operation timeout (and leaving a session re-opened behind the caller's back)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import TopicNotFoundError

T = "topic://public/default/orders"


@pytest.fixture
def operation_timeout() -> float:
    return 3


def watch_tasks() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if "DagWatch" in t.get_coro().__qualname__]


async def test_a_refused_watch_is_not_reopened_when_its_connection_closes(client, service, server):
    with pytest.raises(TopicNotFoundError):
        await client.create_producer(T)
    with pytest.raises(TopicNotFoundError):
        await client.watch_scalable_topic(T)
    (connection,) = client._core.pool.connections()
    connection.close()
    await connection.closed                     # its close listeners have run
    assert watch_tasks() == []                  # no refused watch comes back to life
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    watch = await client.watch_scalable_topic(T)
    assert sum(len(c.scalable.sessions) for c in server.connections) == 1
    await watch.close()


async def test_a_watch_whose_connection_drops_while_opening_opens_on_a_new_one(client, service, server):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    await client.get_topic_partitions("persistent://public/default/x")       # a pooled connection
    for connection in list(server.connections):      # dropped; the client notices only later
        connection.close()
    loop = asyncio.get_running_loop()
    started = loop.time()
    watch = await client.watch_scalable_topic(T)     # sent on the dying connection first
    assert loop.time() - started < 2                 # not the operation timeout
    assert watch.layout is not None and len(watch.layout.active_segments) == 2
    await scalable.split_segment(T, 0)
    assert (await watch.wait_newer_than(0, 5)).epoch == 1
    await watch.close()
    for _ in range(100):                             # its only session is closed on the broker
        if sum(len(c.scalable.sessions) for c in server.connections) == 0:
            break
        await asyncio.sleep(0.02)
    assert sum(len(c.scalable.sessions) for c in server.connections) == 0
    assert watch_tasks() == []
