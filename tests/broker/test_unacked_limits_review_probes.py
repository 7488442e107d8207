"""Review probes of the unacked-messages limits (Shared, Key_Shared): a message is counted at
the one consumer that holds it, also across transactions; a blocked subscription still gives
out what it delivers again, as Pulsar's; no limit leaves a subscription blocked for good."""

import asyncio

from pyengine.broker import Broker
from tests.broker.helpers import drain, publish_batch

T = "persistent://public/default/unacked-review"


def subscription(broker, name: str = "s"):
    return broker.service.topics[T].subscriptions[name]


def unacked(broker) -> dict[str, int]:
    return {c.name: c.unacked_messages for c in subscription(broker).consumers}


async def publish(broker, count: int) -> None:
    producer = await broker.create_producer(T)
    for i in range(count):
        await producer.send(b"m%d" % i)


async def test_a_batch_given_back_by_an_abort_is_counted_only_where_it_goes_again(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=10) as broker:
        producer = await broker.create_producer(T)
        await publish_batch(broker, producer, [b"b%d" % j for j in range(10)])
        a = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest", consumer_name="a")
        got = await drain(a)
        txn = await broker.new_transaction()
        for message in got[:3]:
            await a.acknowledge(message, txn)
        b = await broker.subscribe(T, "s", consumer_type="shared", consumer_name="b")
        assert unacked(broker) == {"a": 7, "b": 0}              # a still blocked: 7 > 5
        await txn.abort()
        again_a, again_b = await drain(a), await drain(b)
        assert len(again_a) + len(again_b) == 10                # the whole batch again
        assert unacked(broker) == {"a": len(again_a), "b": len(again_b)}    # not 7 more at a


async def test_a_transactional_ack_by_another_consumer_frees_the_holder(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=10) as broker:
        await publish(broker, 10)
        a = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest", consumer_name="a")
        got = await drain(a)
        assert len(got) == 10
        b = await broker.subscribe(T, "s", consumer_type="shared", consumer_name="b")
        txn = await broker.new_transaction()
        for message in got[:5]:
            await b.acknowledge(message, txn)
        assert unacked(broker) == {"a": 5, "b": 0}
        await txn.abort()
        again = await drain(a) + await drain(b)
        assert sorted(m.data for m in again) == [b"m%d" % i for i in range(5)]
        assert sum(unacked(broker).values()) == 10


async def test_redeliveries_go_out_while_the_subscription_is_blocked(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=0,
                               max_unacked_messages_per_subscription=10) as broker:
        await publish(broker, 20)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                          negative_ack_redelivery_delay_ms=0)
        got = await drain(consumer)
        assert len(got) == 10
        for message in got[:3]:                                 # 7 left: still blocked
            await consumer.negative_acknowledge(message)
        assert [m.data for m in await drain(consumer)] == [b"m0", b"m1", b"m2"]
        assert subscription(broker).stats()["blockedSubscriptionOnUnackedMsgs"] is True


async def test_a_subscription_limit_of_one_gives_one_message_at_a_time(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=0,
                               max_unacked_messages_per_subscription=1) as broker:
        await publish(broker, 3)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        for i in range(3):
            got = await drain(consumer)
            assert [m.data for m in got] == [b"m%d" % i]
            await consumer.acknowledge(got[0])


async def test_a_consumer_limit_of_one_with_batches_gives_one_batch_at_a_time(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=1) as broker:
        producer = await broker.create_producer(T)
        for i in range(2):
            await publish_batch(broker, producer, [b"b%d-%d" % (i, j) for j in range(10)])
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        got = await drain(consumer)
        assert len(got) == 10
        for message in got[:9]:
            await consumer.acknowledge(message)
        assert await drain(consumer) == []
        await consumer.acknowledge(got[9])
        assert [m.data for m in await drain(consumer)] == [b"b1-%d" % j for j in range(10)]


async def test_the_subscription_is_not_shown_blocked_once_its_consumers_left(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=0,
                               max_unacked_messages_per_subscription=4) as broker:
        await publish(broker, 10)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        assert len(await drain(consumer)) == 4
        assert subscription(broker).stats()["blockedSubscriptionOnUnackedMsgs"] is True
        await consumer.close()
        await asyncio.sleep(0)
        assert subscription(broker).stats()["blockedSubscriptionOnUnackedMsgs"] is False


async def test_key_shared_other_keys_flow_past_a_blocked_consumer_and_its_key_keeps_order(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=2) as broker:
        a = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest", consumer_name="a")
        b = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="b")
        dispatcher = subscription(broker).dispatcher
        keys: dict[str, str] = {}
        for i in range(100):
            keys.setdefault(dispatcher._owner(dispatcher.key_hash(b"k%d" % i)).name, "k%d" % i)
        producer = await broker.create_producer(T)
        for i in range(6):
            await producer.send(b"a%d" % i, key=keys["a"])
            await producer.send(b"b%d" % i, key=keys["b"])
        held = await drain(a)
        assert [m.data for m in held] == [b"a0", b"a1"]         # a blocked from here
        for expected in ([b"b0", b"b1"], [b"b2", b"b3"], [b"b4", b"b5"]):
            got = await drain(b)
            assert [m.data for m in got] == expected
            for message in got:
                await b.acknowledge(message)
        await a.acknowledge(held[0])                            # 1 left: half the limit
        assert [m.data for m in await drain(a)] == [b"a2"]


async def test_a_transactional_index_ack_then_plain_index_acks_count_both(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await publish_batch(broker, producer, [b"b%d" % j for j in range(10)])
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        got = await drain(consumer)
        txn = await broker.new_transaction()
        await consumer.acknowledge(got[0], txn)
        await consumer.acknowledge(got[1])
        await consumer.acknowledge(got[2])
        assert list(unacked(broker).values()) == [7]
        await txn.commit()
        assert list(unacked(broker).values()) == [7]


async def test_key_shared_does_not_read_a_blocked_consumers_entries_again_on_every_pass(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=2) as broker:
        a = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest", consumer_name="a")
        b = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="b")
        dispatcher = subscription(broker).dispatcher
        keys: dict[str, str] = {}
        for i in range(100):
            keys.setdefault(dispatcher._owner(dispatcher.key_hash(b"k%d" % i)).name, "k%d" % i)
        producer = await broker.create_producer(T)
        for i in range(20):
            await producer.send(b"a%d" % i, key=keys["a"])
        for i in range(20):
            await producer.send(b"b%d" % i, key=keys["b"])
        held = await drain(a)
        assert len(held) == 2 and len(dispatcher.redeliveries) == 18      # a's key waits
        ledger = broker.service.topics[T].ledger
        reads: list = []
        read_entry = ledger.read_entry
        ledger.read_entry = lambda position: reads.append(position) or read_entry(position)
        for message in await drain(b):                          # a pass after each ack
            await b.acknowledge(message)
        await asyncio.sleep(0)
        assert reads == []                                      # a's 18 entries left unread
        for message in held:
            await a.acknowledge(message)
        assert [m.data for m in await drain(a)] == [b"a2", b"a3"]
