"""Inactive topic deletion (pyengine.broker.inactive; Pulsar's brokerDeleteInactiveTopics* and
InactiveTopicPolicies): what counts as active, the duration and the retention time that must
pass, the policies' precedence, and a deletion that races a client or an admin deletion."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import pytest

from pyengine.broker import Broker
from pyengine.broker.inactive import collectable
from pyengine.broker.policies import InactiveTopicPolicies, Retention
from pyengine.client import MessageId
from pyengine.errors import TopicNotFoundError
from pyengine.naming import TopicName
from pyengine.transaction.coordinator.clock import wall_clock_ms
from tests.broker.helpers import subscribing_from_earliest
from tests.transaction.coordinator.fakes import FakeClock

T = "persistent://public/default/idle"
MINUTE_MS = 60_000


@pytest.fixture
def clock():
    return FakeClock(wall_clock_ms())


def broker_with(tmp_path, clock, **config):
    """A broker whose inactive-topic check runs only when a test asks (`check`), deleting a
    topic inactive for a minute, with no retention."""
    config = {"sync": False, "clock": clock, "retention": Retention(0, 0), "delete_inactive_topics_frequency_s": 86400,
              "delete_inactive_topics_max_inactive_duration_s": 60, **config}
    return Broker.embedded(tmp_path, **config)


async def check(broker) -> None:
    await broker.service.inactive_topics.check_now()


async def used(broker, topic: str = T) -> None:
    producer = await broker.create_producer(topic)
    await producer.send(b"m")
    await producer.close()


def exists(broker, topic: str = T) -> bool:
    return broker.service.topic_exists(topic)


async def test_a_topic_nobody_uses_is_deleted_once_inactive_for_the_duration(tmp_path, clock):
    async with broker_with(tmp_path, clock) as broker:
        await used(broker)
        await check(broker)
        clock.advance(59_999)
        await check(broker)
        assert exists(broker)
        clock.advance(1)
        await check(broker)
        assert not exists(broker) and T not in broker.service.topics
        # Its next use creates it afresh: the old message is gone.
        reader = await broker.create_reader(T, MessageId.earliest)
        assert not await reader.has_message_available()


async def test_the_default_unlimited_retention_keeps_an_inactive_topic(tmp_path, clock):
    async with broker_with(tmp_path, clock, retention=Retention()) as broker:
        await used(broker)
        clock.advance(365 * 24 * 60 * MINUTE_MS)
        await check(broker)
        assert exists(broker)


async def test_an_inactive_topic_is_kept_for_its_retention_time(tmp_path, clock):
    async with broker_with(tmp_path, clock, retention=Retention(10, -1)) as broker:
        await used(broker)
        clock.advance(10 * MINUTE_MS - 1)
        await check(broker)
        assert exists(broker)
        clock.advance(1)
        await check(broker)
        assert not exists(broker)


async def test_activity_starts_the_inactive_time_again(tmp_path, clock):
    async with broker_with(tmp_path, clock) as broker:
        await used(broker)
        clock.advance(50_000)
        producer = await broker.create_producer(T)
        await check(broker)                                   # active: seen at this time
        await producer.close()
        clock.advance(50_000)
        await check(broker)
        assert exists(broker)
        clock.advance(10_000)
        await check(broker)
        assert not exists(broker)


@pytest.mark.parametrize("client", ["producer", "consumer", "subscription", "caught-up subscription", "reader"])
async def test_a_topic_with_a_client_or_a_subscription_is_active(tmp_path, clock, client):
    async with broker_with(tmp_path, clock) as broker:
        await used(broker)
        if client == "producer":
            await broker.create_producer(T)
        elif client == "reader":
            await broker.create_reader(T, MessageId.earliest)
        else:
            consumer = await broker.subscribe(T, "s", initial_position="earliest")
            if client == "caught-up subscription":
                await consumer.acknowledge(await consumer.receive())
            if client != "consumer":
                await consumer.close()                        # the subscription stays
        clock.advance(10 * MINUTE_MS)
        await check(broker)
        assert exists(broker)


async def test_a_topic_with_an_open_transaction_is_kept_until_it_ends(tmp_path, clock):
    async with broker_with(tmp_path, clock) as broker:
        txn = await broker.new_transaction(timeout_ms=3_600_000)
        producer = await broker.create_producer(T)
        await producer.send(b"in a txn", txn=txn)
        await producer.close()
        clock.advance(10 * MINUTE_MS)
        await check(broker)
        assert exists(broker)                                 # its commit must find the topic
        await txn.commit()
        await check(broker)                                   # seen active until now
        clock.advance(MINUTE_MS)
        await check(broker)
        assert not exists(broker)


async def test_caught_up_mode_deletes_a_topic_whose_subscriptions_have_no_backlog(tmp_path, clock):
    async with broker_with(tmp_path, clock, delete_inactive_topics_mode="delete_when_subscriptions_caught_up") as broker:
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        await used(broker)
        message = await consumer.receive()
        await consumer.close()
        clock.advance(10 * MINUTE_MS)
        await check(broker)
        assert exists(broker)                                 # a backlog: active
        consumer = await broker.subscribe(T, "s")
        await consumer.acknowledge(message)
        await consumer.close()
        await check(broker)
        clock.advance(MINUTE_MS)
        await check(broker)
        assert not exists(broker)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        assert broker.service.topics[T].subscriptions["s"].backlog() == 0   # a new subscription


async def test_policies_topic_over_namespace_over_the_broker(tmp_path, clock):
    async with broker_with(tmp_path, clock, delete_inactive_topics_enabled=False) as broker:
        other = "persistent://public/default/other"
        await used(broker)
        await used(broker, other)
        policies = broker.service.policies
        clock.advance(10 * MINUTE_MS)
        await check(broker)
        assert exists(broker) and exists(broker, other)       # the broker's default: off

        namespace = policies.policies("public/default")
        await policies.set_policies("public/default", replace(namespace, inactive_topic_policies=
                                    InactiveTopicPolicies(max_inactive_duration_seconds=0).to_json()))
        await policies.set_topic_policy(other, "inactiveTopicPolicies",
                                        InactiveTopicPolicies(delete_while_inactive=False).to_json())
        assert policies.inactive_topic_policies(T).max_inactive_duration_seconds == 0
        await check(broker)
        assert not exists(broker) and exists(broker, other)


async def test_a_malformed_stored_policy_counts_as_absent(tmp_path, clock):
    async with broker_with(tmp_path, clock) as broker:
        policies = broker.service.policies
        await policies.set_topic_policy(T, "inactiveTopicPolicies", {"inactiveTopicDeleteMode": "never"})
        assert policies.inactive_topic_policies(T) == policies.inactive_topic_default


async def test_a_client_that_attached_since_the_check_keeps_the_topic(tmp_path, clock):
    async with broker_with(tmp_path, clock) as broker:
        await used(broker)
        topic = broker.service.topics[T]
        producer = await broker.create_producer(T)
        policies = broker.service.policies.inactive_topic_policies(T)
        assert await broker.service.delete_inactive_topic(topic, policies) is False
        await producer.send(b"still here")


async def deletion_under_way(broker, topic: str = T) -> asyncio.Future[bool]:
    service = broker.service
    loaded = service.topics[topic]
    deletion = asyncio.ensure_future(service.delete_inactive_topic(loaded, service.policies.inactive_topic_policies(topic)))
    for _ in range(10):
        if topic in service._deleting_topics:
            return deletion
        await asyncio.sleep(0)
    raise AssertionError("the deletion did not start")


async def test_an_admin_deletion_meeting_an_inactive_deletion_under_way_is_done_by_it(tmp_path, clock):
    """Found by a review: the admin deletion raised TopicNotFoundError, and a partitioned
    topic's deletion meeting one of its partitions' stopped half-way with a 404."""
    async with broker_with(tmp_path, clock) as broker:
        await used(broker)
        inactive_deletion = await deletion_under_way(broker)
        await broker.service.delete_topic(T)                  # waited for it: deleted, as asked
        assert await inactive_deletion is True and not exists(broker)


async def test_a_partitioned_deletion_meeting_an_inactive_partition_deletion(tmp_path, clock):
    from pyengine.admin.server import AdminServer
    import aiohttp
    async with broker_with(tmp_path, clock) as broker:
        await broker.service.policies.create_partitioned_topic("persistent://public/default/parts", 2)
        for index in range(2):
            await used(broker, f"persistent://public/default/parts-partition-{index}")
        admin = AdminServer(broker.service, port=0)
        await admin.start()
        try:
            await deletion_under_way(broker, "persistent://public/default/parts-partition-0")
            async with aiohttp.ClientSession() as session:
                async with session.delete(f"{admin.url}/admin/v2/persistent/public/default/parts/partitions") as reply:
                    assert reply.status == 204, await reply.text()
        finally:
            await admin.stop()
        assert broker.service.policies.partitions("persistent://public/default/parts") == 0
        assert not exists(broker, "persistent://public/default/parts-partition-1")


async def test_a_subscription_being_created_keeps_the_topic(tmp_path, clock):
    """Found by a review: a subscribe under way on an idle topic had it deleted under it, and
    failed with the closed ledger's error."""
    async with broker_with(tmp_path, clock) as broker:
        await used(broker)
        clock.advance(MINUTE_MS)
        subscribing = await subscribing_from_earliest(broker, T)
        await check(broker)
        consumer = await asyncio.wait_for(subscribing, 10)
        assert (await asyncio.wait_for(consumer.receive(), 10)).data == b"m"
        assert exists(broker)


async def test_the_inactive_time_counts_from_when_the_last_subscription_went(tmp_path, clock):
    async with broker_with(tmp_path, clock) as broker:
        await used(broker)
        consumer = await broker.subscribe(T, "s")
        await consumer.close()
        await check(broker)                                   # active: it has a subscription
        clock.advance(59_000)
        await broker.service.topics[T].unsubscribe("s")       # (as the admin API: no consumer)
        clock.advance(1_000)
        await check(broker)
        assert exists(broker)                                 # inactive for 1 s only
        clock.advance(59_000)
        await check(broker)
        assert not exists(broker)


async def test_the_inactive_time_counts_from_when_the_last_producer_went(tmp_path, clock):
    async with broker_with(tmp_path, clock) as broker:
        producer = await broker.create_producer(T)
        clock.advance(10 * MINUTE_MS)                         # active all along, never checked
        await producer.close()
        await check(broker)
        assert exists(broker)
        clock.advance(MINUTE_MS)
        await check(broker)
        assert not exists(broker)


async def test_the_broker_closes_after_a_deletion_under_way(tmp_path, clock, monkeypatch, caplog):
    """Found by a review: the close cancelled the check in the middle of a deletion, forgot the
    topic and closed the storage under its closing parts."""
    from pyengine.broker.topic import Topic
    close = Topic._close

    async def slow_close(self):
        await asyncio.sleep(0.2)
        await close(self)
    monkeypatch.setattr(Topic, "_close", slow_close)
    async with broker_with(tmp_path, clock, delete_inactive_topics_frequency_s=0.02) as broker:
        await used(broker)
        clock.advance(MINUTE_MS)                              # the broker's own check deletes it
        for _ in range(200):
            if T in broker.service._deleting_topics:
                break
            await asyncio.sleep(0.01)
        assert T in broker.service._deleting_topics
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")], caplog.records
    async with Broker.embedded(tmp_path, sync=False) as broker:
        assert not broker.service.topic_exists(T)


async def test_a_partition_is_deleted_and_its_partitioned_topic_stays(tmp_path, clock):
    async with broker_with(tmp_path, clock) as broker:
        partitioned = "persistent://public/default/parts"
        await broker.service.policies.create_partitioned_topic(partitioned, 2)
        partition = f"{partitioned}-partition-0"
        await used(broker, partition)
        clock.advance(MINUTE_MS)
        await check(broker)
        assert not exists(broker, partition)
        assert broker.service.policies.partitions(partitioned) == 2
        await used(broker, partition)                         # created again on its next use


def test_system_and_segment_topics_are_left_alone():
    def topic(name: str):
        return SimpleNamespace(topic_name=TopicName.parse(name))
    assert collectable(topic("persistent://public/default/t"))
    assert not collectable(topic("persistent://pulsar/system/transaction_coordinator_assign-partition-0"))
    assert not collectable(topic("segment://public/default/t/0000-7fff-1"))


async def test_the_broker_task_runs_the_check_on_its_own(tmp_path, clock):
    async with broker_with(tmp_path, clock, delete_inactive_topics_frequency_s=0.05) as broker:
        await used(broker)
        clock.advance(MINUTE_MS)
        rounds = broker.service.inactive_topics.rounds
        for _ in range(200):
            if not exists(broker) and broker.service.inactive_topics.rounds > rounds:
                break
            await asyncio.sleep(0.02)
        assert not exists(broker)


@pytest.mark.parametrize("policies", [
    {"inactiveTopicDeleteMode": "delete_forever"},
    {"maxInactiveDurationSeconds": -1},
    {"maxInactiveDurationSeconds": 2**31},
    {"maxInactiveDurationSeconds": "60"},
    {"deleteWhileInactive": "yes"},
    {"deleteWhileInactive": True, "extra": 1},
    ["delete_when_no_subscriptions"],
    None,
])
def test_malformed_policies_are_refused(policies):
    with pytest.raises(ValueError):
        InactiveTopicPolicies.from_json(policies)


def test_policies_round_trip_and_defaults():
    assert InactiveTopicPolicies.from_json({}) == InactiveTopicPolicies()
    value = InactiveTopicPolicies("delete_when_subscriptions_caught_up", 5, False)
    assert InactiveTopicPolicies.from_json(value.to_json()) == value


@pytest.mark.parametrize("config", [
    {"delete_inactive_topics_mode": "sometimes"},
    {"delete_inactive_topics_max_inactive_duration_s": -5},
    {"delete_inactive_topics_frequency_s": 0},
    {"delete_inactive_topics_enabled": 1},
])
def test_malformed_broker_settings_are_refused(tmp_path, config):
    from pyengine.broker.service import BrokerConfig
    with pytest.raises(ValueError):
        BrokerConfig(data_dir=tmp_path, **config)


def test_the_broker_default_takes_the_frequency_as_its_duration(tmp_path):
    from pyengine.broker.service import BrokerConfig
    assert BrokerConfig(data_dir=tmp_path).inactive_topic_policies() == InactiveTopicPolicies()
    config = BrokerConfig(data_dir=tmp_path, delete_inactive_topics_frequency_s=30,
                          delete_inactive_topics_max_inactive_duration_s=None)
    assert config.inactive_topic_policies().max_inactive_duration_seconds == 30
    config = BrokerConfig(data_dir=tmp_path, delete_inactive_topics_frequency_s=0.5)
    assert config.inactive_topic_policies().max_inactive_duration_seconds == 1    # never below the frequency
