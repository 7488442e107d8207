"""Review probes for topic compaction: defects found in review, each with its regression test."""

from __future__ import annotations

import asyncio

from pyengine.broker import Broker
from pyengine.broker.compaction import COMPACTION_SUBSCRIPTION
from pyengine.broker.policies import Retention
from pyengine.client.message import MessageId
from pyengine.storage import ManagedLedgerConfig
from tests.broker.helpers import GatedWriter, drain
from tests.broker.test_compaction import TOPIC, attach, compact, send_batch, values


async def test_plain_subscription_batch_index_acks_are_not_masked_by_the_view(tmp_path):
    """A consumer that does not read compacted got every message of a batch: acking the
    indexes the view kept must not acknowledge the ones the view compacted out."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        await send_batch(broker, producer, [("a", b"a1"), ("b", b"b1"), ("a", b"a2")])
        await compact(broker)
        plain = await attach(broker, TOPIC, "plain", sub_type="shared", read_compacted=False)
        got = await drain(plain)
        assert values(got) == [("a", b"a1"), ("b", b"b1"), ("a", b"a2")]
        await plain.acknowledge(got[1])
        await plain.acknowledge(got[2])
        sub = plain._subscription
        assert not sub.cursor.is_acked(got[0].message_id.position)
        await plain.redeliver_unacknowledged_messages()
        assert values(await drain(plain)) == [("a", b"a1")]


async def test_compaction_after_a_restart_with_no_new_entries(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        for i in range(4):
            await producer.send(f"v{i}".encode(), key=f"k{i % 2}")
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic = await compact(broker)
        assert topic.compaction.horizon is not None
        consumer = await attach(broker, TOPIC)
        assert values(await drain(consumer)) == [("k0", b"v2"), ("k1", b"v3")]


def trimming(**extra):
    return dict(sync=False, retention=Retention(0, 0), ledger=ManagedLedgerConfig(max_entries_per_ledger=3), **extra)


async def hold(broker):
    """The compaction subscription, from the start (with retention 0, a topic without any
    subscription keeps nothing)."""
    topic = await broker.service.get_topic(TOPIC)
    await topic.open_subscription(COMPACTION_SUBSCRIPTION, "earliest")


async def compacted_then_trimmed(broker):
    """k0..k6, then k0 again, compacted; the ledgers of the first four trimmed since (the
    view holds them). The topic and the first seven message ids."""
    await hold(broker)
    producer = await broker.create_producer(TOPIC)
    ids = [await producer.send(f"v{i}".encode(), key=f"k{i}") for i in range(7)]
    await producer.send(b"v0b", key="k0")
    topic = await compact(broker)
    await topic.ledger.trim()
    assert topic.ledger.first_position() > ids[3].position
    return topic, ids


async def test_readers_from_earliest_after_the_ledgers_below_the_horizon_are_trimmed(tmp_path):
    async with Broker.embedded(tmp_path, **trimming()) as broker:
        topic, ids = await compacted_then_trimmed(broker)
        reader = await attach(broker, TOPIC, reader=True)
        assert [k for k, _ in values(await drain(reader))] == ["k1", "k2", "k3", "k4", "k5", "k6", "k0"]
        plain = await attach(broker, TOPIC, reader=True, read_compacted=False)
        # Not read compacted: what is still stored.
        got = values(await drain(plain))
        assert got[-1] == ("k0", b"v0b") and len(got) < 8


async def test_seek_by_message_id_inside_the_view_below_the_stored_ledgers(tmp_path):
    async with Broker.embedded(tmp_path, **trimming()) as broker:
        topic, ids = await compacted_then_trimmed(broker)
        consumer = await attach(broker, TOPIC)
        assert len(await drain(consumer)) == 7
        await consumer.seek(ids[2])          # a consumer resumes after the id, as the official clients
        assert [k for k, _ in values(await drain(consumer))] == ["k3", "k4", "k5", "k6", "k0"]


async def test_deleting_the_compaction_subscription_while_compacting(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        for i in range(2000):
            await producer.send(f"v{i}".encode(), key=f"k{i % 7}")
        topic = await broker.service.get_topic(TOPIC)
        task = topic.compaction.trigger()
        while COMPACTION_SUBSCRIPTION not in topic.subscriptions:
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert topic.compaction.running
        await topic.unsubscribe(COMPACTION_SUBSCRIPTION, force=True)
        try:
            await task
        except BaseException:
            pass
        await asyncio.sleep(0.05)
        assert COMPACTION_SUBSCRIPTION not in topic.subscriptions
        assert topic.compaction.horizon is None
        assert list(topic.compaction.iter_view()) == []
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic = await broker.service.get_topic(TOPIC)
        assert COMPACTION_SUBSCRIPTION not in topic.subscriptions
        assert topic.compaction.horizon is None
        assert list(topic.compaction.iter_view()) == []


async def test_a_failed_write_leaves_the_horizon_and_the_cursor_where_they_were(tmp_path):
    async with Broker.embedded(tmp_path, **trimming()) as broker:
        await hold(broker)
        producer = await broker.create_producer(TOPIC)
        for i in range(4):
            await producer.send(f"v{i}".encode(), key=f"k{i % 2}")
        topic = await compact(broker)
        first_horizon = topic.compaction.horizon
        for i in range(6):
            await producer.send(f"w{i}".encode(), key=f"k{i % 2}")
        cursor = topic.subscriptions[COMPACTION_SUBSCRIPTION].cursor
        gate = GatedWriter(topic.ledger.env)
        task = topic.compaction.trigger()
        await gate.next_commit()
        gate.let_through(OSError("disk gone"))
        await asyncio.gather(task, return_exceptions=True)
        gate.open()
        assert topic.compaction.status_json()["status"] == "ERROR"
        assert topic.compaction.horizon == first_horizon
        assert cursor.mark_delete == first_horizon
        await asyncio.sleep(0.05)
        await topic.ledger.trim()
        # Nothing compaction has not put in a view is trimmed.
        assert topic.ledger.first_position() <= topic.ledger.next_position(first_horizon)
        await cursor.persist()
    async with Broker.embedded(tmp_path, **trimming()) as broker:
        topic = await broker.service.get_topic(TOPIC)
        assert topic.compaction.horizon == first_horizon
        consumer = await attach(broker, TOPIC)
        # The old view, then everything after its horizon (nothing was lost).
        assert values(await drain(consumer)) == [("k0", b"v2"), ("k1", b"v3")] + [
            (f"k{i % 2}", f"w{i}".encode()) for i in range(6)]
        await compact(broker)
        latest = await attach(broker, TOPIC, "latest")
        assert values(await drain(latest)) == [("k0", b"w4"), ("k1", b"w5")]


async def test_read_compacted_subscription_resumes_inside_the_view_after_a_restart(tmp_path):
    """Pulsar #21187: a read-compacted cursor whose mark-delete is in a ledger trimmed since
    goes on with the view's next entries, not with the first stored ledger."""
    async with Broker.embedded(tmp_path, **trimming()) as broker:
        topic, ids = await compacted_then_trimmed(broker)
        consumer = await attach(broker, TOPIC)
        got = await drain(consumer)
        assert len(got) == 7
        await consumer.acknowledge_cumulative(got[1])        # k1, k2 done
        await consumer.close()
    async with Broker.embedded(tmp_path, **trimming()) as broker:
        consumer = await attach(broker, TOPIC)
        assert [k for k, _ in values(await drain(consumer))] == ["k3", "k4", "k5", "k6", "k0"]
