"""Schemas through `pyengine.client`: producers and consumers that declare one, the versions
they get, the schema version on their messages, and `get_schema_info`."""

from __future__ import annotations

import json

import pytest

from pyengine.client import (
    Client, IncompatibleSchemaError, SchemaData, SchemaType, TopicNotFoundError,
)
from tests.client.conftest import NetworkBroker

TOPIC = "persistent://public/default/typed"
Rec = {"type": "record", "name": "Rec", "fields": [{"name": "a", "type": "int"}]}
Rec_b = {**Rec, "fields": [*Rec["fields"], {"name": "b", "type": ["null", "string"], "default": None}]}
Rec_required_b = {**Rec, "fields": [*Rec["fields"], {"name": "b", "type": "string"}]}


def json_schema(definition: dict) -> SchemaData:
    return SchemaData(SchemaType.JSON, json.dumps(definition).encode(), name="Rec")


async def test_producers_get_versions_and_stamp_their_messages(client: Client) -> None:
    first = await client.create_producer(TOPIC, schema=json_schema(Rec))
    evolved = await client.create_producer(TOPIC, schema=json_schema(Rec_b), batching_enabled=True)
    plain = await client.create_producer(TOPIC)
    assert (first.schema_version, evolved.schema_version, plain.schema_version) == (0, 1, None)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest", schema=json_schema(Rec_b))
    await first.send(b'{"a": 1}')
    await evolved.send(b'{"a": 2, "b": "x"}')
    await plain.send(b"raw")
    got = [await consumer.receive(timeout=5) for _ in range(3)]
    assert [m.schema_version for m in got] == [0, 1, None]
    info = await client.get_schema_info(TOPIC)
    assert (info.version, info.schema.type, json.loads(info.schema.data)) == (1, SchemaType.JSON, Rec_b)
    assert json.loads((await client.get_schema_info(TOPIC, 0)).schema.data) == Rec


async def test_incompatible_schemas_raise_and_a_topic_without_one_has_no_info(client: Client) -> None:
    await client.create_producer(TOPIC, schema=json_schema(Rec))
    with pytest.raises(IncompatibleSchemaError, match="strategy FULL"):
        await client.create_producer(TOPIC, schema=json_schema(Rec_required_b))
    with pytest.raises(IncompatibleSchemaError):
        await client.subscribe(TOPIC, "s", schema=SchemaData(SchemaType.STRING))
    with pytest.raises(TopicNotFoundError):
        await client.get_schema_info("persistent://public/default/untyped")
    with pytest.raises(TopicNotFoundError):
        await client.get_schema_info(TOPIC, 7)


async def test_the_schema_version_comes_back_after_a_reconnect(broker: NetworkBroker, client: Client) -> None:
    producer = await client.create_producer(TOPIC, schema=json_schema(Rec))
    await producer.send(b'{"a": 1}')
    await broker.restart()
    await producer.send(b'{"a": 2}')                  # re-created on the new connection
    assert producer.schema_version == 0
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    assert [(await consumer.receive(timeout=5)).schema_version for _ in range(2)] == [0, 0]


async def test_bad_schema_arguments_are_refused_before_anything_is_sent(client: Client) -> None:
    with pytest.raises(TypeError, match="SchemaData"):
        await client.create_producer(TOPIC, schema={"type": "JSON"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="SchemaData"):
        await client.subscribe(TOPIC, "s", schema="STRING")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="version"):
        await client.get_schema_info(TOPIC, -1)
    with pytest.raises(ValueError, match="scalable"):
        await client.create_producer("topic://public/default/scaled", schema=json_schema(Rec))
