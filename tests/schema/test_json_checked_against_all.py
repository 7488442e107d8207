"""JSON schemas checked against all versions (a consumer under ALWAYS_INCOMPATIBLE, the sides of a
KEY_VALUE schema) are all parsed as Avro, as Pulsar's AvroSchemaBasedCompatibilityCheck does: the
old (Jackson JsonSchema) format is let through only by the check of one schema to the next."""

from __future__ import annotations

import json

import pytest

from pyengine.errors import IncompatibleSchemaError
from pyengine.schema import CompatibilityStrategy, SchemaData, SchemaType
from pyengine.schema import compatibility as rules
from pyengine.schema.registry import LmdbSchemaRegistry
from pyengine.storage import StorageEnvironment

S = CompatibilityStrategy
LEGACY = SchemaData(SchemaType.JSON, json.dumps({"type": "object", "id": "urn:jsonschema:Foo",
                                                 "properties": {"a": {"type": "integer"}}}).encode())
AVRO = SchemaData(SchemaType.JSON, json.dumps({"type": "record", "name": "Foo",
                                               "fields": [{"name": "a", "type": "int"}]}).encode())


@pytest.mark.parametrize(("old", "new"), [(LEGACY, AVRO), (AVRO, LEGACY)])
def test_one_schema_to_the_next_lets_the_old_format_through(old: SchemaData, new: SchemaData) -> None:
    rules.check([old], new, S.FULL)


async def test_a_consumer_under_always_incompatible_is_refused_next_to_an_old_format_schema(tmp_path) -> None:
    env = StorageEnvironment(tmp_path / "data", sync=False)
    try:
        registry = LmdbSchemaRegistry(env)
        assert await registry.put_if_absent("public/default/t", LEGACY, S.FULL) == 0
        with pytest.raises(IncompatibleSchemaError):
            registry.check_consumer("public/default/t", AVRO, S.ALWAYS_INCOMPATIBLE)
    finally:
        await env.drain()
        env.close()


def test_a_key_value_side_in_the_old_json_format_is_checked_as_avro() -> None:
    old = rules.join_key_value(SchemaData(SchemaType.STRING), LEGACY)
    new = rules.join_key_value(SchemaData(SchemaType.STRING), AVRO)
    with pytest.raises(IncompatibleSchemaError):
        rules.check([old], new, S.FULL)
    both_avro = rules.join_key_value(SchemaData(SchemaType.STRING), SchemaData(SchemaType.JSON, AVRO.data + b" "))
    rules.check([rules.join_key_value(SchemaData(SchemaType.STRING), AVRO)], both_avro, S.FULL)
