"""A topic's topic-level policies go with it, as in Pulsar: a non-partitioned topic or a
partitioned topic deleted (through the admin API, forced or not, or the broker's own API) and
created again under its name starts without them. Deleting one partition keeps them: the
partitions share their partitioned topic's policies."""

from __future__ import annotations

P = "/admin/v2/persistent/public/default"
NS = "persistent://public/default"
RETENTION = {"retentionTimeInMinutes": 7, "retentionSizeInMB": 7}


async def not_set(api, path: str) -> bool:
    reply = await api.get(path)
    return reply.status == 204 and reply.body is None


async def test_a_deleted_topic_takes_its_policies_with_it(api, service):
    assert (await api.put(f"{P}/a")).status == 204
    assert (await api.post(f"{P}/a/messageTTL?messageTTL=5")).status == 204
    assert (await api.post(f"{P}/a/deduplicationEnabled", True)).status == 204
    assert (await api.get(f"{P}/a/stats")).body["deduplicationStatus"] == "Enabled"
    assert (await api.delete(f"{P}/a")).status == 204
    assert service.policies.topic_policies(f"{NS}/a") == {}

    assert (await api.put(f"{P}/a")).status == 204
    assert await not_set(api, f"{P}/a/messageTTL")
    assert await not_set(api, f"{P}/a/deduplicationEnabled")
    assert (await api.get(f"{P}/a/stats")).body["deduplicationStatus"] == "Disabled"


async def test_a_deleted_partitioned_topic_takes_its_policies_with_it(api, service, client):
    assert (await api.put(f"{P}/p/partitions", 2)).status == 204
    assert (await api.post(f"{P}/p/retention", RETENTION)).status == 204
    producer = await client.create_producer(f"{NS}/p-partition-1")
    await producer.send(b"x")
    await producer.close()
    assert (await api.delete(f"{P}/p/partitions")).status == 204
    assert service.policies.topic_policies(f"{NS}/p") == {}

    assert (await api.put(f"{P}/p/partitions", 2)).status == 204
    assert await not_set(api, f"{P}/p/retention")
    assert service.policies.retention(f"{NS}/p-partition-0") == service.policies.retention_default


async def test_a_forced_delete_takes_them_too(api, service, client):
    assert (await api.put(f"{P}/f/partitions", 2)).status == 204
    assert (await api.post(f"{P}/f/messageTTL?messageTTL=9")).status == 204
    producer = await client.create_producer(f"{NS}/f-partition-0")      # still connected
    assert (await api.delete(f"{P}/f/partitions")).status == 412
    assert (await api.get(f"{P}/f/messageTTL")).body == 9              # a refused delete keeps them
    assert (await api.call("DELETE", f"{P}/f/partitions?force=true")).status == 204
    await producer.close()
    assert (await api.put(f"{P}/f/partitions", 2)).status == 204
    assert await not_set(api, f"{P}/f/messageTTL")


async def test_deleting_one_partition_keeps_the_partitioned_topic_policies(api, service, client):
    assert (await api.put(f"{P}/k/partitions", 2)).status == 204
    assert (await api.post(f"{P}/k/messageTTL?messageTTL=9")).status == 204
    producer = await client.create_producer(f"{NS}/k-partition-1")
    await producer.close()
    assert (await api.delete(f"{P}/k-partition-1")).status == 204
    assert (await api.get(f"{P}/k/messageTTL")).body == 9
    assert service.policies.message_ttl(f"{NS}/k-partition-0") == 9
    await service.get_topic(f"{NS}/k-partition-0")
    await service.delete_topic(f"{NS}/k-partition-0")                    # the broker API alike
    assert (await api.get(f"{P}/k/messageTTL")).body == 9


async def test_the_broker_api_deletes_them_too(service):
    policies = service.policies
    await service.get_topic(f"{NS}/b")
    await policies.set_topic_policy(f"{NS}/b", "messageTTLInSeconds", 5)
    await service.delete_topic(f"{NS}/b")
    assert policies.topic_policies(f"{NS}/b") == {}
    assert policies.message_ttl(f"{NS}/b") == policies.message_ttl_default

    await policies.create_partitioned_topic(f"{NS}/bp", 2)
    await policies.set_topic_policy(f"{NS}/bp", "messageTTLInSeconds", 5)
    await policies.delete_partitioned_topic(f"{NS}/bp")
    assert policies.topic_policies(f"{NS}/bp") == {}
    await policies.create_partitioned_topic(f"{NS}/bp", 2)
    assert policies.message_ttl(f"{NS}/bp-partition-1") == policies.message_ttl_default
