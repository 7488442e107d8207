"""Topic compaction: transactional acks of the compacted view's batches, and chunked messages."""

from __future__ import annotations

import time

from pyengine.broker import Broker
from pyengine.client import Client
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import headers_and_payload
from tests.broker.helpers import drain
from tests.client.conftest import NetworkBroker
from tests.broker.test_compaction import TOPIC, attach, compact, send_batch, values


async def compacted_batch(broker):
    """A batch a, b, c, d, then a and c again: the view keeps b and d of the batch (a and c
    compacted out). The read-compacted consumer, what it got, and the batch's position."""
    producer = await broker.create_producer(TOPIC)
    first = await send_batch(broker, producer, [("a", b"a1"), ("b", b"b1"), ("c", b"c1"), ("d", b"d1")])
    await send_batch(broker, producer, [("a", b"a2"), ("c", b"c2")])
    await compact(broker)
    consumer = await attach(broker, TOPIC)
    got = await drain(consumer)
    assert values(got) == [("b", b"b1"), ("d", b"d1"), ("a", b"a2"), ("c", b"c2")]
    return consumer, got, first


async def test_txn_acks_of_every_visible_message_of_a_view_batch_ack_the_entry(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer, got, first = await compacted_batch(broker)
        sub = consumer._subscription
        txn = await broker.new_transaction()
        await consumer.acknowledge(got[0], txn=txn)
        await consumer.acknowledge(got[1], txn=txn)
        # Everything the consumer saw of the batch is held: it is not its to redeliver.
        assert sub.pending_ack.is_fully_pending(first, 4)
        await txn.commit()
        assert sub.cursor.is_acked(first)
        await consumer.redeliver_unacknowledged_messages()
        assert values(await drain(consumer)) == [("a", b"a2"), ("c", b"c2")]


async def test_two_txns_each_acking_one_visible_message_of_a_view_batch(tmp_path):
    """The compacted-out indexes are taken by the first transaction only: the second does
    not conflict with it over messages neither saw."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer, got, first = await compacted_batch(broker)
        sub = consumer._subscription
        one, two = await broker.new_transaction(), await broker.new_transaction()
        await consumer.acknowledge(got[0], txn=one)
        await consumer.acknowledge(got[1], txn=two)
        await two.commit()
        assert not sub.cursor.is_acked(first)
        await one.commit()
        assert sub.cursor.is_acked(first)


async def test_an_aborted_txn_ack_of_a_view_batch_gives_back_only_what_was_seen(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer, got, first = await compacted_batch(broker)
        sub = consumer._subscription
        txn = await broker.new_transaction()
        await consumer.acknowledge(got[0], txn=txn)
        await consumer.acknowledge(got[1], txn=txn)
        await txn.abort()
        again = await drain(consumer)
        assert values(again)[:2] == [("b", b"b1"), ("d", b"d1")]
        # Acked plainly now: the entry is done (the compacted-out indexes came back free).
        await consumer.acknowledge(again[0])
        await consumer.acknowledge(again[1])
        assert sub.cursor.is_acked(first)


# --- chunked messages -------------------------------------------------------------------------

async def send_chunk(broker, producer, key: str | None, uuid: str, chunk_id: int, num_chunks: int,
                     payload: bytes, publish_time: int | None = None):
    """One chunk entry, as a chunking producer sends it (chunks are never batched)."""
    topic = broker.service.topics[producer.topic]
    sequence = producer._next_sequence
    producer._next_sequence += 1
    publish_time = publish_time if publish_time is not None else int(time.time() * 1000)
    metadata = message_metadata(producer.producer_name, sequence, publish_time, uuid=uuid, chunk_id=chunk_id,
                                num_chunks_from_msg=num_chunks, total_chunk_msg_size=len(payload) * num_chunks)
    if key is not None:
        metadata.partition_key = key
    return await topic.publish(producer._producer, headers_and_payload(metadata.SerializeToString(), payload),
                               sequence_id=sequence, publish_time=publish_time)


async def test_compaction_keeps_every_chunk_of_the_latest_chunked_message_of_a_key(tmp_path):
    """Pulsar's compactor takes each chunk for a message of its key, so only a chunked
    message's last chunk would be kept (a message no consumer can assemble). Ours keeps a key's
    latest chunked message whole, and an incomplete one at the horizon as it is, without
    letting it replace its key's value: the rest of it may follow the horizon."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        await send_chunk(broker, producer, "a", "u1", 0, 2, b"a1-0")
        await producer.send(b"b1", key="b")
        await send_chunk(broker, producer, "a", "u1", 1, 2, b"a1-1")          # a: u1, complete
        await send_chunk(broker, producer, "c", "u2", 0, 2, b"c1-0")
        await send_chunk(broker, producer, "c", "u2", 1, 2, b"c1-1")
        await producer.send(b"c2", key="c")                                 # c: superseded
        await send_chunk(broker, producer, "d", "u4", 0, 3, b"d1-0")
        await send_chunk(broker, producer, "d", "u4", 2, 3, b"d1-2")          # a gap: never whole
        await send_chunk(broker, producer, "a", "u3", 0, 3, b"a2-0")
        await send_chunk(broker, producer, "a", "u3", 1, 3, b"a2-1")          # incomplete at the horizon
        await compact(broker)
        consumer = await attach(broker, TOPIC)
        assert [m.data for m in await drain(consumer)] == [b"a1-0", b"b1", b"a1-1", b"c2", b"a2-0", b"a2-1"]
        await send_chunk(broker, producer, "a", "u3", 2, 3, b"a2-2")          # u3 completes: a is u3
        await compact(broker)
        latest = await attach(broker, TOPIC, "latest")
        assert [m.data for m in await drain(latest)] == [b"b1", b"c2", b"a2-0", b"a2-1", b"a2-2"]


async def test_an_incomplete_chunked_message_abandoned_before_the_horizon_is_left_out(tmp_path):
    """An incomplete chunked message whose last chunk is older than the client's expiry of
    incomplete chunked messages (60 s) before the newest message compacted is abandoned
    (its producer is gone): a consumer would drop it, and it is not kept."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        now = int(time.time() * 1000)
        await send_chunk(broker, producer, "a", "u1", 0, 2, b"a1-0", publish_time=now - 61_000)
        await send_chunk(broker, producer, "e", "u2", 0, 2, b"e1-0", publish_time=now - 59_000)
        await producer.send(b"b1", key="b")
        await compact(broker)
        consumer = await attach(broker, TOPIC)
        assert [m.data for m in await drain(consumer)] == [b"e1-0", b"b1"]


async def test_a_read_compacted_consumer_receives_chunked_messages_whole(tmp_path):
    """End to end, with our client's chunking: a broker with a small max_message_size."""
    limit = 10_000
    network_broker = NetworkBroker(tmp_path / "data", max_message_size=limit)
    await network_broker.start()
    try:
        async with Client(network_broker.url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer(TOPIC, chunking_enabled=True, producer_name="p")
            big = {name: bytes([n]) * (limit * 3 + n) for n, name in enumerate(["a1", "a2", "c1"])}
            await producer.send(big["a1"], key="a")
            await producer.send(b"b1", key="b")
            await producer.send(big["a2"], key="a")
            await producer.send(big["c1"], key="c")
            await producer.send(b"c2", key="c")
            topic = network_broker.service.topics[TOPIC]
            topic.compaction.trigger()
            await topic.compaction.wait()
            assert topic.compaction.status_json()["status"] == "SUCCESS"
            consumer = await client.subscribe(TOPIC, "s", read_compacted=True,
                                              initial_position="earliest")
            got = [await consumer.receive(5) for _ in range(3)]
            assert [(m.key, m.data) for m in got] == [("b", b"b1"), ("a", big["a2"]), ("c", b"c2")]
            try:
                extra = await consumer.receive(0.3)
            except TimeoutError:
                extra = None
            assert extra is None
    finally:
        await network_broker.stop()
