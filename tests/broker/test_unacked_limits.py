"""Shared and Key_Shared subscriptions stop delivering at Pulsar's unacked-messages limits
(maxUnackedMessagesPerConsumer, maxUnackedMessagesPerSubscription): a consumer holding its
limit gets nothing more until acknowledgements bring it to half the limit (the subscription:
under half); messages are counted, not entries; redeliveries, transactional acks and a
consumer leaving give the count back; Exclusive subscriptions are not limited."""

import pytest

from pyengine.broker import Broker
from tests.broker.helpers import drain, publish_batch

T = "persistent://public/default/unacked-limits"


def consumer_stats(broker, name: str = "s") -> list[dict]:
    return broker.service.topics[T].subscriptions[name].stats()["consumers"]


async def publish(broker, count: int) -> None:
    producer = await broker.create_producer(T)
    for i in range(count):
        await producer.send(b"m%d" % i)


async def test_a_shared_consumer_at_its_limit_waits_until_half_is_acknowledged(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=10) as broker:
        await publish(broker, 30)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        first = await drain(consumer)
        assert len(first) == 10
        assert consumer_stats(broker)[0]["unackedMessages"] == 10
        assert consumer_stats(broker)[0]["blockedConsumerOnUnackedMsgs"] is True
        for message in first[:4]:
            await consumer.acknowledge(message)
        assert await drain(consumer) == []                    # 6 unacked: more than half
        await consumer.acknowledge(first[4])                  # 5: half the limit
        more = await drain(consumer)
        assert len(more) == 5                                 # up to the limit again
        assert [m.data for m in first + more] == [b"m%d" % i for i in range(15)]


async def test_the_subscription_limit_holds_across_its_consumers(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=0,
                               max_unacked_messages_per_subscription=10) as broker:
        await publish(broker, 30)
        a = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest", consumer_name="a")
        b = await broker.subscribe(T, "s", consumer_type="shared", consumer_name="b")
        got = await drain(a) + await drain(b)
        assert len(got) == 10
        assert broker.service.topics[T].subscriptions["s"].stats()["blockedSubscriptionOnUnackedMsgs"] is True
        for message in got[:5]:                               # (any consumer may acknowledge any)
            await a.acknowledge(message)
        assert await drain(a) + await drain(b) == []          # 5 unacked: not under half
        await a.acknowledge(got[5])                           # 4: under half
        assert len(await drain(a) + await drain(b)) == 6      # up to the limit again


async def test_exclusive_and_failover_subscriptions_are_not_limited(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=10,
                               max_unacked_messages_per_subscription=10) as broker:
        await publish(broker, 30)
        exclusive = await broker.subscribe(T, "e", consumer_type="exclusive", initial_position="earliest")
        failover = await broker.subscribe(T, "f", consumer_type="failover", initial_position="earliest")
        assert len(await drain(exclusive)) == 30
        assert len(await drain(failover)) == 30


async def test_zero_is_no_limit(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=0,
                               max_unacked_messages_per_subscription=0) as broker:
        await publish(broker, 30)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        assert len(await drain(consumer)) == 30
        assert consumer_stats(broker)[0]["blockedConsumerOnUnackedMsgs"] is False


async def test_redelivery_and_a_consumer_leaving_give_the_count_back(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=10) as broker:
        await publish(broker, 30)
        a = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest",
                                   consumer_name="a")
        assert len(await drain(a)) == 10
        await a.redeliver_unacknowledged_messages()           # the same 10 again, not 10 more held
        again = await drain(a)
        assert [m.data for m in again] == [b"m%d" % i for i in range(10)]
        assert consumer_stats(broker)[0]["unackedMessages"] == 10
        await a.close()
        b = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="b")
        assert [m.data for m in await drain(b)] == [b"m%d" % i for i in range(10)]


async def test_batches_count_their_messages_and_index_acks_lower_the_count(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=10) as broker:
        producer = await broker.create_producer(T)
        for i in range(5):
            await publish_batch(broker, producer, [b"b%d-%d" % (i, j) for j in range(4)])
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        got = await drain(consumer)
        assert len(got) == 12                                 # 3 batches: 12 >= 10, one entry past
        assert consumer_stats(broker)[0]["unackedMessages"] == 12
        for message in got[:6]:                               # batch 0 whole, half of batch 1
            await consumer.acknowledge(message)
        assert consumer_stats(broker)[0]["unackedMessages"] == 6
        assert await drain(consumer) == []
        await consumer.acknowledge(got[6])                    # 5 left: one index of batch 1
        assert len(await drain(consumer)) == 8                # the 2 batches left
        assert consumer_stats(broker)[0]["unackedMessages"] == 5 + 8


async def test_a_transactional_ack_lowers_the_count_and_an_abort_delivers_again(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=10) as broker:
        await publish(broker, 30)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        first = await drain(consumer)
        assert len(first) == 10
        txn = await broker.new_transaction()
        for message in first[:5]:
            await consumer.acknowledge(message, txn)
        more = await drain(consumer)                          # as Pulsar: counted off at the txn ack
        assert [m.data for m in more] == [b"m%d" % i for i in range(10, 15)]
        await txn.abort()
        assert await drain(consumer) == []                    # at the limit again: the 5 wait
        for message in first[5:]:
            await consumer.acknowledge(message)
        assert [m.data for m in await drain(consumer)] == [b"m%d" % i for i in range(5)]


@pytest.mark.parametrize("level", ["topic", "namespace"])
async def test_policies_override_the_broker_default(tmp_path, level):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        policies = broker.service.policies
        if level == "topic":
            await policies.set_topic_policy(T, "maxUnackedMessagesOnConsumer", 3)
        else:
            ns = policies.policies("public/default")
            ns.max_unacked_messages_per_consumer = 3
            await policies.set_policies("public/default", ns)
        await publish(broker, 10)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        assert len(await drain(consumer)) == 3


async def test_a_transactions_batch_index_acks_lower_the_count(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=10) as broker:
        producer = await broker.create_producer(T)
        for i in range(5):
            await publish_batch(broker, producer, [b"b%d-%d" % (i, j) for j in range(4)])
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        got = await drain(consumer)
        assert len(got) == 12
        txn = await broker.new_transaction()
        for message in got[:7]:                               # batch 0 whole, 3 indexes of batch 1
            await consumer.acknowledge(message, txn)
        assert len(await drain(consumer)) == 8                # 5 left: half the limit
        assert consumer_stats(broker)[0]["unackedMessages"] == 5 + 8


@pytest.mark.parametrize("level", ["topic", "namespace"])
async def test_a_raised_limit_set_through_the_policies_api_applies_at_once(tmp_path, level):
    """An embedding application changing BrokerPolicies directly (not through the admin REST
    API) wakes the blocked consumers too: the change, not its caller, refreshes the topics."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        policies = broker.service.policies

        async def set_limit(limit: int) -> None:
            if level == "topic":
                await policies.set_topic_policy(T, "maxUnackedMessagesOnConsumer", limit)
            else:
                ns = policies.policies("public/default")
                ns.max_unacked_messages_per_consumer = limit
                await policies.set_policies("public/default", ns)

        await set_limit(3)
        await publish(broker, 10)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        assert len(await drain(consumer)) == 3
        assert consumer_stats(broker)[0]["blockedConsumerOnUnackedMsgs"] is True
        await set_limit(8)                                    # no acknowledgement in between
        assert len(await drain(consumer)) == 5
