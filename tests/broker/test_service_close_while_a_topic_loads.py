"""A broker closed while a topic was being loaded (a producer's, a consumer's or an admin
request's first use of it): the load ended after the close had gone over the loaded topics, so
the topic stayed open on a closed broker (its timers and dispatchers running on a closed data
dir), and was handed to its caller as if nothing happened; a load asked for after the close
failed with the storage's LedgerClosedError (found by an audit). The close now waits for the
loads under way and closes their topics; a load asked for once it started is ServiceNotReady."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.broker.topic import Topic
from pyengine.errors import ServiceNotReadyError

A, B = "persistent://public/default/a", "persistent://public/default/b"


@pytest.fixture
async def service(tmp_path):
    broker = BrokerService(BrokerConfig(data_dir=tmp_path / "data", sync=False, num_coordinators=1))
    await broker.start()
    yield broker
    await broker.close()


async def test_a_topic_loaded_while_the_broker_closes_is_closed_with_it(service, monkeypatch):
    a = await service.get_topic(A)
    started, a_closing = asyncio.Event(), asyncio.Event()
    load = Topic.load.__func__
    loaded = []

    async def held(cls, broker, name):
        started.set()
        # Until the close goes over the loaded topics (a close that waits for this load first
        # never gets there: then at most a short while).
        await asyncio.wait([asyncio.ensure_future(a_closing.wait())], timeout=0.3)
        loaded.append(await load(cls, broker, name))
        return loaded[-1]

    monkeypatch.setattr(Topic, "load", classmethod(held))
    get = asyncio.ensure_future(service.get_topic(B))
    await started.wait()
    close_a = a.close

    async def closing():
        a_closing.set()
        for _ in range(20):                     # B's load ends meanwhile
            await asyncio.sleep(0)
        await close_a()

    monkeypatch.setattr(a, "close", closing)
    got, closed = await asyncio.gather(get, service.close(), return_exceptions=True)
    assert closed is None
    assert loaded and all(topic._closed for topic in loaded)
    assert all(topic._closed for topic in service.topics.values())


async def test_a_topic_asked_for_once_the_broker_closes_is_service_not_ready(service):
    await service.close()
    with pytest.raises(ServiceNotReadyError):
        await service.get_topic(B)


async def test_a_caller_that_stops_waiting_for_a_load_does_not_cancel_it_for_the_others(service, monkeypatch):
    """E.g. `asyncio.wait_for(client.create_producer(topic), 1)` timing out while another task
    creates a producer on the same topic: that one got a CancelledError, nobody had cancelled it."""
    started, release = asyncio.Event(), asyncio.Event()
    load = Topic.load.__func__

    async def held(cls, broker, name):
        started.set()
        await release.wait()
        return await load(cls, broker, name)

    monkeypatch.setattr(Topic, "load", classmethod(held))
    first = asyncio.ensure_future(service.get_topic(B))
    await started.wait()
    second = asyncio.ensure_future(service.get_topic(B))
    await asyncio.sleep(0)                      # waiting for the same load
    first.cancel()
    release.set()
    topic = await second
    assert service.topics[B] is topic and not topic._closed
    assert first.cancelled() and not service._loading


async def test_a_load_that_outlasts_the_close_closes_its_own_topic(service, monkeypatch):
    """The close waits for loads under way only so long (a load hung on an unreachable
    metadata store must not hang it); one ending later closes its topic instead of keeping it."""
    monkeypatch.setattr("pyengine.broker.service.LOADS_AT_CLOSE_S", 0.05)
    release, loaded = asyncio.Event(), []
    load = Topic.load.__func__

    async def held(cls, broker, name):
        loaded.append(await load(cls, broker, name))
        await release.wait()                    # past the close's wait
        return loaded[-1]

    monkeypatch.setattr(Topic, "load", classmethod(held))
    get = asyncio.ensure_future(service.get_topic(B))
    while not loaded:
        await asyncio.sleep(0)
    await asyncio.wait_for(service.close(), 5)
    release.set()
    await get                                   # its caller still gets it (closed)
    for _ in range(100):
        if loaded[0]._closed:
            break
        await asyncio.sleep(0.01)
    assert loaded[0]._closed
    assert B not in service.topics
