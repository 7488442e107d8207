"""Three `pyengine serve` processes on one loopback etcd: segments live on the broker that
created them, the controller leader is another one and reaches them through the segments API;
the leader is killed with SIGKILL right after a split was requested, and a survivor takes over
within the session ttl with the topic consistent and no message lost."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.request
from collections import Counter

import pytest

from pyengine.testing import ServeProcess
from pyengine.client import Client
from pyengine.metadata import open_metadata_store
from pyengine.naming import TopicName
from pyengine.scalable.layout import SegmentLayout
from pyengine.scalable.resources import ScalableTopicResources

TTL_S = 1.5
BASE = "/admin/v2/scalable/public/default/orders"
T = "topic://public/default/orders"


def http(method: str, url: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as reply:
            raw = reply.read()
            return reply.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")
    except OSError:                 # the broker died with the request in flight
        return 0, None


@pytest.fixture
def brokers(own_etcd, tmp_path):
    started = []
    for i in range(3):
        broker = ServeProcess(tmp_path / f"b{i}", "--metadata-store", own_etcd.url, "--broker-id", f"b{i}",
                              "--scalable-session-ttl", str(TTL_S), fsync=False)
        started.append(broker.start())
    yield started
    for broker in started:
        broker.stop()


async def stored_layout(etcd) -> tuple[SegmentLayout, object]:
    store = await open_metadata_store(etcd.url)
    try:
        resources = ScalableTopicResources(store)
        layout, _ = await resources.load(TopicName.parse(T))
        return layout, await resources.pending_operation(TopicName.parse(T))
    finally:
        await store.close()


async def test_kill_the_leader_in_the_middle_of_a_split(brokers, own_etcd):
    owner, leader, third = brokers
    assert http("PUT", f"{owner.http_url}{BASE}?numInitialSegments=2")[0] == 204      # segments on b0
    for broker in (leader, owner, third):               # b1 campaigns first: it leads
        assert http("GET", f"{broker.http_url}{BASE}/stats")[1]["controllerBrokerUrl"] == leader.url
    assert http("PUT", f"{leader.http_url}{BASE}/subscriptions/q")[0] == 204

    async with Client(third.url, operation_timeout_seconds=20) as client:
        ordered = [await client.subscribe_stream(T, "ordered", name) for name in ("s1", "s2")]
        before = {c.consumer_name: list(c.assigned) for c in ordered}
        assert sorted(before["s1"] + before["s2"]) == [0, 1]
        consumer = await client.subscribe_queue(T, "q")
        producer = await client.create_producer(T)
        sent: list[str] = []
        received: list[str] = []
        stop = asyncio.Event()

        async def produce():
            i = 0
            while not stop.is_set():
                payload = f"m{i}"
                await producer.send(payload.encode(), key=f"k{i % 32}")
                sent.append(payload)
                i += 1

        async def consume():
            while True:
                message = await consumer.receive()
                received.append(message.data.decode())
                await consumer.acknowledge(message)

        producing, consuming = asyncio.create_task(produce()), asyncio.create_task(consume())
        await asyncio.sleep(0.3)
        # a split through the leader; the leader is killed while it runs
        split = asyncio.create_task(asyncio.to_thread(http, "POST", f"{leader.http_url}{BASE}/split/0"))
        await asyncio.sleep(0.02)
        leader.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        leader.process.wait()
        await split                                        # whatever it answered (or the connection died)

        new_leader = None
        while new_leader is None and time.monotonic() - killed < 10 * TTL_S:
            for broker in (owner, third):
                status, stats = http("GET", f"{broker.http_url}{BASE}/stats")
                if status == 200 and stats["controllerBrokerUrl"] == broker.url:
                    new_leader = broker
            await asyncio.sleep(0.05)
        took_over = time.monotonic() - killed
        assert new_leader is not None and took_over < TTL_S + 3.0, took_over

        # the new leader completed or rolled back the split: a consistent layout, no operation left
        for _ in range(100):
            layout, pending = await stored_layout(own_etcd)
            if pending is None:
                break
            await asyncio.sleep(0.05)
        layout.check()
        assert pending is None and layout.epoch in (0, 1)
        # the ordered consumers re-registered with the new leader under their names, within the
        # grace period: their sessions were restored from etcd, nobody was evicted
        for _ in range(200):
            stats = http("GET", f"{new_leader.http_url}{BASE}/stats")[1]
            sessions = {c["consumerName"]: c for c in stats["subscriptions"]["ordered"]["consumers"]}
            if all(c["connected"] for c in sessions.values()) and len(sessions) == 2:
                break
            await asyncio.sleep(0.05)
        assert sorted(sessions) == ["s1", "s2"] and all(c["connected"] for c in sessions.values())
        if layout.epoch == 0:                              # rolled back: the very same segments
            assert {name: c["assignedSegments"] for name, c in sessions.items()} == before
        # the topic goes on: the new leader splits every active segment (children beside b0's)
        for segment in list(layout.active_segments):
            assert http("POST", f"{new_leader.http_url}{BASE}/split/{segment.segment_id}")[0] == 204
        await asyncio.sleep(0.3)
        stop.set()
        await producing
        for _ in range(300):
            if Counter(received) == Counter(sent):
                break
            await asyncio.sleep(0.02)
        consuming.cancel()
        assert set(received) == set(sent) and max(Counter(received).values()) == 1      # none lost, none twice
        final, _ = await stored_layout(own_etcd)
        assert len(final.active_segments) == 2 * len(layout.active_segments)
        owners = {http("GET", f"{owner.http_url}/admin/v2/segments/public/default/orders/{s.descriptor}")[1]["exists"]
                  for s in final.active_segments}
        assert owners == {True}                            # every child lives beside its parent on b0
