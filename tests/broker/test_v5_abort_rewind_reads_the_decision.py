"""An aborted v5 transaction's cumulative acknowledgement rewinds an Exclusive/Failover
consumer in order, as a v4 one does, also when the rewind reaches the subscription before the
header watch tells it of the abort (PIP-473: the abort is one CAS on the txn header, which the
segment's pending acks learn later). The rewind has the pending acks read the headers of the
txns holding acks there and apply their decisions first; before, the messages the aborted
cumulative ack held came back after the later ones (or, with the client's rewind left out on
v5, after its queued messages)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.broker.consumer import NO_CONSUMER_EPOCH
from pyengine.transaction import TxnAction
from tests.broker.helpers import drain

SEGMENT = "segment://public/default/v5-rewind/0000-ffff-0"


def hold_header_watch(service) -> list:
    """The broker's v5 header watch keeps its notifications from now on (returned): nobody
    hears of a decision through it."""
    held: list = []
    service.v5.headers._on_notification = held.append
    return held


async def acked_cumulatively_in_a_txn(broker, consumer_type: str):
    """m0..m9 stored; a consumer received m0..m4 and acked m4 cumulatively in an open v5 txn."""
    producer = await broker.create_producer(SEGMENT)
    for i in range(10):
        await producer.send(b"m%d" % i)
    consumer = await broker.subscribe(SEGMENT, "s", consumer_type=consumer_type, initial_position="earliest")
    received = [await consumer.receive(timeout=5) for _ in range(5)]
    assert [m.data for m in received] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    txn = await broker.new_transaction(version=5)
    await consumer.acknowledge_cumulative(received[4], txn=txn)
    return consumer, txn


def release_header_watch(service, held: list) -> None:
    headers = service.v5.headers
    del headers._on_notification
    for notification in held:
        headers._on_notification(notification)


@pytest.mark.parametrize("consumer_type", ["exclusive", "failover"])
async def test_an_abort_rewinds_in_order_before_the_header_watch_fires(tmp_path, consumer_type):
    async with Broker.embedded(tmp_path) as broker:
        consumer, txn = await acked_cumulatively_in_a_txn(broker, consumer_type)
        held = hold_header_watch(broker.service)
        await txn.abort()
        again = await drain(consumer)
        assert [m.data for m in again] == [b"m%d" % i for i in range(10)]
        assert all(m.redelivery_count == 0 for m in again)          # single-active: no counts
        # The watch's notification, late, finds the abort applied: nothing comes twice.
        release_header_watch(broker.service, held)
        subscription = broker.service.topics[SEGMENT].subscriptions["s"]
        await subscription.pending_ack.wait_materialised()
        assert await drain(consumer) == []
        assert subscription.pending_ack.stats()["transactions"] == {}


async def test_a_rewind_with_no_v5_acks_pending_reads_nothing(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(SEGMENT)
        for i in range(3):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(SEGMENT, "s", consumer_type="exclusive", initial_position="earliest")
        assert len(await drain(consumer)) == 3
        store = broker.service.v5.store
        reads = []
        original_get = store.get

        async def counted_get(path, *args, **kwargs):
            reads.append(path)
            return await original_get(path, *args, **kwargs)

        store.get = counted_get
        try:
            subscription = broker.service.topics[SEGMENT].subscriptions["s"]
            assert subscription.redeliver_unacknowledged(consumer._consumer) is None      # done at once
            await consumer.redeliver_unacknowledged_messages()
            assert [m.data for m in await drain(consumer)] == [b"m0", b"m1", b"m2"]
            assert reads == []
        finally:
            del store.get


async def test_flows_and_redeliveries_wait_behind_a_rewind_in_order(tmp_path):
    # The consumer asks again (a newer epoch) while its first rewind waits for the store: the
    # second applies after the first, and the stream comes once, in order, under the newest.
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(SEGMENT)
        for i in range(6):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(SEGMENT, "s", consumer_type="failover", initial_position="earliest")
        received = [await consumer.receive(timeout=5) for _ in range(3)]
        txn = await broker.new_transaction(version=5)
        await consumer.acknowledge_cumulative(received[2], txn=txn)
        hold_header_watch(broker.service)
        await broker.service.coordinator.end_transaction(txn.txn_id, TxnAction.ABORT)   # no client rewind
        subscription = broker.service.topics[SEGMENT].subscriptions["s"]
        broker_consumer = consumer._consumer
        assert broker_consumer.consumer_epoch == NO_CONSUMER_EPOCH
        first = consumer._redeliver_all()
        second = consumer._redeliver_all()
        assert first is not None and second is not None and not first.done()
        waiting = subscription._rewinding[broker_consumer]
        # the second redelivery, and its permits set aside: those it had left, and those of the
        # 3 received and the 3 queued (dropped) it gave back: its whole receiver queue (1000)
        assert len(waiting.redeliveries) == 1 and waiting.permits == 1000
        assert broker_consumer.permits == 0
        assert broker_consumer.consumer_epoch == NO_CONSUMER_EPOCH       # not before it rewinds
        await first
        await second
        assert broker_consumer.consumer_epoch == consumer._epoch == NO_CONSUMER_EPOCH + 2
        assert [m.data for m in await drain(consumer)] == [b"m%d" % i for i in range(6)]
        assert subscription._rewinding == {}


@pytest.mark.parametrize("consumer_type", ["exclusive", "failover"])
async def test_nothing_goes_out_while_a_rewind_waits(tmp_path, consumer_type):
    """While the rewind waits for the store, the header watch may apply the abort: the messages
    it releases went out at once, under the epoch the rewind is about to end, and came again
    with the rewind. A client that drops what an older epoch carried (PIP-84) threw them away;
    one that sends no epoch (older clients) received them more than once. The consumer's permits
    are now set aside for the wait: nothing goes to it until the rewind."""
    async with Broker.embedded(tmp_path) as broker:
        consumer, txn = await acked_cumulatively_in_a_txn(broker, consumer_type)
        held = hold_header_watch(broker.service)
        await broker.service.coordinator.end_transaction(txn.txn_id, TxnAction.ABORT)   # no client rewind
        subscription = broker.service.topics[SEGMENT].subscriptions["s"]
        broker_consumer = consumer._consumer
        sent: list[bytes] = []
        deliver = broker_consumer.sink.deliver

        def recorded(deliveries):
            sent.extend(bytes(d.entry.data) for d in deliveries)
            deliver(deliveries)

        broker_consumer.sink.deliver = recorded
        headers = broker.service.v5.headers
        reading, store_read = asyncio.Event(), asyncio.Event()
        get = headers.get

        async def slow_get(*args, **kwargs):
            reading.set()
            await store_read.wait()
            return await get(*args, **kwargs)

        headers.get = slow_get
        rewind = consumer._redeliver_all()
        await asyncio.wait_for(reading.wait(), 5)           # the rewind reads the header
        release_header_watch(broker.service, held)          # the watch applies the abort meanwhile
        await subscription.pending_ack.wait_materialised()
        await asyncio.sleep(0.05)
        assert not rewind.done()
        assert sent == []                                   # nothing under the epoch being ended
        store_read.set()
        await rewind
        assert [m.data for m in await drain(consumer)] == [b"m%d" % i for i in range(10)]
        assert len(sent) == 10                              # each entry went once
