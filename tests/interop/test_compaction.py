"""Topic compaction with the official client (pulsar-client), as its own compaction test does:
produce keyed messages, trigger compaction over REST, read with read_compacted: only the latest
value of each key (tombstones delete, messages without key are not kept)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pulsar
import pytest

from pyengine.client import Client
from pyengine.client.message import MessageId

P = "/admin/v2/persistent/public/default"


def compacted(broker, name: str) -> None:
    broker.admin("PUT", f"{P}/{name}/compaction")
    for _ in range(500):
        status = broker.admin("GET", f"{P}/{name}/compaction")
        if status["status"] != "RUNNING":
            assert status == {"status": "SUCCESS", "lastError": ""}, status
            return
        time.sleep(0.01)
    raise AssertionError("compaction never ended")


def read_all(consumer, timeout_ms: int = 1000) -> list[tuple[str, bytes]]:
    out = []
    while True:
        try:
            message = consumer.read_next(timeout_ms) if isinstance(consumer, pulsar.Reader) \
                else consumer.receive(timeout_ms)
        except pulsar.Timeout:
            return out
        out.append((message.partition_key(), message.data()))
        if not isinstance(consumer, pulsar.Reader):
            consumer.acknowledge(message)


@pytest.mark.parametrize("batching", [False, True])
def test_reader_and_consumer_read_compacted(broker, official, batching):
    name = f"compact-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/default/{name}"
    producer = official.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=50)
    for i in range(10):
        producer.send_async(b"v%d" % i, None, partition_key="k%d" % (i % 3))
    producer.send_async(b"nokey", None)
    producer.send_async(b"", None, partition_key="k2")          # tombstone
    producer.flush()
    producer.send(b"last", partition_key="k0")
    compacted(broker, name)
    expected = [("k1", b"v7"), ("k0", b"last")]
    reader = official.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert reader.has_message_available()
    assert read_all(reader) == expected
    reader.close()
    consumer = official.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest,
                                  is_read_compacted=True)
    assert read_all(consumer) == expected
    producer.send(b"after", partition_key="k1")
    assert read_all(consumer) == [("k1", b"after")]
    consumer.close()
    # Not read compacted: everything.
    everything = official.create_reader(topic, pulsar.MessageId.earliest)
    assert len(read_all(everything)) == 14
    producer.close()


def test_read_compacted_refused_on_a_shared_subscription(broker, official):
    topic = f"persistent://public/default/compact-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception):
        official.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared, is_read_compacted=True)


async def test_reader_not_stuck_when_the_last_entry_is_a_commit_marker(broker, official):
    """Pulsar #21718/#21951: a read-compacted reader whose topic ends with a transaction
    marker (and an aborted txn's keyed messages) gets exactly the committed latest values,
    and is not left waiting. The transactions come from pyengine's client (this official
    client has none); the official reader and pyengine's reader (read_compacted=True) read."""
    name = f"compact-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/default/{name}"
    async with Client(broker.url) as client:
        producer = await client.create_producer(topic)
        await producer.send(b"a1", key="a")
        aborted = await client.new_transaction()
        await producer.send(b"a-aborted", key="a", txn=aborted)
        await producer.send(b"z-aborted", key="z", txn=aborted)
        await aborted.abort()
        committed = await client.new_transaction()
        await producer.send(b"b1", key="b", txn=committed)
        await committed.commit()
        await asyncio.sleep(0.2)
        await asyncio.to_thread(compacted, broker, name)
        own = await client.create_reader(topic, MessageId.earliest, read_compacted=True)
        got = []
        while await own.has_message_available():
            message = await own.read_next(timeout=5)
            got.append((message.partition_key, message.data))
        assert got == [("a", b"a1"), ("b", b"b1")]
        await own.close()

    def official_read():
        reader = official.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        try:
            assert read_all(reader) == [("a", b"a1"), ("b", b"b1")]
            assert not reader.has_message_available()
        finally:
            reader.close()
    await asyncio.to_thread(official_read)
