"""Transactions the pending-ack handle ends on its own — a v5 decision it watches, a v4
transaction left below its coordinator's low watermark — must give back every message their
acknowledgements held, as an abort through the coordinator's END_TXN_ON_SUBSCRIPTION does:
for a cumulative ack, everything up to the acked message, not that message alone. A commit it
applies on its own leaves a batch it acknowledged part of in flight, as END_TXN's does."""

import pytest

from pyengine.broker import Broker
from pyengine.client import MessageId
from pyengine.transaction import TxnAction
from tests.broker.helpers import drain, publish_batch

SEGMENT = "segment://public/default/self-abort/0000-ffff-0"
T = "persistent://public/default/self-abort"


async def _receive(consumer, count: int) -> list[bytes]:
    return [(await consumer.receive(timeout=5)).data for _ in range(count)]


async def test_aborting_a_v5_cumulative_ack_redelivers_everything_it_covered(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(SEGMENT)
        for i in range(5):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(SEGMENT, "s", consumer_type="exclusive", initial_position="earliest")
        received = await drain(consumer)
        assert len(received) == 5
        txn = await broker.new_transaction(version=5)
        await consumer.acknowledge_cumulative(received[2], txn=txn)
        await txn.abort()
        # Exclusive: the stream again from the first unacknowledged message, in order (Pulsar's
        # single-active dispatcher rewinds), m3 and m4 delivered already included.
        assert await _receive(consumer, 5) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        assert await drain(consumer) == []
        retry = await broker.new_transaction(version=5)
        await consumer.acknowledge_cumulative(received[2], txn=retry)
        await retry.commit()
        await broker.service.topics[SEGMENT].subscriptions["s"].pending_ack.wait_materialised()
        assert broker.service.topics[SEGMENT].subscriptions["s"].backlog() == 2          # m3, m4


async def test_a_stale_cumulative_ack_aborted_by_the_low_watermark_redelivers_all_it_covered(tmp_path):
    async with Broker.embedded(tmp_path, num_coordinators=1) as broker:
        producer = await broker.create_producer(T)
        for i in range(5):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(T, "s", consumer_type="exclusive", initial_position="earliest")
        received = await drain(consumer)
        assert len(received) == 5
        older = await broker.new_transaction()                   # keeps the low watermark down
        stale = await broker.new_transaction()
        assert older.txn_id.most_bits == stale.txn_id.most_bits
        await consumer.acknowledge(received[4], txn=stale)       # registers the subscription
        # The coordinator aborts `stale` (as on its timeout) while a cumulative ack of it is on
        # its way: registered just before the abort, it reaches the subscription after it (the
        # client APIs refuse a later ack: this is the race), and nothing will end it but the
        # handle.
        await broker.service.coordinator.end_transaction(stale.txn_id, TxnAction.ABORT)
        assert await _receive(consumer, 5) == [b"m0", b"m1", b"m2", b"m3", b"m4"]     # in order again
        subscription = broker.service.topics[T].subscriptions["s"]
        await subscription.ack_with_transaction(consumer._consumer, stale.txn_id,
                                                cumulative=received[2].message_id.position)
        assert await drain(consumer) == []
        await consumer.acknowledge(received[3], txn=older)
        await older.commit()
        later = await broker.new_transaction()
        await consumer.acknowledge(received[4], txn=later)
        await later.commit()          # its end here carries a low watermark past `stale`
        assert await _receive(consumer, 3) == [b"m0", b"m1", b"m2"]
        assert await drain(consumer) == []


@pytest.mark.parametrize("topic,version", [(T, 4), (SEGMENT, 5)])
async def test_a_commit_of_part_of_a_batch_leaves_the_rest_to_be_delivered_again(tmp_path, topic, version):
    # Found by the scalable soak's consume-transform-produce: a v5 commit reported the entry
    # acknowledged, its consumer no longer held it, and once that consumer left (after a
    # conflict) nobody got the batch's other messages again.
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(topic)
        first = await broker.subscribe(topic, "s", consumer_type="shared", initial_position="earliest")
        await publish_batch(broker, producer, [b"m0", b"m1", b"m2"])
        received = await drain(first)
        assert [m.data for m in received] == [b"m0", b"m1", b"m2"]
        second = await broker.subscribe(topic, "s", consumer_type="shared")
        txn = await broker.new_transaction(version=version)
        await first.acknowledge(received[0], txn=txn)
        await txn.commit()
        subscription = broker.service.topics[topic].subscriptions["s"]
        if version == 5:
            await subscription.pending_ack.wait_materialised()
        await first.close()
        again = await drain(second)
        assert sorted(m.data for m in again) == [b"m1", b"m2"]
        retry = await broker.new_transaction(version=version)
        for message in again:
            await second.acknowledge(message, txn=retry)
        await retry.commit()
        if version == 5:
            await subscription.pending_ack.wait_materialised()
        assert subscription.cursor.is_acked(received[0].message_id.position)
        assert await drain(second) == []


async def test_a_v5_commit_leaves_nothing_for_a_later_abort_to_give_back(tmp_path):
    # A v5 commit reaches the subscription through the handle, not END_TXN: what its acks took
    # from the consumers stayed recorded, and the next abort gave it back as an ended txn's
    # (m0 delivered again while its consumer held it after the seek).
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(SEGMENT)
        for i in range(3):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(SEGMENT, "s", consumer_type="shared", initial_position="earliest")
        received = await drain(consumer)
        assert [m.data for m in received] == [b"m0", b"m1", b"m2"]
        subscription = broker.service.topics[SEGMENT].subscriptions["s"]
        committed = await broker.new_transaction(version=5)
        await consumer.acknowledge(received[0], txn=committed)
        assert committed.txn_id in subscription._reserved_by_txn
        await committed.commit()
        await subscription.pending_ack.wait_materialised()
        assert subscription._reserved_by_txn == {}          # nothing kept per committed txn
        await consumer.seek(MessageId.earliest)
        again = await drain(consumer)
        assert [m.data for m in again] == [b"m0", b"m1", b"m2"]
        aborted = await broker.new_transaction(version=5)
        await consumer.acknowledge(again[1], txn=aborted)
        await aborted.abort()
        await subscription.pending_ack.wait_materialised()
        assert [m.data for m in await drain(consumer)] == [b"m1"]
        assert subscription._reserved_by_txn == {}
