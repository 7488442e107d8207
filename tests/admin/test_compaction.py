"""Topic compaction through the admin API (Pulsar's triggerCompaction / compactionStatus):
PUT starts it (204, 409 while running), GET answers a LongRunningProcessStatus; unknown
topics are 404; a partitioned topic compacts each partition. And the compacted view outlives
the ledgers it was made from once they are trimmed."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker.consumer import Consumer
from pyengine.broker.embedded import EmbeddedConsumer
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.storage import ManagedLedgerConfig
from tests.admin.helpers import drain

P = "/admin/v2/persistent/public/default"
TOPIC = "persistent://public/default/ct"


@pytest.fixture
async def service(tmp_path):
    broker = BrokerService(BrokerConfig(data_dir=tmp_path / "data", sync=False, num_coordinators=1,
                                        ledger=ManagedLedgerConfig(max_entries_per_ledger=3)))
    await broker.start()
    yield broker
    await broker.close()


async def until_done(api, path):
    for _ in range(200):
        reply = await api.get(path)
        if reply.body["status"] != "RUNNING":
            return reply
        await asyncio.sleep(0.01)
    raise AssertionError("compaction never ended")


async def read_compacted(client, service, topic_name, name):
    topic = await service.get_topic(topic_name)
    consumer = EmbeddedConsumer(client, topic, 1000)
    broker_side = Consumer(consumer)
    sub = await topic.subscribe(name, broker_side, initial_position="earliest", read_compacted=True)
    consumer._attach(sub, broker_side)
    client._consumers.append(consumer)
    return [(m.partition_key, m.data) for m in await drain(consumer)]


async def test_trigger_and_status(api, client, service):
    producer = await client.create_producer(TOPIC)
    for i in range(7):
        await producer.send(b"v%d" % i, key="k%d" % (i % 2))
    path = f"{P}/ct/compaction"
    assert (await api.get(path)).body == {"status": "NOT_RUN", "lastError": ""}
    reply = await api.put(path)
    assert reply.status == 204
    done = await until_done(api, path)
    assert done.status == 200 and done.body == {"status": "SUCCESS", "lastError": ""}
    assert await read_compacted(client, service, TOPIC, "s") == [("k1", b"v5"), ("k0", b"v6")]


async def test_conflict_while_running(api, client, service):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"v", key="k")
    topic = service.topics[TOPIC]
    gate = asyncio.Event()
    original = topic.compaction.compact

    async def slow():
        await gate.wait()
        return await original()
    topic.compaction.compact = slow
    path = f"{P}/ct/compaction"
    assert (await api.put(path)).status == 204
    assert (await api.get(path)).body["status"] == "RUNNING"
    conflict = await api.put(path)
    assert conflict.status == 409 and "Compaction already in progress" in conflict.body["reason"]
    gate.set()
    assert (await until_done(api, path)).body["status"] == "SUCCESS"


async def test_error_status_carries_last_error(api, client, service):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"v", key="k")
    topic = service.topics[TOPIC]

    async def broken():
        raise RuntimeError("disk on fire")
    topic.compaction.compact = broken
    path = f"{P}/ct/compaction"
    assert (await api.put(path)).status == 204
    assert (await until_done(api, path)).body == {"status": "ERROR", "lastError": "disk on fire"}


async def test_unknown_topic_and_malformed_names(api):
    assert (await api.put(f"{P}/nope/compaction")).status == 404
    assert (await api.get(f"{P}/nope/compaction")).status == 404
    assert (await api.put("/admin/v2/persistent/nope/default/t/compaction")).status in (404, 412)
    assert (await api.post(f"{P}/nope/compaction")).status == 405


async def test_partitioned_topic_compacts_each_partition(api, client, service):
    assert (await api.put(f"{P}/parts/partitions", 2)).status == 204
    for index in range(2):
        producer = await client.create_producer(f"{TOPIC[:-2]}parts-partition-{index}")
        await producer.send(b"old", key="k")
        await producer.send(b"new", key="k")
    assert (await api.put(f"{P}/parts/compaction")).status == 204
    for index in range(2):
        name = f"parts-partition-{index}"
        assert (await until_done(api, f"{P}/{name}/compaction")).body["status"] == "SUCCESS"
        assert await read_compacted(client, service, f"persistent://public/default/{name}", "s") == [("k", b"new")]
    assert (await api.get(f"{P}/parts/compaction")).status == 404


async def test_view_outlives_trimmed_ledgers(api, client, service):
    """The `__compaction` cursor holds the ledger until compaction has read it; once it is
    past, trimming deletes the ledgers and the view still serves (and the next compaction
    starts from the view, not from the trimmed ledgers)."""
    producer = await client.create_producer(TOPIC)
    topic = service.topics[TOPIC]
    topic.ledger.set_retention(0, 0)
    path = f"{P}/ct/compaction"
    for i in range(3):
        await producer.send(b"v%d" % i, key="k%d" % i)
    assert (await api.put(path)).status == 204
    await until_done(api, path)
    horizon = topic.compaction.horizon
    for i in range(3, 9):
        await producer.send(b"v%d" % i, key="k%d" % (i % 3))
    await topic.ledger.trim()
    assert horizon.ledger_id not in topic.ledger.ledgers            # read by compaction: gone
    held = [lid for lid in topic.ledger.ledgers if lid > horizon.ledger_id]
    assert held and topic.ledger.first_position() == topic.ledger.next_position(horizon)   # not read yet: held
    assert await read_compacted(client, service, TOPIC, "early") == [
        ("k0", b"v0"), ("k1", b"v1"), ("k2", b"v2"), ("k0", b"v3"), ("k1", b"v4"), ("k2", b"v5"),
        ("k0", b"v6"), ("k1", b"v7"), ("k2", b"v8")]
    await client._consumers[-1].close()
    assert (await api.delete(f"{P}/ct/subscription/early")).status == 204
    assert (await api.put(path)).status == 204
    await until_done(api, path)
    await producer.send(b"after", key="k9")
    await topic.ledger.trim()
    assert all(lid not in topic.ledger.ledgers for lid in held[:-1])
    assert await read_compacted(client, service, TOPIC, "late") == [
        ("k0", b"v6"), ("k1", b"v7"), ("k2", b"v8"), ("k9", b"after")]
