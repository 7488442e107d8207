"""The schema registry on the data dir's LMDB metadata database: one JSON record per schema id
(`/schemas/<tenant>/<namespace>/<topic>`) holding every version, tombstones included."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from pyengine.schema import (
    AVRO_BASED,
    CompatibilityStrategy,
    NoSchemaError,
    SchemaData,
    SchemaRegistry,
    SchemaType,
    StoredSchema,
)
from pyengine.schema import compatibility as rules
from pyengine.storage import StorageEnvironment
from pyengine.storage.environment import WriteFn

S = CompatibilityStrategy
_CONSUMER_CHECKED_WITH_LATEST = frozenset({S.BACKWARD, S.FORWARD, S.FORWARD_TRANSITIVE, S.FULL})


def _to_json(stored: StoredSchema) -> dict[str, Any]:
    schema = stored.schema
    return {"version": stored.version, "type": schema.type.name, "data": base64.b64encode(schema.data).decode(),
            "properties": schema.properties, "name": schema.name, "timestamp": stored.timestamp_ms,
            "deleted": stored.deleted}


def _from_json(record: dict[str, Any]) -> StoredSchema:
    schema = SchemaData(SchemaType[record["type"]], base64.b64decode(record["data"]), record["properties"],
                        record.get("name", ""))
    return StoredSchema(record["version"], schema, record["timestamp"], record["deleted"])


_UNPARSED = object()


@dataclass
class _Cached:
    """A schema id's stored versions, and the identity keys (`rules.identity_key`) of those an
    identical-schema lookup parsed, by version: each is parsed once, not at every lookup."""

    versions: list[StoredSchema]
    identity_keys: dict[int, Any] = field(default_factory=dict)


class LmdbSchemaRegistry(SchemaRegistry):
    def __init__(self, env: StorageEnvironment, *, clock_ms: Callable[[], int] | None = None) -> None:
        self.env = env
        self._db = env.db("metadata")
        self._cache: dict[str, _Cached] = {}
        # schema id -> its lock and how many hold or wait for it: dropped when none do, so
        # the ids of topics deleted long ago keep no lock
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))

    @contextlib.asynccontextmanager
    async def _locked(self, schema_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.setdefault(schema_id, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[schema_id]

    @staticmethod
    def _key(schema_id: str) -> bytes:
        return f"/schemas/{schema_id}".encode()

    def versions(self, schema_id: str) -> list[StoredSchema]:
        cached = self._cache.get(schema_id)
        if cached is None:
            with self.env.read() as txn:
                raw = txn.get(self._key(schema_id), db=self._db)
            if raw is None:
                # Not cached: any name can be looked up (GET_SCHEMA, the admin API), and one
                # entry per name asked about would grow for good.
                return []
            cached = self._cache[schema_id] = _Cached([_from_json(r) for r in json.loads(raw)])
        return list(cached.versions)

    async def _store(self, schema_id: str, versions: list[StoredSchema]) -> None:
        key, db = self._key(schema_id), self._db
        if versions:
            raw = json.dumps([_to_json(v) for v in versions], sort_keys=True).encode()
            await self.env.submit(lambda txn: txn.put(key, raw, db=db), key=("schemas", schema_id))
            # the keys parsed stay, but for a delete's: the versions before a tombstone no longer count
            before = self._cache.get(schema_id)
            kept = before.identity_keys if before is not None and not versions[-1].deleted else {}
            self._cache[schema_id] = _Cached(versions, kept)
        else:
            await self.env.submit(lambda txn: txn.delete(key, db=db), key=("schemas", schema_id))
            self._cache.pop(schema_id, None)    # absent: read (as none) when asked, not kept

    def find_version(self, schema_id: str, schema: SchemaData) -> int | None:
        return self._identical(schema_id, self.live(schema_id), schema)

    def _identical(self, schema_id: str, live: list[StoredSchema], schema: SchemaData) -> int | None:
        """The live version that is the same schema (as Apache's SchemaRegistryServiceImpl has
        it): the same type, and the same Avro schema for the Avro-defined types (Java's
        `Schema.equals`: docs and aliases aside), the same bytes otherwise (properties aside).

        The same bytes are looked for first, with nothing parsed: what a producer connecting
        again sends. `put_if_absent` never stores a schema the same as a live one, so at most
        one live version is, and a version of the same bytes is that one. Only then is the
        schema parsed, once, against the stored versions' identity keys, each parsed once and
        kept with the cached versions."""
        same_type = [stored for stored in live if stored.schema.type == schema.type]
        for stored in same_type:
            if rules.same_definition(stored.schema, schema):
                return stored.version
        if schema.type not in AVRO_BASED or not same_type:
            return None
        key = rules.identity_key(schema.data)
        if key is None:
            return None
        cached = self._cache.get(schema_id)
        known: dict[int, Any] = cached.identity_keys if cached is not None else {}
        for stored in same_type:
            stored_key = known.get(stored.version, _UNPARSED)
            if stored_key is _UNPARSED:
                stored_key = known[stored.version] = rules.identity_key(stored.schema.data)
            if stored_key == key:
                return stored.version
        return None

    def _to_check(self, live: list[StoredSchema], strategy: CompatibilityStrategy) -> list[SchemaData]:
        return [s.schema for s in (live if strategy.transitive else live[-1:])]

    async def put_if_absent(self, schema_id: str, schema: SchemaData, strategy: CompatibilityStrategy, *,
                            check: Callable[[], None] | None = None) -> int:
        rules.validate(schema)
        async with self._locked(schema_id):
            if check is not None:
                check()
            versions = self.versions(schema_id)
            live = self.live(schema_id)
            same = self._identical(schema_id, live, schema)
            if same is not None:
                return same
            rules.check(self._to_check(live, strategy), schema, strategy)
            version = versions[-1].version + 1 if versions else 0
            await self._store(schema_id, [*versions, StoredSchema(version, schema, self._clock_ms())])
            return version

    async def delete(self, schema_id: str, *, force: bool = False) -> int | None:
        async with self._locked(schema_id):
            versions = self.versions(schema_id)
            if force:
                if versions:
                    await self._store(schema_id, [])
                return None
            # As Apache's SchemaRegistryServiceImpl.deleteSchema: a deletion is a version of its
            # own, stored whatever comes before it (none, or another deletion).
            tombstone = StoredSchema(versions[-1].version + 1 if versions else 0, SchemaData(SchemaType.NONE),
                                     self._clock_ms(), deleted=True)
            await self._store(schema_id, [*versions, tombstone])
            return tombstone.version

    @contextlib.asynccontextmanager
    async def deleting(self, schema_id: str) -> AsyncIterator[WriteFn]:
        """A forced delete of `schema_id` for the caller to put in the LMDB write that deletes
        its topic: a crash leaves both or neither (the schema, left alone, would be a topic's
        created again under the name). Forgotten here once the block ends without an error."""
        key, db = self._key(schema_id), self._db
        async with self._locked(schema_id):
            yield lambda txn: txn.delete(key, db=db)
            self._cache.pop(schema_id, None)        # read again (empty) if asked: not kept for good

    def changes_under_way(self, namespace: str) -> list[asyncio.Lock]:
        """The locks of the schema changes under way in `namespace` (`tenant/namespace`): an
        upload checked the namespace before it is deleted, so its deletion waits for them."""
        prefix = f"{namespace}/"
        return [lock for sid, (lock, _) in self._locks.items() if sid.startswith(prefix)]

    def namespace_deletion(self, namespace: str) -> WriteFn:
        """The deletion of every schema of the namespace `namespace`, for the caller to put in
        the LMDB write that deletes the namespace (with no change of them under way: see
        `changes_under_way`): kept by its topics' names, they would be a namespace's created
        again under its name, and in a commit of their own a crash could leave them so. Once it
        is durable, `forget_namespace`."""
        key_prefix, db = self._key(f"{namespace}/"), self._db

        def delete_all(txn: Any) -> None:
            cursor = txn.cursor(db=db)
            keys = []
            if cursor.set_range(key_prefix):
                for key in cursor.iternext(values=False):
                    if not key.startswith(key_prefix):
                        break
                    keys.append(key)
            for key in keys:
                txn.delete(key, db=db)
        return delete_all

    def forget_namespace(self, namespace: str) -> None:
        """Its schemas were deleted (`namespace_deletion`): no longer cached."""
        prefix = f"{namespace}/"
        for sid in [sid for sid in self._cache if sid.startswith(prefix)]:
            del self._cache[sid]            # (read meanwhile, they were cached as before the write)

    def check_compatible(self, schema_id: str, schema: SchemaData, strategy: CompatibilityStrategy) -> None:
        rules.validate(schema)
        rules.check(self._to_check(self.live(schema_id), strategy), schema, strategy)

    def check_consumer(self, schema_id: str, schema: SchemaData, strategy: CompatibilityStrategy) -> None:
        # A consumer's schema must read what the topic's schema wrote (BACKWARD), against the
        # latest schema, or against all of them for the transitive strategies.
        if strategy == S.ALWAYS_COMPATIBLE:
            return
        rules.validate(schema)
        live = self.live(schema_id)
        if not live:
            raise NoSchemaError("Topic does not have schema to check")
        if strategy in _CONSUMER_CHECKED_WITH_LATEST:
            rules.check([live[-1].schema], schema, S.BACKWARD)
        else:
            rules.check([s.schema for s in live], schema, strategy, latest_only=False)
