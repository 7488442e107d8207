"""Creating a namespace with a Policies body (Pulsar's `PUT /admin/v2/namespaces/{t}/{ns}`
with policies) keeps every policy of the body this broker applies: what GET shows of one
namespace, PUT creates again for another."""

from __future__ import annotations

import pytest

NS = "/admin/v2/namespaces"


async def test_the_schema_flags_of_the_body_are_kept(api):
    body = {"is_allow_auto_update_schema": False, "schema_validation_enforced": True}
    assert (await api.put(f"{NS}/public/strict", body)).status == 204
    policies = (await api.get(f"{NS}/public/strict")).body
    assert policies["is_allow_auto_update_schema"] is False
    assert policies["schema_validation_enforced"] is True
    assert (await api.get(f"{NS}/public/strict/isAllowAutoUpdateSchema")).body is False
    assert (await api.get(f"{NS}/public/strict/schemaValidationEnforced")).body is True


async def test_the_policies_of_one_namespace_create_a_copy_of_it(api):
    assert (await api.put(f"{NS}/public/original", {
        "deduplicationEnabled": True, "properties": {"team": "ops"},
        "retention_policies": {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}})).status == 204
    assert (await api.post(f"{NS}/public/original/isAllowAutoUpdateSchema", False)).status == 204
    assert (await api.post(f"{NS}/public/original/schemaValidationEnforced", True)).status == 204
    original = (await api.get(f"{NS}/public/original")).body

    assert (await api.put(f"{NS}/public/copy", original)).status == 204
    assert (await api.get(f"{NS}/public/copy")).body == original


async def test_a_copy_keeps_the_limits_and_backlog_quotas(api):
    """Found by an audit: the limits and backlog quotas of the body were accepted and dropped
    (Pulsar's createNamespace stores the whole Policies)."""
    assert (await api.put(f"{NS}/public/limited")).status == 204
    assert (await api.post(f"{NS}/public/limited/maxProducersPerTopic", 3)).status == 204
    assert (await api.post(f"{NS}/public/limited/maxUnackedMessagesPerConsumer", 7)).status == 204
    assert (await api.post(f"{NS}/public/limited/backlogQuota",
                           {"limitSize": 1000, "limitTime": -1, "policy": "producer_exception"})).status == 204
    original = (await api.get(f"{NS}/public/limited")).body
    assert original["max_producers_per_topic"] == 3 and original["backlog_quota_map"]
    assert (await api.put(f"{NS}/public/limited-copy", original)).status == 204
    assert (await api.get(f"{NS}/public/limited-copy")).body == original


@pytest.mark.parametrize("body, status", [
    ({"max_producers_per_topic": -1}, 400),
    ({"max_consumers_per_topic": 2**31}, 400),
    ({"max_unacked_messages_per_consumer": "7"}, 400),
    ({"backlog_quota_map": {"destination_storage": {"limitSize": 10, "policy": "no_such_policy"}}}, 400),
    ({"backlog_quota_map": {"other_type": {"limitSize": 10}}}, 400),
    ({"backlog_quota_map": {"destination_storage": {"limitSize": 10, "extra": 1}}}, 400),
    ({"backlog_quota_map": {"destination_storage": {"limitSize": 2 << 20, "policy": "producer_exception"}},
      "retention_policies": {"retentionTimeInMinutes": -1, "retentionSizeInMB": 1}}, 412),
])
async def test_bad_limits_and_quotas_in_the_body_are_refused(api, body, status):
    assert (await api.put(f"{NS}/public/refused", body)).status == status
    assert (await api.get(f"{NS}/public/refused")).status == 404           # not created


async def test_the_schema_compatibility_strategy_of_the_body_applies(api, client):
    """Pulsar's Policies field `schema_compatibility_strategy`: the namespace is created with it,
    and the schema registry checks its topics' schemas with it."""
    body = {"schema_compatibility_strategy": "ALWAYS_INCOMPATIBLE"}
    assert (await api.put(f"{NS}/public/frozen", body)).status == 204
    assert (await api.get(f"{NS}/public/frozen")).body["schema_compatibility_strategy"] == "ALWAYS_INCOMPATIBLE"
    assert (await api.get(f"{NS}/public/frozen/schemaCompatibilityStrategy")).body == "ALWAYS_INCOMPATIBLE"
    applied = await api.get("/admin/v2/persistent/public/frozen/t/schemaCompatibilityStrategy?applied=true")
    assert applied.status == 404                     # no topic yet: create it, then ask
    assert (await api.put("/admin/v2/persistent/public/frozen/t")).status == 204
    applied = await api.get("/admin/v2/persistent/public/frozen/t/schemaCompatibilityStrategy?applied=true")
    assert applied.body == "ALWAYS_INCOMPATIBLE"
    first = {"type": "JSON", "schema": '{"type":"record","name":"A","fields":[]}', "properties": {}}
    second = {"type": "JSON", "schema": '{"type":"record","name":"B","fields":[]}', "properties": {}}
    assert (await api.post("/admin/v2/schemas/public/frozen/t/schema", first)).status == 200
    assert (await api.post("/admin/v2/schemas/public/frozen/t/schema", second)).status == 409


async def test_an_undefined_or_null_strategy_in_the_body_is_the_brokers_default(api):
    for name, value in (("undefined", "UNDEFINED"), ("null", None)):
        assert (await api.put(f"{NS}/public/{name}", {"schema_compatibility_strategy": value})).status == 204
        assert (await api.get(f"{NS}/public/{name}/schemaCompatibilityStrategy")).body == "UNDEFINED"


async def test_a_malformed_strategy_in_the_body_is_refused_and_creates_nothing(api):
    for value in ("NOPE", "", 3, ["FULL"], {"FULL": 1}, True):
        reply = await api.put(f"{NS}/public/bad", {"schema_compatibility_strategy": value})
        assert reply.status == 400 and "schema_compatibility_strategy" in reply.body["reason"], (value, reply)
    assert (await api.get(f"{NS}/public/bad")).status == 404
    assert "public/bad" not in (await api.get(f"{NS}/public")).body
