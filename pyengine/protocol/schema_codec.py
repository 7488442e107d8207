"""The wire's `Schema` message and the registry's `SchemaData`, both ways (broker and client)."""

from __future__ import annotations

from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.schema import SchemaData, SchemaType


def fill_schema(target: pb.Schema, schema: SchemaData, name: str | None = None) -> None:
    """Write `schema` into a command's Schema field (`name` overrides the schema's own)."""
    target.name = schema.name if name is None else name
    target.schema_data = schema.data
    target.type = int(schema.type)
    for key, value in schema.properties.items():
        target.properties.add(key=key, value=value)


def schema_from_proto(schema: pb.Schema) -> SchemaData:
    """The registry's view of a command's schema (a type this broker does not know is invalid)."""
    properties: dict[str, str] = {}
    for pair in schema.properties:
        properties[pair.key] = pair.value
    return SchemaData(SchemaType.parse(schema.type), schema.schema_data, properties, schema.name)
