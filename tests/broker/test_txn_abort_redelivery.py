"""What an aborted transaction's acknowledgements give back: every message they held, each
delivered once more, also when a restart came between the acknowledgement and the abort."""

from pyengine.broker import Broker
from pyengine.transaction import TxnAction
from tests.broker.helpers import drain

T = "persistent://public/default/abort-redelivery"


async def test_aborting_a_cumulative_ack_replayed_after_a_restart_redelivers_all_it_covered(tmp_path):
    """After a restart the dispatcher passes over what a replayed cumulative ack holds; its
    abort must give back every message up to the acked one (Pulsar redelivers all unacked
    messages), not the acked one alone."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        for i in range(5):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(T, "s", consumer_type="exclusive", initial_position="earliest")
        received = await drain(consumer)
        txn = await broker.new_transaction()
        await consumer.acknowledge_cumulative(received[2], txn=txn)
        txn_id = txn.txn_id
    async with Broker.embedded(tmp_path) as broker:
        consumer = await broker.subscribe(T, "s", consumer_type="exclusive")
        assert [m.data for m in await drain(consumer)] == [b"m3", b"m4"]
        await broker.service.coordinator.end_transaction(txn_id, TxnAction.ABORT)
        again = await drain(consumer)
        # every unacknowledged message, in order (Exclusive: Pulsar rewinds), m3 and m4 too
        assert [m.data for m in again] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        for message in again[:3]:
            await consumer.acknowledge(message)
        assert broker.service.topics[T].subscriptions["s"].backlog() == 2      # m3, m4


async def test_an_abort_before_the_consumer_is_back_delivers_each_released_message_once(tmp_path):
    """A restart puts the read position back to the first unacknowledged entry: an abort that
    comes before the consumer does must not also queue the released entries for redelivery,
    or they are delivered twice."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        for i in range(3):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        received = await drain(consumer)
        txn = await broker.new_transaction()
        await consumer.acknowledge(received[1], txn=txn)
        txn_id = txn.txn_id
    async with Broker.embedded(tmp_path) as broker:
        await broker.service.get_topic(T)
        await broker.service.coordinator.end_transaction(txn_id, TxnAction.ABORT)
        consumer = await broker.subscribe(T, "s", consumer_type="shared")
        assert [m.data for m in await drain(consumer)] == [b"m0", b"m1", b"m2"]


async def test_an_aborted_ack_of_a_message_not_yet_dispatched_does_not_duplicate_it(tmp_path):
    """A transaction may acknowledge a message by id before the subscription dispatched it;
    once aborted, the message is delivered in its turn, once."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        ids = [await producer.send(b"m%d" % i) for i in range(4)]
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                          receiver_queue_size=1)
        txn = await broker.new_transaction()
        await consumer.acknowledge(ids[3], txn=txn)
        await txn.abort()
        assert [m.data for m in await drain(consumer)] == [b"m0", b"m1", b"m2", b"m3"]
