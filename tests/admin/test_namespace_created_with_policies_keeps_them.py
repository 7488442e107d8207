"""Creating a namespace with a Policies body (Pulsar's `PUT /admin/v2/namespaces/{t}/{ns}`
with policies) keeps every policy of the body this broker applies: what GET shows of one
namespace, PUT creates again for another."""

from __future__ import annotations

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
