import pytest

from pyengine.broker import Broker
from pyengine.broker.policies import ConflictError, NamespacePolicies, NotFoundError
from pyengine.errors import InvalidTopicNameError, NotAllowedError, TopicNotFoundError


async def test_defaults_exist_and_namespaces_must_be_created(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        policies = broker.service.policies
        assert set(policies.tenants()) >= {"public", "pulsar"}
        assert "public/default" in policies.namespaces("public")
        assert policies.partitions("persistent://pulsar/system/transaction_coordinator_assign") == 16
        with pytest.raises(TopicNotFoundError, match="namespace acme/orders does not exist"):
            await broker.create_producer("persistent://acme/orders/t")
        await policies.create_tenant("acme")
        await policies.create_namespace("acme/orders")
        producer = await broker.create_producer("persistent://acme/orders/t")
        assert producer.topic == "persistent://acme/orders/t"
        with pytest.raises(ConflictError):
            await policies.create_namespace("acme/orders")
        with pytest.raises(ConflictError):
            await policies.delete_tenant("acme")
        with pytest.raises(NotAllowedError):
            await policies.delete_namespace("public/default", has_topics=False)


async def test_partitioned_topics(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        policies = broker.service.policies
        await policies.create_partitioned_topic("p", 3)
        assert policies.partitions("persistent://public/default/p") == 3
        assert policies.partitioned_topics("public/default") == ["persistent://public/default/p"]
        with pytest.raises(ConflictError):
            await policies.create_partitioned_topic("p", 2)
        with pytest.raises(ValueError):
            await policies.update_partitions("p", 2)
        await policies.update_partitions("p", 5)
        assert policies.partitions("p") == 5
        for bad in (0, -1, "3", True):
            with pytest.raises(ValueError):
                await policies.create_partitioned_topic("q", bad)
        with pytest.raises(InvalidTopicNameError):
            await policies.create_partitioned_topic("p-partition-1", 2)
        await policies.delete_partitioned_topic("p")
        with pytest.raises(NotFoundError):
            await policies.delete_partitioned_topic("p")
    async with Broker.embedded(tmp_path) as broker:            # durable
        assert broker.service.policies.partitions("p") == 0


async def test_deduplication_policy_order(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        policies, service = broker.service.policies, broker.service
        topic = "persistent://public/default/d"
        assert not policies.deduplication_enabled(topic)
        await policies.set_policies("public/default", NamespacePolicies(deduplication_enabled=True))
        assert policies.deduplication_enabled(topic)
        await policies.set_topic_policy(topic, "deduplicationEnabled", False)
        assert not policies.deduplication_enabled(topic)
        loaded = await service.get_topic(topic)
        assert not loaded.dedup.enabled
        await policies.set_topic_policy(topic, "deduplicationEnabled", None)
        service.refresh_policies()
        assert loaded.dedup.enabled
