"""Tenants and namespaces: every route's success and its errors, with Pulsar's statuses."""

from __future__ import annotations

T = "/admin/v2/tenants"
NS = "/admin/v2/namespaces"
TENANT_INFO = {"allowedClusters": ["standalone"]}


async def test_tenant_lifecycle(api):
    assert sorted((await api.get(T)).body) == ["public", "pulsar"]
    created = await api.put(f"{T}/acme", {"adminRoles": ["ops"], "allowedClusters": ["standalone"]})
    assert created.status == 204 and created.body is None
    assert (await api.get(f"{T}/acme")).body == {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}
    assert "acme" in (await api.get(T)).body
    assert (await api.delete(f"{T}/acme")).status == 204
    assert (await api.get(f"{T}/acme")).status == 404
    assert "acme" not in (await api.get(T)).body


async def test_tenant_without_admin_roles_has_none(api):
    # (A tenant without a body or allowedClusters is refused, as by Pulsar: see
    # test_tenant_info_and_its_clusters_are_required.py.)
    assert (await api.put(f"{T}/bare", TENANT_INFO)).status == 204
    assert (await api.get(f"{T}/bare")).body == {"adminRoles": [], "allowedClusters": ["standalone"]}


async def test_tenant_errors(api):
    assert (await api.put(f"{T}/public", TENANT_INFO)).status == 409
    assert (await api.delete(f"{T}/nobody")).status == 404
    assert (await api.get(f"{T}/nobody")).body == {"reason": "tenant nobody does not exist"}
    reply = await api.delete(f"{T}/public")                     # still has namespaces
    assert reply.status == 409 and "namespaces" in reply.body["reason"]
    assert (await api.put(f"{T}/x", {"allowedClusters": []})).status == 412
    assert (await api.put(f"{T}/x", {"allowedClusters": ["elsewhere"]})).status == 412
    assert (await api.put(f"{T}/bad%20name", TENANT_INFO)).status == 412
    assert (await api.put(f"{T}/" + "t" * 101, TENANT_INFO)).status == 412  # longer than storage keys allow
    assert (await api.put(f"{T}/x", {"adminRoles": "ops"})).status == 400
    assert (await api.put(f"{T}/x", raw="{not json")).status == 400
    assert (await api.get(f"{T}/x")).status == 404              # nothing was created by the failures


async def test_namespace_lifecycle(api):
    await api.put(f"{T}/acme", TENANT_INFO)
    assert (await api.get(f"{NS}/acme")).body == []
    assert (await api.put(f"{NS}/acme/orders", {"deduplicationEnabled": True})).status == 204
    assert (await api.get(f"{NS}/acme")).body == ["acme/orders"]
    assert (await api.get(f"{NS}/acme/orders")).body == {
        "deduplicationEnabled": True, "retention_policies": None, "schema_compatibility_strategy": "UNDEFINED",
        "is_allow_auto_update_schema": None, "schema_validation_enforced": None,
        "delayed_delivery_policies": None, "inactive_topic_policies": None, "autoTopicCreationOverride": None,
        "autoSubscriptionCreationOverride": None,
        "message_ttl_in_seconds": None,
        "properties": {},
        "max_producers_per_topic": None, "max_consumers_per_topic": None, "max_consumers_per_subscription": None,
        "max_unacked_messages_per_consumer": None, "max_unacked_messages_per_subscription": None,
        "backlog_quota_map": {}}
    assert (await api.get(f"{NS}/acme/orders/topics")).body == []
    assert (await api.delete(f"{NS}/acme/orders")).status == 204
    assert (await api.get(f"{NS}/acme/orders")).status == 404
    assert (await api.delete(f"{T}/acme")).status == 204


async def test_namespace_errors(api, client):
    assert (await api.put(f"{NS}/nobody/ns")).status == 404             # unknown tenant
    assert (await api.get(f"{NS}/nobody")).status == 404
    assert (await api.put(f"{NS}/public/default")).status == 409
    assert (await api.put(f"{NS}/public/bad%20ns")).status == 412
    assert (await api.put(f"{NS}/public/x", {"deduplicationEnabled": "yes"})).status == 400
    assert (await api.delete(f"{NS}/public/nothing")).status == 404
    assert (await api.delete(f"{NS}/pulsar/system")).status == 405      # the coordinators' namespace
    assert (await api.get(f"{NS}/public/nothing/topics")).status == 404
    await api.put(f"{NS}/public/busy")
    await client.create_producer("persistent://public/busy/t")
    reply = await api.delete(f"{NS}/public/busy")
    assert reply.status == 409 and "topics" in reply.body["reason"]
    assert (await api.get(f"{NS}/public/busy/topics")).body == ["persistent://public/busy/t"]


async def test_namespace_deduplication_is_applied_to_loaded_topics(api, client, service):
    path = f"{NS}/public/default/deduplication"
    producer = await client.create_producer("dedup-topic", producer_name="p")
    topic = service.topics["persistent://public/default/dedup-topic"]
    assert (await api.get(path)).status == 204                          # not set: the broker default
    assert not topic.dedup.enabled
    assert (await api.post(path, True)).status == 204
    assert (await api.get(path)).body is True and topic.dedup.enabled
    await producer.send(b"a", sequence_id=5)
    duplicate = await producer.send(b"a again", sequence_id=5)
    assert (duplicate.ledger_id, duplicate.entry_id) == (-1, -1)        # dropped as a duplicate
    assert (await api.delete(path)).status == 204
    assert (await api.get(path)).status == 204 and not topic.dedup.enabled


async def test_namespace_deduplication_errors(api):
    path = f"{NS}/public/default/deduplication"
    assert (await api.post(path)).status == 400                         # the body is required
    assert (await api.post(path, "true")).status == 400                 # a string, not a boolean
    assert (await api.post(path, 1)).status == 400
    assert (await api.post(f"{NS}/public/none/deduplication", True)).status == 404
    assert (await api.get(f"{NS}/public/none/deduplication")).status == 404
