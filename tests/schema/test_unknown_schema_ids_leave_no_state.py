"""Looking up the schema of names that have none (GET_SCHEMA and the admin API take any topic
name of an existing namespace) keeps nothing: a registry cached an empty list per name asked
about, for good."""

from __future__ import annotations

from pyengine.schema import CompatibilityStrategy, SchemaData, SchemaType
from pyengine.schema.registry import LmdbSchemaRegistry
from pyengine.storage import StorageEnvironment


async def test_lookups_of_names_without_a_schema_keep_no_cache_entry(tmp_path):
    env = StorageEnvironment(tmp_path / "data", sync=False)
    try:
        registry = LmdbSchemaRegistry(env)
        for i in range(200):
            schema_id = f"public/default/nothing-{i}"
            assert registry.latest(schema_id) is None
            assert registry.get(schema_id, 0) is None
            assert registry.versions(schema_id) == []
            assert registry.find_version(schema_id, SchemaData(SchemaType.STRING)) is None
        assert registry._cache == {}
    finally:
        await env.drain()
        env.close()


async def test_a_forced_delete_keeps_no_cache_entry_and_a_schema_put_later_is_seen(tmp_path):
    env = StorageEnvironment(tmp_path / "data", sync=False)
    try:
        registry = LmdbSchemaRegistry(env)
        schema_id, schema = "public/default/t", SchemaData(SchemaType.STRING)
        assert await registry.put_if_absent(schema_id, schema, CompatibilityStrategy.FULL) == 0
        assert await registry.delete(schema_id, force=True) is None
        assert registry._cache == {} and registry.latest(schema_id) is None
        assert await registry.put_if_absent(schema_id, schema, CompatibilityStrategy.FULL) == 0  # numbered anew
        assert registry.latest(schema_id).version == 0
    finally:
        await env.drain()
        env.close()
