"""Backlog quotas at Pulsar's admin paths (`backlogQuota`, `backlogQuotaMap` of a namespace and a
topic): set, read, removed, malformed bodies (400) and quotas a retention cannot keep (412); and
the namespace policies GET, which carries the namespace's limits and backlog quotas under
Pulsar's Policies names."""

import pytest

from pyengine.broker.backlog_quota import REFUSED
from pyengine.errors import ProducerBlockedQuotaExceededException

NS = "/admin/v2/namespaces/public/default"
TOPIC = "persistent://public/default/quota"
TOPIC_URL = "/admin/v2/persistent/public/default/quota"
HOLD = {"limit": 1000, "limitSize": 1000, "limitTime": -1, "policy": "producer_request_hold"}
AGE = {"limit": -1, "limitSize": -1, "limitTime": 60, "policy": "consumer_backlog_eviction"}


async def test_namespace_backlog_quota_set_read_and_removed(api):
    assert (await api.get(f"{NS}/backlogQuotaMap")).body == {}
    assert (await api.post(f"{NS}/backlogQuota", {"limitSize": 1000, "policy": "producer_request_hold"})).status == 204
    assert (await api.post(f"{NS}/backlogQuota?backlogQuotaType=message_age",
                           {"limitTime": 60, "policy": "consumer_backlog_eviction"})).status == 204
    assert (await api.get(f"{NS}/backlogQuotaMap")).body == {"destination_storage": HOLD, "message_age": AGE}
    assert (await api.get(NS)).body["backlog_quota_map"] == {"destination_storage": HOLD, "message_age": AGE}
    assert (await api.delete(f"{NS}/backlogQuota")).status == 204            # destination_storage
    assert (await api.get(f"{NS}/backlogQuotaMap")).body == {"message_age": AGE}
    assert (await api.delete(f"{NS}/backlogQuota?backlogQuotaType=message_age")).status == 204
    assert (await api.get(f"{NS}/backlogQuotaMap")).body == {}
    assert (await api.get("/admin/v2/namespaces/public/nope/backlogQuotaMap")).status == 404
    assert (await api.post("/admin/v2/namespaces/public/nope/backlogQuota", HOLD)).status == 404


async def test_the_deprecated_limit_field_is_the_size(api):
    assert (await api.post(f"{NS}/backlogQuota", {"limit": 77, "policy": "producer_exception"})).status == 204
    assert (await api.get(f"{NS}/backlogQuotaMap")).body["destination_storage"]["limitSize"] == 77


@pytest.mark.parametrize("body", ['"x"', "[]", '{"limitSize": "10"}', '{"limitSize": -2}', '{"policy": "drop"}',
                                  '{"limitTime": 2147483648}', '{"limitSize": 1, "other": 1}', "", "{"])
async def test_malformed_bodies_are_refused(api, client, body):
    assert (await api.post(f"{NS}/backlogQuota", raw=body)).status == 400
    await client.create_producer(TOPIC)
    assert (await api.post(f"{TOPIC_URL}/backlogQuota", raw=body)).status == 400
    assert (await api.get(f"{NS}/backlogQuotaMap")).body == {}


async def test_an_unknown_quota_type_is_refused(api):
    reply = await api.post(f"{NS}/backlogQuota?backlogQuotaType=size", HOLD)
    assert reply.status == 400 and "backlogQuotaType" in reply.body["reason"]


async def test_a_quota_the_retention_cannot_keep_is_refused(api, client):
    assert (await api.post(f"{NS}/retention", {"retentionTimeInMinutes": 1, "retentionSizeInMB": 1})).status == 204
    refused = await api.post(f"{NS}/backlogQuota", {"limitSize": 1 << 20, "policy": "producer_request_hold"})
    assert refused.status == 412
    assert refused.body["reason"] == ("Backlog Quota exceeds configured retention quota for namespace. "
                                      "Please increase retention quota and retry")
    refused = await api.post(f"{NS}/backlogQuota", {"limitSize": 100, "limitTime": 60})
    assert refused.status == 412                          # the time: 60 s >= 1 minute
    assert (await api.post(f"{NS}/backlogQuota", {"limitSize": (1 << 20) - 1, "limitTime": 59})).status == 204
    await client.create_producer(TOPIC)
    refused = await api.post(f"{TOPIC_URL}/backlogQuota", {"limitSize": 1 << 20})
    assert refused.status == 412 and "for topic" in refused.body["reason"]


async def test_topic_backlog_quota_set_read_applied_and_enforced(api, client, service):
    assert (await api.post(f"{TOPIC_URL}/backlogQuota", HOLD)).status == 404        # no such topic yet
    producer = await client.create_producer(TOPIC)
    await client.subscribe(TOPIC, "slow")
    for _ in range(5):
        await producer.send(b"x" * 100)
    assert (await api.get(f"{TOPIC_URL}/backlogQuotaMap")).body == {}
    applied = (await api.get(f"{TOPIC_URL}/backlogQuotaMap?applied=true")).body
    assert applied["destination_storage"]["limitSize"] == -1                          # the broker's default
    assert (await api.post(f"{NS}/backlogQuota", HOLD)).status == 204
    assert (await api.get(f"{TOPIC_URL}/backlogQuotaMap?applied=true")).body["destination_storage"] == HOLD
    assert (await api.post(f"{TOPIC_URL}/backlogQuota", {"limitSize": 100, "policy": "producer_exception"})).status \
        == 204
    assert (await api.get(f"{TOPIC_URL}/backlogQuotaMap")).body["destination_storage"]["limitSize"] == 100
    with pytest.raises(ProducerBlockedQuotaExceededException, match=f"^{REFUSED}$"):
        await client.create_producer(TOPIC)
    assert (await api.delete(f"{TOPIC_URL}/backlogQuota")).status == 204
    assert (await api.get(f"{TOPIC_URL}/backlogQuotaMap")).body == {}
    assert (await api.delete(f"{NS}/backlogQuota")).status == 204
    await client.create_producer(TOPIC)


async def test_namespace_policies_carry_the_limits(api):
    policies = (await api.get(NS)).body
    names = ("max_producers_per_topic", "max_consumers_per_topic", "max_consumers_per_subscription",
             "max_unacked_messages_per_consumer", "max_unacked_messages_per_subscription")
    assert {name: policies[name] for name in names} == dict.fromkeys(names)       # none set: null
    for path, value in (("maxProducersPerTopic", 3), ("maxConsumersPerTopic", 4), ("maxConsumersPerSubscription", 5),
                        ("maxUnackedMessagesPerConsumer", 6), ("maxUnackedMessagesPerSubscription", 7)):
        assert (await api.post(f"{NS}/{path}", value)).status == 204
    policies = (await api.get(NS)).body
    assert [policies[name] for name in names] == [3, 4, 5, 6, 7]
    assert policies["backlog_quota_map"] == {}
