"""Topic compaction (Pulsar's TwoPhaseCompactor / CompactedTopicImpl): latest value per key,
tombstones, batches split by key, messages without key, READ_COMMITTED (markers, aborted and
open transactions: Pulsar #21718/#21951), durability across restarts, read-compacted
consumers and readers."""

from __future__ import annotations

import pytest

from core_ext.batch import build_batch
from pyengine.broker import Broker
from pyengine.broker.compaction import COMPACTION_SUBSCRIPTION, CompactionAlreadyRunningError
from pyengine.broker.consumer import Consumer
from pyengine.broker.embedded import EmbeddedConsumer
from pyengine.client.message import MessageId
from pyengine.errors import NotAllowedError
from pyengine.protocol.commands import message_metadata
from pyengine.protocol.pulsar_api_pb2 import SingleMessageMetadata
from pyengine.storage.entry import headers_and_payload
from tests.broker.helpers import drain

TOPIC = "persistent://public/default/compacted"


async def attach(broker, topic_name, subscription="s", *, reader=False, sub_type="exclusive",
                 read_compacted=True, start=None):
    """A consumer (or reader) of the embedded broker that reads compacted."""
    topic = await broker.service.get_topic(topic_name)
    consumer = EmbeddedConsumer(broker, topic, 1000, reader=reader)
    broker_side = Consumer(consumer)
    if reader:
        sub = await topic.subscribe(f"reader-{broker_side.consumer_id}", broker_side, durable=False,
                                    start=start if start is not None else topic.ledger.first_position(),
                                    read_compacted=read_compacted)
    else:
        sub = await topic.subscribe(subscription, broker_side, sub_type=sub_type, initial_position="earliest",
                                    read_compacted=read_compacted)
    consumer._attach(sub, broker_side)
    broker._consumers.append(consumer)
    return consumer


async def send_batch(broker, producer, messages: list[tuple[str | None, bytes]]):
    topic = broker.service.topics[producer.topic]
    sequence = producer._next_sequence
    producer._next_sequence += len(messages)
    singles = []
    for i, (key, payload) in enumerate(messages):
        smd = SingleMessageMetadata(payload_size=len(payload), sequence_id=sequence + i)
        if key is not None:
            smd.partition_key = key
        singles.append((smd.SerializeToString(), payload))
    metadata = message_metadata(producer.producer_name, sequence, 1,
                                num_messages_in_batch=len(messages)).SerializeToString()
    return await topic.publish(producer._producer, headers_and_payload(metadata, build_batch(singles)),
                               sequence_id=sequence, num_messages=len(messages))


def values(messages):
    return [(m.partition_key, m.data) for m in messages]


async def compact(broker, topic_name=TOPIC):
    topic = await broker.service.get_topic(topic_name)
    topic.compaction.trigger()
    await topic.compaction.wait()
    assert topic.compaction.status_json() == {"status": "SUCCESS", "lastError": ""}
    return topic


async def test_latest_value_per_key_tombstones_and_no_key(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"a1", key="a")
        await producer.send(b"b1", key="b")
        await producer.send(b"nokey")
        await producer.send(b"a2", key="a")
        await producer.send(b"c1", key="c")
        await producer.send(b"", key="b")            # tombstone: b is deleted
        topic = await broker.service.get_topic(TOPIC)
        assert topic.compaction.status_json() == {"status": "NOT_RUN", "lastError": ""}
        await compact(broker)
        assert topic.compaction.horizon == topic.ledger.lac
        assert COMPACTION_SUBSCRIPTION in topic.subscriptions
        assert topic.subscriptions[COMPACTION_SUBSCRIPTION].cursor.mark_delete == topic.ledger.lac
        consumer = await attach(broker, TOPIC)
        assert values(await drain(consumer)) == [("a", b"a2"), ("c", b"c1")]
        # Not read compacted: everything.
        plain = await attach(broker, TOPIC, "plain", read_compacted=False)
        assert len(await drain(plain)) == 6
        # After the horizon, the ledger as usual.
        await producer.send(b"a3", key="a")
        await producer.send(b"n2")
        assert values(await drain(consumer)) == [("a", b"a3"), (None, b"n2")]


async def test_batches_are_split_by_key(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        first = await send_batch(broker, producer, [("a", b"a1"), ("b", b"b1"), (None, b"x"), ("c", b"c1")])
        await send_batch(broker, producer, [("a", b"a2"), ("c", b"")])
        await compact(broker)
        consumer = await attach(broker, TOPIC)
        got = await drain(consumer)
        assert values(got) == [("b", b"b1"), ("a", b"a2")]
        # Original ids: b is index 1 of the first batch.
        assert (got[0].message_id.ledger_id, got[0].message_id.entry_id, got[0].message_id.batch_index) == \
               (first.ledger_id, first.entry_id, 1)
        # Acks of the kept indexes acknowledge the whole entry (the compacted-out ones count as acked).
        for message in got:
            await consumer.acknowledge(message)
        sub = consumer._subscription
        assert sub.cursor.is_acked(first)
        # Compacting again (incrementally, from the view) keeps the same view.
        await producer.send(b"d1", key="d")
        await compact(broker)
        again = await attach(broker, TOPIC, "again")
        assert values(await drain(again)) == [("b", b"b1"), ("a", b"a2"), ("d", b"d1")]


async def test_read_committed_markers_aborted_and_open_txns(tmp_path):
    """Pulsar #21718/#21951: the last entry before compaction is a commit marker; an aborted
    txn's keyed messages must not appear; an open txn stays beyond the horizon; a reader with
    read_compacted is not stuck."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"a1", key="a")
        aborted = await broker.new_transaction()
        await producer.send(b"a-aborted", key="a", txn=aborted)
        await producer.send(b"z-aborted", key="z", txn=aborted)
        await aborted.abort()
        committed = await broker.new_transaction()
        await producer.send(b"b1", key="b", txn=committed)
        await committed.commit()                       # the last entry is its commit marker
        topic = await broker.service.get_topic(TOPIC)
        last = topic.ledger.read_entries_reverse(topic.ledger.lac, 1)[0]
        assert last.is_marker
        await compact(broker)
        assert topic.compaction.horizon == last.position
        reader = await attach(broker, TOPIC, reader=True)
        assert values(await drain(reader)) == [("a", b"a1"), ("b", b"b1")]
        # An open transaction: its messages stay beyond the horizon.
        open_txn = await broker.new_transaction()
        await producer.send(b"a-open", key="a", txn=open_txn)
        await producer.send(b"c1", key="c")
        horizon_before = topic.buffer.max_read_position()
        await compact(broker)
        assert topic.compaction.horizon == horizon_before < topic.ledger.lac
        fresh = await attach(broker, TOPIC, "fresh")
        assert values(await drain(fresh)) == [("a", b"a1"), ("b", b"b1")]
        await open_txn.commit()
        assert values(await drain(fresh)) == [("a", b"a-open"), ("c", b"c1")]
        await compact(broker)
        latest = await attach(broker, TOPIC, "latest")
        assert values(await drain(latest)) == [("b", b"b1"), ("a", b"a-open"), ("c", b"c1")]


async def test_compacted_view_survives_a_restart(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        for i in range(5):
            await producer.send(f"v{i}".encode(), key=f"k{i % 2}")
        await compact(broker)
        horizon = (await broker.service.get_topic(TOPIC)).compaction.horizon
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic = await broker.service.get_topic(TOPIC)
        assert topic.compaction.horizon == horizon
        assert topic.compaction.status_json()["status"] == "NOT_RUN"      # in memory, as Pulsar's
        consumer = await attach(broker, TOPIC)
        assert values(await drain(consumer)) == [("k1", b"v3"), ("k0", b"v4")]


async def test_read_compacted_refused_on_shared_and_running_twice(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"a", key="a")
        with pytest.raises(NotAllowedError, match="readCompacted only allowed on failover or exclusive"):
            await attach(broker, TOPIC, "shared", sub_type="shared")
        topic = await broker.service.get_topic(TOPIC)
        topic.compaction.trigger()
        with pytest.raises(CompactionAlreadyRunningError):
            topic.compaction.trigger()
        assert topic.compaction.status_json()["status"] == "RUNNING"
        await topic.compaction.wait()
        assert topic.compaction.status_json()["status"] == "SUCCESS"


async def test_seek_and_reader_from_a_message_id(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        ids = [await producer.send(f"v{i}".encode(), key=f"k{i}") for i in range(4)]
        await producer.send(b"v0b", key="k0")
        await compact(broker)
        topic = await broker.service.get_topic(TOPIC)
        reader = await attach(broker, TOPIC, reader=True, start=ids[2].position)
        assert values(await drain(reader)) == [("k2", b"v2"), ("k3", b"v3"), ("k0", b"v0b")]
        consumer = await attach(broker, TOPIC)
        assert len(await drain(consumer)) == 4
        await consumer.seek(MessageId.earliest)
        assert values(await drain(consumer)) == [("k1", b"v1"), ("k2", b"v2"), ("k3", b"v3"), ("k0", b"v0b")]
        assert topic.compaction.horizon is not None


async def test_view_holds_one_entry_per_key(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        topic = await broker.service.get_topic(TOPIC)
        for i in range(6):
            await producer.send(f"v{i}".encode(), key=f"k{i % 3}")
        await compact(broker)
        view = [e.position for e in topic.compaction.iter_view()]
        assert len(view) == 3
        consumer = await attach(broker, TOPIC)
        assert values(await drain(consumer)) == [("k0", b"v3"), ("k1", b"v4"), ("k2", b"v5")]
