"""A schema registry kept for a process's life holds nothing for the topics deleted long ago:
their cache entries and locks went with them (found by an audit of unbounded growth: one
cache entry and one lock per deleted topic, for good)."""

from __future__ import annotations

import asyncio

from pyengine.schema import CompatibilityStrategy, SchemaData, SchemaType
from pyengine.schema.registry import LmdbSchemaRegistry
from pyengine.storage import StorageEnvironment


async def test_topics_created_and_deleted_leave_no_cache_entry_nor_lock(tmp_path):
    env = StorageEnvironment(tmp_path / "data", sync=False)
    try:
        registry = LmdbSchemaRegistry(env)
        schema = SchemaData(SchemaType.STRING)
        for i in range(100):
            schema_id = f"public/default/t{i}"
            assert await registry.put_if_absent(schema_id, schema, CompatibilityStrategy.FULL) == 0
            async with registry.deleting(schema_id) as write:
                await env.submit(write)
        assert registry._locks == {} and registry._cache == {}
        assert registry.versions("public/default/t7") == []     # read again: deleted
    finally:
        await env.drain()
        env.close()


async def test_a_lock_waited_for_is_kept_until_its_last_user(tmp_path):
    env = StorageEnvironment(tmp_path / "data", sync=False)
    try:
        registry = LmdbSchemaRegistry(env)
        schema = SchemaData(SchemaType.STRING)
        order = []

        async def put(tag):
            async with registry._locked("public/default/t"):
                order.append(("in", tag))
                await asyncio.sleep(0.01)
                order.append(("out", tag))

        await asyncio.gather(put(1), put(2), put(3))
        assert order == [("in", 1), ("out", 1), ("in", 2), ("out", 2), ("in", 3), ("out", 3)]
        assert registry._locks == {}
        assert await registry.put_if_absent("public/default/t", schema, CompatibilityStrategy.FULL) == 0
    finally:
        await env.drain()
        env.close()
