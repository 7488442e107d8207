"""Dispatcher behaviours no other test pinned down (found by mutation testing): each test
fails with one small change of pyengine/broker/dispatcher.py that the rest of the suite let
through."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.broker.consumer import Consumer
from pyengine.client.message import MessageId
from pyengine.transaction.pendingack import IndividualAck
from tests.broker.test_dispatch_a_failing_consumer_strands_no_other import Sink
from tests.broker.test_key_shared_look_ahead import settle
from tests.waiting import eventually

from .helpers import drain, publish_batch

T = "persistent://public/default/dispatcher-gaps"


async def test_a_reader_subscription_skips_entries_acked_before_it_reads_them(tmp_path):
    """A non-durable subscription (no pending-ack handle to pass over acknowledged entries):
    an entry acknowledged by id before the dispatcher reads it is never delivered (Pulsar's
    cursor reads skip individually deleted entries)."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        ids = [await producer.send(b"m%d" % i) for i in range(4)]
        topic = broker.service.topics[T]
        sink = Sink()
        consumer = Consumer(sink, name="c")
        sub = await topic.subscribe("r", consumer, sub_type="shared", durable=False, start=ids[0].position)
        assert sub.pending_ack is None
        sub.flow(consumer, 1)
        await settle(sub.dispatcher)
        assert [d.entry.position for d in sink.got] == [ids[0].position]
        await sub.ack_individual(consumer, [IndividualAck(ids[0].position), IndividualAck(ids[2].position)])
        sub.flow(consumer, 10)
        await settle(sub.dispatcher)
        assert [d.entry.position for d in sink.got] == [ids[0].position, ids[1].position, ids[3].position]


async def test_an_aborted_ack_of_the_next_entry_to_read_does_not_duplicate_it(tmp_path):
    """A transaction acknowledges, by id, the very entry the cursor reads next (not yet
    dispatched: the consumer has no permits); once aborted, that entry is read in its turn
    and delivered once, not also queued for redelivery."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        ids = [await producer.send(b"m%d" % i) for i in range(4)]
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                          receiver_queue_size=1)
        subscription = broker.service.topics[T].subscriptions["s"]
        await eventually(lambda: subscription.cursor.read_position == ids[1].position)
        txn = await broker.new_transaction()
        await consumer.acknowledge(ids[1], txn=txn)
        await txn.abort()
        assert [m.data for m in await drain(consumer)] == [b"m0", b"m1", b"m2", b"m3"]


@pytest.mark.parametrize(("partition", "active"), [(0, "a"), (1, "b"), (2, "a"), (5, "b")])
async def test_failover_partitions_are_spread_over_the_consumers_by_their_index(tmp_path, partition, active):
    """Pulsar's pickAndScheduleActiveConsumer: a partition's active consumer is the one at
    its index (modulo their number) in name order, so the partitions of a Failover
    subscription are spread over its consumers, not all given to the first name."""
    topic = f"{T}-partition-{partition}"
    async with Broker.embedded(tmp_path, sync=False, active_consumer_failover_delay_time_ms=0) as broker:
        b = await broker.subscribe(topic, "s", consumer_type="failover", consumer_name="b")
        a = await broker.subscribe(topic, "s", consumer_type="failover", consumer_name="a")
        assert {"a": a, "b": b}[active].active
        assert not {"a": b, "b": a}[active].active


async def test_a_seek_takes_back_the_permits_the_consumer_had_left(tmp_path):
    """A seek resets the stream: the consumer's receiver queue is emptied and filled again
    from the new position, so the permits it still had are taken back before it flows its
    whole queue again (else it is given more than its queue holds)."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        for i in range(2):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                          receiver_queue_size=4)
        subscription = broker.service.topics[T].subscriptions["s"]
        (held,) = subscription.consumers
        await eventually(lambda: len(held.pending) == 2)
        assert held.permits == 2                      # 4 given, 2 used
        await consumer.seek(MessageId.earliest)
        (held,) = subscription.consumers
        for i in range(2, 8):
            await producer.send(b"m%d" % i)
        await eventually(lambda: held.permits == 0)
        assert len(held.pending) == 4                 # its queue's worth, from the start again
        assert [m.data for m in await drain(consumer)] == [b"m%d" % i for i in range(8)]


async def test_key_shared_stops_reading_when_no_consumer_can_take_more(tmp_path):
    """Key_Shared: an entry whose key's consumer is busy is held back only while another
    consumer can take entries (the read goes on for it); when none can, reading stops at that
    entry, as Pulsar's, instead of reading on and holding what nobody can be given."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        ids = [await producer.send(b"m%d" % i, key="k%d" % (i % 3)) for i in range(10)]
        consumer = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest",
                                          receiver_queue_size=2)
        subscription = broker.service.topics[T].subscriptions["s"]
        (held,) = subscription.consumers
        await eventually(lambda: held.permits <= 0 and len(held.pending) == 2)
        assert subscription.cursor.read_position == ids[2].position
        assert len(subscription.dispatcher.redeliveries) == 0
        assert [m.data for m in await drain(consumer)] == [b"m%d" % i for i in range(10)]


async def test_messages_of_a_consumer_that_left_come_again_with_no_redelivery_count(tmp_path):
    """Shared: what a consumer held unacknowledged when it left goes to the others as it was,
    its redelivery count not raised (Pulsar's removeConsumer adds it to the replays with
    redeliveryTracker.addIfAbsent): only negative acks and ack timeouts count, so a dead
    letter policy does not count consumers that crashed or closed."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        for i in range(3):
            await producer.send(b"m%d" % i)
        leaving = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        assert [m.data for m in await drain(leaving)] == [b"m0", b"m1", b"m2"]       # none acked
        staying = await broker.subscribe(T, "s", consumer_type="shared")
        await leaving.close()
        again = await drain(staying)
        assert sorted(m.data for m in again) == [b"m0", b"m1", b"m2"]
        assert [m.redelivery_count for m in again] == [0, 0, 0]


async def test_a_seek_back_delivers_the_acked_indexes_of_a_batch_again(tmp_path):
    """A seek before a partly acknowledged batch makes all of it unacknowledged (Pulsar's
    resetCursor clears the batch-deleted indexes): every message of the batch comes again,
    not only those left unacknowledged before the seek."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"first")
        await publish_batch(broker, producer, [b"b0", b"b1", b"b2", b"b3"])
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        received = await drain(consumer)
        assert [m.data for m in received] == [b"first", b"b0", b"b1", b"b2", b"b3"]
        for message in received[1:3]:
            await consumer.acknowledge(message)          # b0, b1: the batch is partly acked
        await consumer.seek(MessageId.earliest)
        assert [m.data for m in await drain(consumer)] == [b"first", b"b0", b"b1", b"b2", b"b3"]
