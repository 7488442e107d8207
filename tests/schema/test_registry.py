"""The schema registry on LMDB: versions, identical schemas, deletes, strategies, persistence,
checked against a small reference model by a hypothesis state machine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pyengine.errors import IncompatibleSchemaError
from pyengine.schema import (
    CompatibilityStrategy,
    InvalidSchemaDataError,
    NoSchemaError,
    SchemaData,
    SchemaType,
    decode_version,
    encode_version,
    schema_id,
)
from pyengine.schema.registry import LmdbSchemaRegistry
from pyengine.storage import StorageEnvironment
from tests.schema.test_compatibility import V1, V2_WITH_DEFAULT, V2_WITHOUT_DEFAULT

S = CompatibilityStrategy
ID = "public/default/t"


@pytest.fixture
def env(tmp_path: Path):
    env = StorageEnvironment(tmp_path / "data", sync=False)
    yield env
    env.close()


async def test_versions_count_from_zero_and_an_identical_schema_keeps_its_version(env: StorageEnvironment) -> None:
    registry = LmdbSchemaRegistry(env)
    assert await registry.put_if_absent(ID, V1, S.FULL) == 0
    assert await registry.put_if_absent(ID, V2_WITH_DEFAULT, S.FULL) == 1
    # the same Avro schema written differently, with other properties: the same version
    respelled = json.dumps(json.loads(V1.data), indent=2).encode()
    assert await registry.put_if_absent(ID, SchemaData(SchemaType.AVRO, respelled, {"x": "y"}), S.FULL) == 0
    assert [s.version for s in registry.versions(ID)] == [0, 1]
    assert registry.latest(ID).schema == V2_WITH_DEFAULT
    assert registry.get(ID, 0).schema == V1 and registry.get(ID, 7) is None


async def test_an_incompatible_schema_is_refused_and_nothing_is_stored(env: StorageEnvironment) -> None:
    registry = LmdbSchemaRegistry(env)
    await registry.put_if_absent(ID, V1, S.FULL)
    with pytest.raises(IncompatibleSchemaError, match="strategy FULL"):
        await registry.put_if_absent(ID, V2_WITHOUT_DEFAULT, S.FULL)
    with pytest.raises(IncompatibleSchemaError, match="exists schema type AVRO"):
        await registry.put_if_absent(ID, SchemaData(SchemaType.STRING), S.BACKWARD)
    with pytest.raises(InvalidSchemaDataError):
        await registry.put_if_absent(ID, SchemaData(SchemaType.AVRO, b"{broken"), S.ALWAYS_COMPATIBLE)
    assert [s.version for s in registry.versions(ID)] == [0]
    assert await registry.put_if_absent(ID, V2_WITHOUT_DEFAULT, S.FORWARD) == 1


async def test_a_delete_takes_a_version_and_the_next_schema_is_not_checked(env: StorageEnvironment) -> None:
    registry = LmdbSchemaRegistry(env)
    await registry.put_if_absent(ID, V1, S.FULL)
    assert await registry.delete(ID) == 1
    assert registry.latest(ID) is None and registry.get(ID, 0) is None and registry.live(ID) == []
    assert await registry.delete(ID) == 2                       # a deletion again, as Apache's
    assert await registry.put_if_absent(ID, SchemaData(SchemaType.STRING), S.ALWAYS_INCOMPATIBLE) == 3
    assert await registry.put_if_absent(ID, V1, S.ALWAYS_COMPATIBLE) == 4      # a deleted one is new again
    assert await registry.delete(ID, force=True) is None
    assert registry.versions(ID) == []
    assert await registry.put_if_absent(ID, V1, S.FULL) == 0     # a forced delete forgets the numbering


async def test_schemas_survive_a_reopen(tmp_path: Path) -> None:
    env = StorageEnvironment(tmp_path / "data", sync=False)
    await LmdbSchemaRegistry(env).put_if_absent(ID, V1, S.FULL)
    await LmdbSchemaRegistry(env).delete(ID)
    env.close()
    env = StorageEnvironment(tmp_path / "data", sync=False)
    try:
        registry = LmdbSchemaRegistry(env)
        assert [(s.version, s.deleted) for s in registry.versions(ID)] == [(0, False), (1, True)]
        assert registry.versions(ID)[0].schema == V1
    finally:
        env.close()


async def test_consumers_must_read_the_topic_schema(env: StorageEnvironment) -> None:
    registry = LmdbSchemaRegistry(env)
    with pytest.raises(NoSchemaError):
        registry.check_consumer(ID, V1, S.FULL)
    registry.check_consumer(ID, V1, S.ALWAYS_COMPATIBLE)
    await registry.put_if_absent(ID, V1, S.FULL)
    registry.check_consumer(ID, V2_WITH_DEFAULT, S.FULL)            # can read V1 data
    with pytest.raises(IncompatibleSchemaError):
        registry.check_consumer(ID, V2_WITHOUT_DEFAULT, S.FORWARD)  # FORWARD too checks as BACKWARD
    with pytest.raises(IncompatibleSchemaError):
        registry.check_consumer(ID, V1, S.ALWAYS_INCOMPATIBLE)      # no shortcut for consumers


async def test_concurrent_puts_of_one_schema_get_one_version(env: StorageEnvironment) -> None:
    registry = LmdbSchemaRegistry(env)
    versions = await asyncio.gather(*(registry.put_if_absent(ID, V1, S.FULL) for _ in range(10)))
    assert versions == [0] * 10 and len(registry.versions(ID)) == 1


def test_versions_are_eight_bytes_big_endian_and_ids_drop_domain_and_partition() -> None:
    assert encode_version(1) == b"\x00" * 7 + b"\x01" and encode_version(None) == b""
    assert decode_version(encode_version(2**40)) == 2**40
    with pytest.raises(InvalidSchemaDataError, match="8 bytes"):
        decode_version(b"\x01")
    assert schema_id("persistent://public/default/t-partition-3") == "public/default/t"
    assert schema_id("non-persistent://public/default/t") == "public/default/t"
    assert schema_id("t") == "public/default/t"


# --- the registry against a reference model -----------------------------------------------

POOL = [V1, V2_WITH_DEFAULT, V2_WITHOUT_DEFAULT, SchemaData(SchemaType.STRING), SchemaData(SchemaType.INT64)]
COMPATIBLE_WITH_LATEST = {  # (old, new) pairs the FULL strategy accepts, by pool index
    (0, 1), (1, 0), (3, 3), (4, 4), (0, 0), (1, 1), (2, 2)}


class RegistryModel(RuleBasedStateMachine):
    """Versions: a list of (pool index | None for a tombstone); FULL against the latest."""

    @initialize()
    def open(self) -> None:
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="pyengine-schema-model-")
        self.env = StorageEnvironment(Path(self.dir) / "data", sync=False)
        self.registry = LmdbSchemaRegistry(self.env)
        self.model: list[int | None] = []
        self.loop = asyncio.new_event_loop()

    def teardown(self) -> None:
        import shutil
        self.loop.close()
        self.env.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def live(self) -> list[tuple[int, int]]:
        start = max((i + 1 for i, s in enumerate(self.model) if s is None), default=0)
        return [(v, s) for v, s in enumerate(self.model) if v >= start and s is not None]

    @rule(index=st.integers(0, len(POOL) - 1))
    def put(self, index: int) -> None:
        live = self.live()
        same = next((v for v, s in live if s == index), None)
        expected: int | None | type = same
        if same is None:
            expected = (len(self.model) if not live or (live[-1][1], index) in COMPATIBLE_WITH_LATEST
                        else IncompatibleSchemaError)
        try:
            got = self.loop.run_until_complete(self.registry.put_if_absent(ID, POOL[index], S.FULL))
        except IncompatibleSchemaError:
            got = IncompatibleSchemaError
        assert got == expected
        if got == len(self.model):
            self.model.append(index)

    @rule()
    def delete(self) -> None:
        # As Apache: every deletion is a version of its own, also of a deleted or absent schema.
        got = self.loop.run_until_complete(self.registry.delete(ID))
        assert got == len(self.model)
        self.model.append(None)

    @rule()
    def reopen(self) -> None:
        self.registry = LmdbSchemaRegistry(self.env)       # nothing cached: read from LMDB

    @invariant()
    def same_versions(self) -> None:
        if not hasattr(self, "registry"):
            return
        stored = [(s.version, None if s.deleted else POOL.index(s.schema)) for s in self.registry.versions(ID)]
        assert stored == list(enumerate(self.model))
        latest = self.registry.latest(ID)
        live = self.live()
        assert (latest.version if latest else None) == (live[-1][0] if live else None)


TestRegistryModel = RegistryModel.TestCase
TestRegistryModel.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
