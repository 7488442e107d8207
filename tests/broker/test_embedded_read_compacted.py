"""The embedded API's read-compacted consumers and readers: `subscribe(..., read_compacted=True)`,
`create_reader(..., read_compacted=True)`, and a seek by publish time that looks in the
compacted view (as the wire server's SEEK does)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.client.message import MessageId
from pyengine.errors import NotAllowedError
from tests.broker.helpers import drain
from tests.broker.test_compaction import TOPIC, compact, values
from tests.broker.test_compaction_review_probes import hold, trimming


async def fill(broker):
    producer = await broker.create_producer(TOPIC)
    for i in range(4):
        await producer.send(f"v{i}".encode(), key=f"k{i % 2}")
        await asyncio.sleep(0.005)                            # distinct publish times
    return producer


async def test_subscribe_read_compacted_gets_the_view_then_the_topic(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await fill(broker)
        await compact(broker)
        await producer.send(b"v4", key="k0")                  # after the horizon
        consumer = await broker.subscribe(TOPIC, "s", initial_position="earliest", read_compacted=True)
        assert values(await drain(consumer)) == [("k0", b"v2"), ("k1", b"v3"), ("k0", b"v4")]
        plain = await broker.subscribe(TOPIC, "plain", initial_position="earliest")
        assert len(await drain(plain)) == 5                   # the default: every message


async def test_create_reader_read_compacted(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await fill(broker)
        await compact(broker)
        reader = await broker.create_reader(TOPIC, MessageId.earliest, read_compacted=True)
        assert values(await drain(reader)) == [("k0", b"v2"), ("k1", b"v3")]
        plain = await broker.create_reader(TOPIC, MessageId.earliest)
        assert len(await drain(plain)) == 4


async def test_read_compacted_is_refused_on_shared_subscriptions_and_must_be_a_bool(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        with pytest.raises(NotAllowedError, match="readCompacted only allowed"):
            await broker.subscribe(TOPIC, "s", consumer_type="shared", read_compacted=True)
        with pytest.raises(TypeError):
            await broker.subscribe(TOPIC, "s", read_compacted=1)
        with pytest.raises(TypeError):
            await broker.create_reader(TOPIC, MessageId.earliest, read_compacted="yes")
        consumer = await broker.subscribe(TOPIC, "s", consumer_type="failover", read_compacted=True)
        await consumer.close()


async def test_seek_by_publish_time_inside_the_view_below_the_stored_ledgers(tmp_path):
    async with Broker.embedded(tmp_path, **trimming()) as broker:
        await hold(broker)
        producer = await broker.create_producer(TOPIC)
        ids = []
        for i in range(7):
            ids.append(await producer.send(f"v{i}".encode(), key=f"k{i}"))
            await asyncio.sleep(0.005)
        await producer.send(b"v0b", key="k0")
        topic = await compact(broker)
        await topic.ledger.trim()
        assert topic.ledger.first_position() > ids[3].position
        consumer = await broker.subscribe(TOPIC, "s", initial_position="earliest", read_compacted=True)
        got = await drain(consumer)
        assert len(got) == 7
        await consumer.seek(got[1].publish_time)              # k2's: in a ledger trimmed since
        assert [k for k, _ in values(await drain(consumer))] == ["k2", "k3", "k4", "k5", "k6", "k0"]
        # the first stored entry's time: from there, not from the start of the view
        assert got[5].message_id.position == topic.ledger.first_position()        # k6's
        await consumer.seek(got[5].publish_time)
        assert [k for k, _ in values(await drain(consumer))] == ["k6", "k0"]
        # a reader too
        reader = await broker.create_reader(TOPIC, MessageId.earliest, read_compacted=True)
        assert len(await drain(reader)) == 7
        await reader.seek(got[2].publish_time)                # k3's
        assert [k for k, _ in values(await drain(reader))] == ["k3", "k4", "k5", "k6", "k0"]


async def test_seek_by_publish_time_does_not_go_back_to_the_view_start(tmp_path):
    """A time after every message of the view but the last: not rewound to its first entry
    (the seek is not taken for one to the earliest position)."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await fill(broker)
        await compact(broker)
        consumer = await broker.subscribe(TOPIC, "s", initial_position="earliest", read_compacted=True)
        got = await drain(consumer)
        assert values(got) == [("k0", b"v2"), ("k1", b"v3")]
        await consumer.seek(got[1].publish_time)
        assert values(await drain(consumer)) == [("k1", b"v3")]
        await consumer.seek(MessageId.earliest)
        assert values(await drain(consumer)) == [("k0", b"v2"), ("k1", b"v3")]
