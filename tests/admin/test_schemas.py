"""The schema resource (`/admin/v2/schemas/...`, Pulsar's SchemasResource) and the namespace's
schema policies through the admin API, including malformed uploads."""

from __future__ import annotations

import json

import pytest

from pyengine.schema import SchemaType

S = "/admin/v2/schemas/public/default"
NS = "/admin/v2/namespaces/public/default"
Rec = {"type": "record", "name": "Rec", "fields": [{"name": "a", "type": "int"}]}
Rec_b = {**Rec, "fields": [*Rec["fields"], {"name": "b", "type": ["null", "string"], "default": None}]}
Rec_required_b = {**Rec, "fields": [*Rec["fields"], {"name": "b", "type": "string"}]}


def payload(definition: dict | str, kind: str = "AVRO", **properties: str) -> dict:
    text = definition if isinstance(definition, str) else json.dumps(definition)
    return {"type": kind, "schema": text, "properties": properties}


async def test_upload_read_version_and_delete(api) -> None:
    assert (await api.get(f"{S}/t/schema")).body == {"reason": "Schema not found"}
    reply = await api.post(f"{S}/t/schema", payload(Rec, owner="me"))
    assert (reply.status, reply.body) == (200, {"version": {"version": 0}})
    assert (await api.post(f"{S}/t/schema", payload(Rec_b))).body == {"version": {"version": 1}}
    latest = (await api.get(f"{S}/t/schema")).body
    assert (latest["version"], latest["type"], json.loads(latest["data"])) == (1, "AVRO", Rec_b)
    assert isinstance(latest["timestamp"], int) and latest["properties"] == {}
    first = (await api.get(f"{S}/t/schema/0")).body
    assert (json.loads(first["data"]), first["properties"]) == (Rec, {"owner": "me"})
    assert [v["version"] for v in (await api.get(f"{S}/t/schemas")).body["getSchemaResponses"]] == [0, 1]
    assert (await api.post(f"{S}/t/version", payload(Rec))).body == {"version": 0}
    assert (await api.post(f"{S}/t/version", payload(Rec_required_b))).body == {"version": -1}
    # partitions share the partitioned topic's schemas
    assert (await api.get(f"{S}/t-partition-2/schema")).body["version"] == 1
    assert (await api.delete(f"{S}/t/schema")).body == {"version": 2}
    assert (await api.get(f"{S}/t/schema")).body == {"reason": "Schema is deleted"}
    assert (await api.get(f"{S}/t/schema/0")).status == 404
    # As Apache: none since the last deletion is an empty list, not a 404 ...
    reply = await api.get(f"{S}/t/schemas")
    assert (reply.status, reply.body) == (200, {"getSchemaResponses": []})
    # ... and every deletion is a version of its own, even of a deleted schema.
    assert (await api.delete(f"{S}/t/schema")).body == {"version": 3}
    assert (await api.post(f"{S}/t/schema", payload(Rec_required_b))).body == {"version": {"version": 4}}
    assert (await api.call("DELETE", f"{S}/t/schema?force=true")).body == {"version": -1}
    assert (await api.post(f"{S}/t/schema", payload(Rec))).body == {"version": {"version": 0}}


async def test_a_topic_without_schemas_lists_none_and_its_deletion_is_version_0(api) -> None:
    reply = await api.get(f"{S}/never/schemas")
    assert (reply.status, reply.body) == (200, {"getSchemaResponses": []})
    assert (await api.delete(f"{S}/never/schema")).body == {"version": 0}
    assert (await api.get(f"{S}/never/schema")).body == {"reason": "Schema is deleted"}
    assert (await api.post(f"{S}/never/schema", payload(Rec))).body == {"version": {"version": 1}}


async def test_compatibility_is_tested_without_storing(api) -> None:
    await api.post(f"{S}/c/schema", payload(Rec))
    reply = await api.post(f"{S}/c/compatibility", payload(Rec_b))
    assert (reply.status, reply.body) == (202, {"compatibility": True, "schemaCompatibilityStrategy": "FULL"})
    reply = await api.post(f"{S}/c/compatibility", payload(Rec_required_b))
    assert reply.status == 409 and "strategy FULL" in reply.body["reason"]
    assert [v["version"] for v in (await api.get(f"{S}/c/schemas")).body["getSchemaResponses"]] == [0]


async def test_the_namespace_strategy_decides_and_unset_means_the_broker_default(api) -> None:
    assert (await api.get(f"{NS}/schemaCompatibilityStrategy")).body == "UNDEFINED"
    await api.post(f"{S}/n/schema", payload(Rec))
    assert (await api.post(f"{S}/n/schema", payload(Rec_required_b))).status == 409
    assert (await api.put(f"{NS}/schemaCompatibilityStrategy", "FORWARD")).status == 204
    assert (await api.get(f"{NS}/schemaCompatibilityStrategy")).body == "FORWARD"
    assert (await api.post(f"{S}/n/schema", payload(Rec_required_b))).body == {"version": {"version": 1}}
    assert (await api.put(f"{NS}/schemaCompatibilityStrategy", "UNDEFINED")).status == 204
    assert (await api.get(f"{NS}/schemaCompatibilityStrategy")).body == "UNDEFINED"
    assert (await api.post(f"{S}/n/compatibility", payload(Rec))).status == 409      # FULL again


async def test_auto_update_and_validation_flags(api, service) -> None:
    for flag in ("isAllowAutoUpdateSchema", "schemaValidationEnforced"):
        assert (await api.get(f"{NS}/{flag}")).status == 204                      # not set
        assert (await api.post(f"{NS}/{flag}", True)).status == 204
        assert (await api.get(f"{NS}/{flag}")).body is True
        assert (await api.post(f"{NS}/{flag}", "yes")).status == 400
        assert (await api.get(f"{NS}/{flag}")).body is True
    assert service.schemas.allow_auto_update("persistent://public/default/x")
    assert service.schemas.validation_enforced("persistent://public/default/x")


async def test_key_value_schemas_upload_as_key_and_value_definitions(api) -> None:
    body = payload(json.dumps({"key": "", "value": Rec}), "KEY_VALUE",
                   **{"key.schema.type": "STRING", "value.schema.type": "AVRO"})
    assert (await api.post(f"{S}/kv/schema", body)).body == {"version": {"version": 0}}
    got = (await api.get(f"{S}/kv/schema")).body
    assert got["type"] == "KEY_VALUE" and json.loads(got["data"]) == {"key": "", "value": Rec}
    assert got["properties"]["key.schema.type"] == "STRING"
    changed_key = payload(json.dumps({"key": "", "value": Rec}), "KEY_VALUE",
                          **{"key.schema.type": "INT64", "value.schema.type": "AVRO"})
    assert (await api.post(f"{S}/kv/schema", changed_key)).status == 409


@pytest.mark.parametrize("body, status", [
    ({"type": "AVRO", "schema": "{broken"}, 422),
    ({"type": "STRING", "schema": "text"}, 422),
    ({"type": "KEY_VALUE", "schema": "[1]"}, 422),
    ({"type": "BYTES", "schema": ""}, 406),
    ({"type": "SIDEWAYS", "schema": ""}, 400),
    ({"type": "AUTO_CONSUME"}, 400),
    ({"schema": "{}"}, 400),
    ({"type": "AVRO", "schema": 5}, 400),
    ({"type": "AVRO", "schema": "{}", "properties": {"k": 1}}, 400),
    ([], 400),
])
async def test_a_malformed_upload_is_refused_and_stores_nothing(api, body, status) -> None:
    reply = await api.post(f"{S}/bad/schema", body)
    assert reply.status == status and reply.body["reason"]
    assert (await api.get(f"{S}/bad/schema")).status == 404


@pytest.mark.parametrize("path, status", [
    (f"{S}/t/schema/-1", 400), (f"{S}/t/schema/x", 400), (f"{S}/t/schema/7", 404),
    ("/admin/v2/schemas/public/nope/t/schema", 404), ("/admin/v2/schemas/public/default/a%2Fb/schema", 412),
])
async def test_bad_reads_get_clear_errors(api, path, status) -> None:
    await api.post(f"{S}/t/schema", payload(Rec))
    reply = await api.get(path)
    assert reply.status == status and reply.body["reason"]


async def test_a_namespace_that_does_not_exist_has_no_schemas(api) -> None:
    reply = await api.post("/admin/v2/schemas/public/nope/t/schema", payload(Rec))
    assert reply.status == 404 and "nope" in reply.body["reason"]
    assert (await api.get("/admin/v2/schemas/nobody/default/t/schema")).status == 404


async def test_a_bad_strategy_is_refused(api) -> None:
    assert (await api.put(f"{NS}/schemaCompatibilityStrategy", "SIDEWAYS")).status == 400
    assert (await api.put(f"{NS}/schemaCompatibilityStrategy", 3)).status == 400
    assert (await api.get(f"{NS}/schemaCompatibilityStrategy")).body == "UNDEFINED"


def test_every_wire_type_but_auto_consume_can_be_named_in_an_upload() -> None:
    from pyengine.admin.routes_schemas import POST_SCHEMA_PAYLOAD
    names = set(POST_SCHEMA_PAYLOAD["properties"]["type"]["enum"])
    assert names == {t.name for t in SchemaType} - {"AUTO_CONSUME"} | {"BYTES"}


async def test_deleting_a_topic_deletes_its_schemas_but_deleting_a_partition_does_not(api, client) -> None:
    P = "/admin/v2/persistent/public/default"
    await (await client.create_producer("persistent://public/default/gone")).close()
    await api.post(f"{S}/gone/schema", payload(Rec))
    assert (await api.delete(f"{P}/gone")).status == 204
    assert (await api.get(f"{S}/gone/schema")).status == 404
    assert (await api.post(f"{S}/gone/schema", payload(Rec_required_b))).body == {"version": {"version": 0}}
    assert (await api.put(f"{P}/parted/partitions", 2)).status == 204
    await (await client.create_producer("persistent://public/default/parted-partition-0")).close()
    await api.post(f"{S}/parted/schema", payload(Rec))
    assert (await api.delete(f"{P}/parted-partition-0")).status == 204
    assert (await api.get(f"{S}/parted/schema")).status == 200          # the partitioned topic's, kept
    assert (await api.delete(f"{P}/parted/partitions")).status == 204
    assert (await api.get(f"{S}/parted/schema")).status == 404


async def test_a_topic_strategy_wins_over_the_namespace_one(api, client) -> None:
    P = "/admin/v2/persistent/public/default"
    assert (await api.get(f"{P}/own/schemaCompatibilityStrategy")).status == 404      # no such topic
    await (await client.create_producer("persistent://public/default/own")).close()
    assert (await api.get(f"{P}/own/schemaCompatibilityStrategy")).status == 204
    assert (await api.get(f"{P}/own/schemaCompatibilityStrategy?applied=true")).body == "FULL"
    await api.put(f"{NS}/schemaCompatibilityStrategy", "BACKWARD")
    assert (await api.get(f"{P}/own/schemaCompatibilityStrategy?applied=true")).body == "BACKWARD"
    assert (await api.put(f"{P}/own/schemaCompatibilityStrategy", "FORWARD")).status == 204
    assert (await api.get(f"{P}/own/schemaCompatibilityStrategy")).body == "FORWARD"
    await api.post(f"{S}/own/schema", payload(Rec))
    assert (await api.post(f"{S}/own/schema", payload(Rec_required_b))).status == 200     # FORWARD allows it
    assert (await api.put(f"{P}/own/schemaCompatibilityStrategy", "sideways")).status == 400
    assert (await api.delete(f"{P}/own/schemaCompatibilityStrategy")).status == 204
    assert (await api.get(f"{P}/own/schemaCompatibilityStrategy?applied=true")).body == "BACKWARD"
    # UNDEFINED, as Pulsar, unsets it (it was refused with 400: an audit's finding)
    assert (await api.put(f"{P}/own/schemaCompatibilityStrategy", "FORWARD")).status == 204
    assert (await api.put(f"{P}/own/schemaCompatibilityStrategy", "UNDEFINED")).status == 204
    assert (await api.get(f"{P}/own/schemaCompatibilityStrategy")).status == 204
    assert (await api.get(f"{P}/own/schemaCompatibilityStrategy?applied=true")).body == "BACKWARD"


async def test_a_topic_can_enforce_schema_validation(api, client, service) -> None:
    """Pulsar's topic-level schemaValidationEnforced (pulsar-admin topics
    set-schema-validation-enforce): the topic's setting wins over the namespace's and the
    broker's (it answered 404: an audit's finding)."""
    from pyengine.errors import IncompatibleSchemaError

    P = "/admin/v2/persistent/public/default"
    topic = "persistent://public/default/enforced"
    await (await client.create_producer(topic)).close()
    assert (await api.post(f"{S}/enforced/schema", payload(Rec))).status == 200
    without_schema = service.schemas.for_producer           # what a PRODUCER without a schema asks
    assert (await api.get(f"{P}/enforced/schemaValidationEnforced?applied=true")).body is False
    await without_schema(topic, None)                                      # allowed
    assert (await api.post(f"{P}/enforced/schemaValidationEnforced", True)).status == 204
    assert (await api.get(f"{P}/enforced/schemaValidationEnforced")).body is True
    with pytest.raises(IncompatibleSchemaError):
        await without_schema(topic, None)
    assert (await api.post(f"{NS}/schemaValidationEnforced", True)).status == 204
    assert (await api.post(f"{P}/enforced/schemaValidationEnforced", False)).status == 204
    await without_schema(topic, None)                                      # the topic's false wins
    assert (await api.delete(f"{P}/enforced/schemaValidationEnforced")).status == 204
    assert (await api.get(f"{P}/enforced/schemaValidationEnforced?applied=true")).body is True
    assert (await api.post(f"{P}/enforced/schemaValidationEnforced", "yes")).status == 400
    assert (await api.get(f"{P}/nowhere/schemaValidationEnforced")).status == 404


async def test_deleting_a_segment_keeps_its_scalable_topic_schemas(api, service) -> None:
    # A segment's schemas are its scalable topic's (like a partition's): deleting the segment
    # topic, as a split's clean-up does, leaves them.
    await api.post(f"{S}/scaled/schema", payload(Rec))
    segment = "segment://public/default/scaled/0000-ffff-0"
    await service.get_topic(segment)
    await service.delete_topic(segment)
    assert (await api.get(f"{S}/scaled/schema")).body["version"] == 0
