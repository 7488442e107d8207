"""Schema registry findings of a review: an identical-schema lookup that parsed every version at
every producer connect, and what a topic's policies and deletion let through."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.schema import CompatibilityStrategy, SchemaData, SchemaType, encode_version
from pyengine.schema import compatibility as rules
from pyengine.schema.registry import LmdbSchemaRegistry
from pyengine.storage import StorageEnvironment
from tests.protocol.test_server_schemas import Rec, serving
from tests.protocol.test_server_schemas import schema as wire_schema
from tests.protocol.wire_driver import WireClient

S = CompatibilityStrategy
ID = "public/default/t"
TOPIC = "persistent://public/default/typed"


def record(fields: int, **extra: object) -> SchemaData:
    body = {"type": "record", "name": "R", "fields": [
        {"name": f"f{i}", "type": ["null", "string"], "default": None} for i in range(fields)], **extra}
    return SchemaData(SchemaType.AVRO, json.dumps(body).encode())


@pytest.fixture
def env(tmp_path: Path):
    env = StorageEnvironment(tmp_path / "data", sync=False)
    yield env
    env.close()


@pytest.fixture
def parses(monkeypatch) -> list[bytes]:
    """The Avro definitions parsed from now on, in order."""
    parsed: list[bytes] = []
    parse = rules.parse_avro

    def counting(data: bytes):
        parsed.append(data)
        return parse(data)
    monkeypatch.setattr(rules, "parse_avro", counting)
    return parsed


async def test_a_producer_sending_a_known_schema_again_parses_no_stored_version(env, parses) -> None:
    """Every producer (re)connect looked its schema up by parsing each live version from the
    oldest: 100 versions of 20-119 fields blocked the event loop for half a second per
    connect. The same bytes are now looked for first, and a stored version is parsed once."""
    n = 30
    registry = LmdbSchemaRegistry(env)
    for i in range(n):
        assert await registry.put_if_absent(ID, record(i + 1), S.FULL) == i
    parses.clear()
    assert await registry.put_if_absent(ID, record(n), S.FULL) == n - 1
    assert len(parses) <= 1                                    # its validation, not 1 + n + 1
    parses.clear()
    assert registry.find_version(ID, record(1)) == 0 and registry.find_version(ID, record(n)) == n - 1
    assert parses == []
    # the same schema in other bytes (a doc): the stored versions are parsed once, then kept
    respelled = record(n, doc="the latest")
    assert await registry.put_if_absent(ID, respelled, S.FULL) == n - 1
    parses.clear()
    for _ in range(3):
        assert await registry.put_if_absent(ID, respelled, S.FULL) == n - 1
        assert registry.find_version(ID, record(1, doc="the first")) == 0
    assert len(parses) <= 3 * 3                                # each call parses the new one only
    assert [s.version for s in registry.versions(ID)] == list(range(n))


async def test_identity_keys_kept_do_not_outlive_a_delete(env) -> None:
    """The parsed forms kept per version are forgotten with the versions: a forced delete
    numbers anew from 0, and a schema the same as the deleted version 0 is not version 0."""
    registry = LmdbSchemaRegistry(env)
    a, b = record(1), record(2)
    assert await registry.put_if_absent(ID, a, S.FULL) == 0
    assert registry.find_version(ID, record(1, doc="a")) == 0
    await registry.delete(ID, force=True)
    assert await registry.put_if_absent(ID, b, S.FULL) == 0
    assert registry.find_version(ID, record(1, doc="a")) is None
    assert registry.find_version(ID, record(2, doc="b")) == 0
    # after a tombstone, the versions before it are not found, parsed or not
    assert await registry.delete(ID) == 1
    assert registry.find_version(ID, record(2, doc="b")) is None
    assert await registry.put_if_absent(ID, a, S.FULL) == 2
    assert registry.find_version(ID, record(1, doc="a")) == 2


@pytest.mark.parametrize("topic_value", [None, False, True])
async def test_a_topic_cannot_turn_off_the_brokers_schema_validation(tmp_path, topic_value) -> None:
    """Apache refuses a schema-less producer on a topic with a schema when the broker's
    schemaValidationEnforced OR the topic's is set: a topic policy's `false` replaced the
    broker's `true` here, and let such producers write to a typed topic."""
    async with serving(tmp_path, schema_validation_enforced=True) as (service, client):
        await client.create_producer(TOPIC, producer_id=1, request_id=1, schema=wire_schema(Rec))
        if topic_value is not None:
            await service.policies.set_topic_policy(TOPIC, "schemaValidationEnforced", topic_value)
        reply = await client.create_producer(TOPIC, producer_id=2, request_id=2)
        assert not isinstance(reply, pb.CommandProducerSuccess)
        assert reply.error == pb.IncompatibleSchema and "without a schema" in reply.message


def schema_request(client: WireClient, command: str) -> Awaitable[Any]:
    """What registers a schema on the wire: a PRODUCER, GET_OR_CREATE_SCHEMA, or a SUBSCRIBE
    on an idle topic."""
    if command == "PRODUCER":
        return client.create_producer(TOPIC, producer_id=3, request_id=3, schema=wire_schema(Rec))
    if command == "GET_OR_CREATE_SCHEMA":
        return client.request("GET_OR_CREATE_SCHEMA", request_id=3, topic=TOPIC, schema=wire_schema(Rec))
    return client.subscribe(TOPIC, "s", consumer_id=3, request_id=3, schema=wire_schema(Rec))


@pytest.mark.parametrize("command", ["PRODUCER", "GET_OR_CREATE_SCHEMA", "SUBSCRIBE"])
async def test_a_schema_registered_while_its_topic_is_deleted_does_not_outlive_it(
        tmp_path, monkeypatch, command) -> None:
    """A schema registration arriving while the topic's deletion was being written got the
    closing topic, waited for the schema's lock the deletion held, then stored version 0 after
    the deletion: a schema of a topic that no longer exists. It is refused now as a closed topic
    is (ServiceNotReady: clients retry, and register it on the topic created again)."""
    async with serving(tmp_path) as (service, client):
        registry = service.schemas.registry
        sid = "public/default/typed"
        reply = await client.create_producer(TOPIC, producer_id=1, request_id=1)
        assert isinstance(reply, pb.CommandProducerSuccess)
        await client.request("CLOSE_PRODUCER", producer_id=1, request_id=2)
        held, release = asyncio.Event(), asyncio.Event()
        deleting = registry.deleting

        @contextlib.asynccontextmanager
        async def held_deleting(schema_id: str):
            async with deleting(schema_id) as write:        # the schema's lock taken
                held.set()
                await release.wait()
                yield write
        monkeypatch.setattr(registry, "deleting", held_deleting)
        deletion = asyncio.ensure_future(service.delete_topic(TOPIC))
        await asyncio.wait_for(held.wait(), 5)
        registering = asyncio.ensure_future(schema_request(client, command))

        async def waits_for_the_lock() -> None:
            while registry._locks[sid][1][0] < 2:
                await asyncio.sleep(0.005)
        await asyncio.wait_for(waits_for_the_lock(), 5)
        release.set()
        await deletion
        reply = await registering
        assert not service.topic_exists(TOPIC)
        assert registry.versions(sid) == []
        error = reply.error_code if command == "GET_OR_CREATE_SCHEMA" else reply.error
        assert error == pb.ServiceNotReady
        # retried, it registers the schema on the topic created again
        reply = await client.create_producer(TOPIC, producer_id=4, request_id=4, schema=wire_schema(Rec))
        assert isinstance(reply, pb.CommandProducerSuccess) and reply.schema_version == encode_version(0)
