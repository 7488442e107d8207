"""Schemas: `/admin/v2/schemas/{tenant}/{namespace}/{topic}/...` (Pulsar's SchemasResource):
read, upload, test and delete a topic's schemas. A partition's name reads its partitioned
topic's schemas, which all its partitions share."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from pyengine.admin.errors import NOT_ACCEPTABLE, NOT_FOUND, UNPROCESSABLE, AdminError
from pyengine.admin.names import topic_name
from pyengine.admin.routing import Call, Param, Reply, RouteTable
from pyengine.admin.schemas import BOOLEAN, ERROR_REF, TOPIC_PATH, errors
from pyengine.schema import InvalidSchemaDataError, SchemaData, SchemaType, StoredSchema, schema_id
from pyengine.schema.compatibility import join_key_value, split_key_value

routes = RouteTable("schemas")
BASE = "/admin/v2/schemas/{tenant}/{namespace}/{topic}"
_TYPE_NAMES = [t.name for t in SchemaType if t not in (SchemaType.AUTO_CONSUME,)] + ["BYTES"]

GET_SCHEMA_RESPONSE = {
    "type": "object",
    "description": "Pulsar's GetSchemaResponse (for KEY_VALUE, data is {\"key\": ..., \"value\": ...})",
    "properties": {"version": {"type": "integer"}, "type": {"type": "string"}, "timestamp": {"type": "integer"},
                   "data": {"type": "string"}, "properties": {"type": "object",
                                                               "additionalProperties": {"type": "string"}}},
    "required": ["version", "type", "timestamp", "data", "properties"],
}
POST_SCHEMA_PAYLOAD = {
    "type": "object",
    "description": "Pulsar's PostSchemaPayload: the type name, the definition as a string, properties",
    "properties": {"type": {"type": "string", "enum": _TYPE_NAMES}, "schema": {"type": "string"},
                   "properties": {"type": "object", "additionalProperties": {"type": "string"}}},
    "required": ["type"],
}
VERSION = {"type": "object", "properties": {"version": {"type": "integer"}}, "required": ["version"]}
POSTED_VERSION = {"type": "object", "properties": {"version": VERSION}, "required": ["version"]}
COMPATIBILITY = {"type": "object", "properties": {"compatibility": BOOLEAN,
                                                  "schemaCompatibilityStrategy": {"type": "string"}},
                 "required": ["compatibility", "schemaCompatibilityStrategy"]}
SCHEMA_VERSION = Param("version", {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}, "schema version",
                       "path", required=True)
FORCE_DELETE = Param("force", BOOLEAN, "forget every version (numbering starts again at 0) instead of adding a "
                                      "deletion that takes a version", default=False)
_SCHEMA_ERRORS = {
    406: Reply("A BYTES schema cannot be uploaded (it is the default)", ERROR_REF),
    409: Reply("Incompatible with the topic's schemas", ERROR_REF),
    422: Reply("Invalid schema definition", ERROR_REF),
}


def _topic(call: Call) -> str:
    name = topic_name(call["tenant"], call["namespace"], call["topic"])
    call.service.policies.policies(name.namespace_name)         # 404 for an unknown namespace
    return str(name)


def _schema_json(stored: StoredSchema) -> dict[str, Any]:
    schema = stored.schema
    if schema.type == SchemaType.KEY_VALUE:
        parts = split_key_value(schema)
        data = json.dumps({side: (json.loads(part.data) if part is not None and _is_json(part.data) else "")
                           for side, part in zip(("key", "value"), parts)})
    else:
        data = schema.data.decode("utf-8", "replace")
    return {"version": stored.version, "type": schema.type.name, "timestamp": stored.timestamp_ms, "data": data,
            "properties": schema.properties}


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def _posted_schema(body: dict[str, Any]) -> SchemaData:
    type_name, text, properties = body["type"].upper(), body.get("schema", ""), body.get("properties") or {}
    if type_name == "BYTES":
        raise AdminError(NOT_ACCEPTABLE, "Do not upload a BYTES schema, because it's the default schema type")
    try:
        kind = SchemaType.parse(type_name)
        if kind != SchemaType.KEY_VALUE:
            return SchemaData(kind, text.encode(), properties)
        return _posted_key_value(text, properties)
    except InvalidSchemaDataError as exc:
        raise AdminError(UNPROCESSABLE, str(exc)) from None


def _posted_key_value(text: str, properties: dict[str, str]) -> SchemaData:
    """A KEY_VALUE upload: `schema` is {"key": ..., "value": ...}, each a definition ("" for a
    primitive), and the properties name the parts' types (`key.schema.type`, ...)."""
    try:
        parts = json.loads(text)
    except ValueError:
        parts = None
    if not isinstance(parts, dict) or set(parts) != {"key", "value"}:
        raise InvalidSchemaDataError('a KEY_VALUE schema is a JSON object {"key": ..., "value": ...}')
    sides = []
    for side in ("key", "value"):
        type_name = properties.get(f"{side}.schema.type", "BYTES").upper()
        definition = parts[side]
        data = b"" if definition in ("", None) else (definition if isinstance(definition, str)
                                                     else json.dumps(definition)).encode()
        sides.append(None if type_name == "BYTES" else SchemaData(SchemaType.parse(type_name), data))
    joined = join_key_value(sides[0], sides[1], encoding=properties.get("kv.encoding.type", "INLINE"))
    return SchemaData(SchemaType.KEY_VALUE, joined.data, {**joined.properties, **properties})


def _not_found(call: Call, sid: str) -> AdminError:
    versions = call.service.schemas.registry.versions(sid)
    if versions and versions[-1].deleted:
        return AdminError(NOT_FOUND, "Schema is deleted")
    return AdminError(NOT_FOUND, "Schema not found")


@routes.add("GET", BASE + "/schema", summary="Get the topic's latest schema.", params=TOPIC_PATH,
            replies={200: Reply("The schema", GET_SCHEMA_RESPONSE), **errors(404, 412)})
async def get_schema(call: Call) -> dict[str, Any]:
    sid = schema_id(_topic(call))
    stored = call.service.schemas.registry.latest(sid)
    if stored is None:
        raise _not_found(call, sid)
    return _schema_json(stored)


@routes.add("GET", BASE + "/schema/{version}", summary="Get one version of the topic's schema.",
            params=(*TOPIC_PATH, SCHEMA_VERSION), replies={200: Reply("The schema", GET_SCHEMA_RESPONSE),
                                                           **errors(400, 404, 412)})
async def get_schema_version(call: Call) -> dict[str, Any]:
    sid = schema_id(_topic(call))
    stored = call.service.schemas.registry.get(sid, call["version"])
    if stored is None:
        raise AdminError(NOT_FOUND, f"No schema version {call['version']}")
    return _schema_json(stored)


@routes.add("GET", BASE + "/schemas", summary="Get every version of the topic's schema since its last deletion.",
            params=TOPIC_PATH,
            replies={200: Reply("The schemas", {"type": "object", "properties": {
                "getSchemaResponses": {"type": "array", "items": GET_SCHEMA_RESPONSE}}}), **errors(404, 412)})
async def get_all_schemas(call: Call) -> dict[str, Any]:
    # As Apache (trimDeletedSchemaAndGetList): none since the last deletion is an empty list.
    live = call.service.schemas.registry.live(schema_id(_topic(call)))
    return {"getSchemaResponses": [_schema_json(stored) for stored in live]}


@routes.add("POST", BASE + "/schema", summary="Upload a schema (checked against the topic's compatibility strategy).",
            params=TOPIC_PATH, body=POST_SCHEMA_PAYLOAD, body_required=True,
            replies={200: Reply("The schema's version", POSTED_VERSION), **errors(400, 412), **_SCHEMA_ERRORS})
async def post_schema(call: Call) -> dict[str, Any]:
    topic = _topic(call)
    schemas = call.service.schemas
    version = await schemas.registry.put_if_absent(schema_id(topic), _posted_schema(call.body),
                                                   schemas.strategy(topic))
    return {"version": {"version": version}}


@routes.add("DELETE", BASE + "/schema", summary="Delete the topic's schema.", params=(*TOPIC_PATH, FORCE_DELETE),
            replies={200: Reply("The deletion's version (-1: none)", VERSION), **errors(412)})
async def delete_schema(call: Call) -> dict[str, int]:
    version = await call.service.schemas.registry.delete(schema_id(_topic(call)), force=call["force"])
    return {"version": -1 if version is None else version}


@routes.add("POST", BASE + "/compatibility", summary="Test whether a schema could be uploaded.", params=TOPIC_PATH,
            body=POST_SCHEMA_PAYLOAD, body_required=True,
            replies={202: Reply("Compatible", COMPATIBILITY), **errors(400, 412), **_SCHEMA_ERRORS})
async def test_compatibility(call: Call) -> web.Response:
    topic = _topic(call)
    schemas = call.service.schemas
    strategy = schemas.strategy(topic)
    schemas.registry.check_compatible(schema_id(topic), _posted_schema(call.body), strategy)
    # 202 Accepted, as Apache's SchemasResource.testCompatibility answers.
    return web.json_response({"compatibility": True, "schemaCompatibilityStrategy": strategy.value}, status=202)


@routes.add("POST", BASE + "/version", summary="The version of an identical schema of the topic (-1: none).",
            params=TOPIC_PATH, body=POST_SCHEMA_PAYLOAD, body_required=True,
            replies={200: Reply("The version", VERSION), **errors(400, 412), **_SCHEMA_ERRORS})
async def get_version_of(call: Call) -> dict[str, int]:
    version = call.service.schemas.registry.find_version(schema_id(_topic(call)), _posted_schema(call.body))
    return {"version": -1 if version is None else version}
