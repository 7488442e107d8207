"""Finding an identical schema as Pulsar's broker does (`getSchemaVersionBySchemaData`): two
Avro-defined schemas are the same when Java's `Schema.equals` says so, which ignores docs,
aliases and a field's default sort order, but not names, types, defaults or custom properties."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyengine.errors import IncompatibleSchemaError
from pyengine.schema import CompatibilityStrategy, SchemaData, SchemaType
from pyengine.schema.registry import LmdbSchemaRegistry
from pyengine.storage import StorageEnvironment

S = CompatibilityStrategy
ID = "public/default/identity"


def schema(kind: SchemaType = SchemaType.AVRO, **extra: object) -> SchemaData:
    field = {"name": "a", "type": "int", **extra.pop("field", {})}
    nested = {"type": "record", "name": "N", "fields": [{"name": "x", "type": "string", **extra.pop("nested", {})}]}
    body = {"type": "record", "name": "Rec", "namespace": "org.example",
            "fields": [field, {"name": "n", "type": ["null", nested], "default": None}], **extra}
    return SchemaData(kind, json.dumps(body).encode())


@pytest.fixture
def env(tmp_path: Path):
    env = StorageEnvironment(tmp_path / "data", sync=False)
    yield env
    env.close()


@pytest.mark.parametrize("kind", [SchemaType.AVRO, SchemaType.JSON], ids=["avro", "json"])
@pytest.mark.parametrize("variant", [
    {"doc": "a record"},
    {"aliases": ["org.example.Old"]},
    {"field": {"doc": "the a field"}},
    {"field": {"aliases": ["b"]}},
    {"field": {"order": "ascending"}},
    {"nested": {"doc": "nested doc"}},
], ids=["record-doc", "record-aliases", "field-doc", "field-aliases", "default-order", "nested-field-doc"])
async def test_a_schema_differing_only_in_docs_or_aliases_is_the_same_version(env, kind, variant) -> None:
    registry = LmdbSchemaRegistry(env)
    assert await registry.put_if_absent(ID, schema(kind), S.FULL) == 0
    same = schema(kind, **variant)
    # Pulsar answers the existing version: no new version, even under ALWAYS_INCOMPATIBLE,
    # and it is found with auto-update off (find_version)
    assert registry.find_version(ID, same) == 0
    assert await registry.put_if_absent(ID, same, S.ALWAYS_INCOMPATIBLE) == 0
    assert [s.version for s in registry.versions(ID)] == [0]


@pytest.mark.parametrize("variant", [
    {"field": {"default": 1}},
    {"field": {"order": "descending"}},
    {"field": {"type": "long"}},
    {"fooProp": "bar"},
    {"namespace": "org.other"},
], ids=["default", "order", "type", "custom-property", "namespace"])
async def test_a_schema_differing_in_what_equals_compares_is_a_new_schema(env, variant) -> None:
    registry = LmdbSchemaRegistry(env)
    await registry.put_if_absent(ID, schema(), S.FULL)
    other = schema(**variant)
    assert registry.find_version(ID, other) is None
    with pytest.raises(IncompatibleSchemaError):
        await registry.put_if_absent(ID, other, S.ALWAYS_INCOMPATIBLE)
