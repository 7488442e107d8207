"""The schema registry on the wire: PRODUCER and SUBSCRIBE with schemas, GET_SCHEMA and
GET_OR_CREATE_SCHEMA, as Apache's broker answers them."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core_ext.frames import encode_command
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from pyengine.schema import encode_version
from tests.protocol.wire_driver import WireClient

TOPIC = "persistent://public/default/typed"
Rec = {"type": "record", "name": "Rec", "fields": [{"name": "a", "type": "int"}]}
Rec_b = {**Rec, "fields": [*Rec["fields"], {"name": "b", "type": ["null", "string"], "default": None}]}
Rec_required_b = {**Rec, "fields": [*Rec["fields"], {"name": "b", "type": "string"}]}


def schema(definition: dict | None = None, kind: int = pb.Schema.JSON, **properties: str) -> dict:
    data = b"" if definition is None else json.dumps(definition).encode()
    return {"name": "JSON", "schema_data": data, "type": kind,
            "properties": [{"key": k, "value": v} for k, v in properties.items()]}


@contextlib.asynccontextmanager
async def serving(data_dir: Path, **config: Any) -> AsyncIterator[tuple[BrokerService, WireClient]]:
    """A broker of `config` serving on a free port, and a connection to it."""
    service = BrokerService(BrokerConfig(data_dir=data_dir, sync=False, num_coordinators=1, **config))
    await service.start()
    server = ProtocolServer(service, "127.0.0.1", 0)
    await server.start()
    client = await WireClient.connect(server.port)
    try:
        yield service, client
    finally:
        await client.close()
        await server.stop()
        await service.close()


async def test_producers_register_versions_and_get_them_in_producer_success(client: WireClient) -> None:
    first = await client.create_producer(TOPIC, producer_id=1, request_id=1, schema=schema(Rec))
    assert first.schema_version == encode_version(0)
    again = await client.create_producer(TOPIC, producer_id=2, request_id=2, schema=schema(Rec, __alwaysAllowNull="true"))
    assert again.schema_version == encode_version(0)          # the same schema (properties aside)
    evolved = await client.create_producer(TOPIC, producer_id=3, request_id=3, schema=schema(Rec_b))
    assert evolved.schema_version == encode_version(1)
    # a repeated PRODUCER for the same id answers its version again
    assert (await client.create_producer(TOPIC, producer_id=3, request_id=4, schema=schema(Rec_b))).schema_version \
        == encode_version(1)
    plain = await client.create_producer(TOPIC, producer_id=4, request_id=5)
    assert isinstance(plain, pb.CommandProducerSuccess) and not plain.HasField("schema_version")


async def test_an_incompatible_producer_is_refused_with_incompatible_schema(client: WireClient) -> None:
    await client.create_producer(TOPIC, producer_id=1, request_id=1, schema=schema(Rec))
    reply = await client.create_producer(TOPIC, producer_id=2, request_id=2, schema=schema(Rec_required_b))
    assert isinstance(reply, pb.CommandError)
    assert (reply.request_id, reply.error) == (2, pb.IncompatibleSchema)
    assert "strategy FULL" in reply.message
    reply = await client.create_producer(TOPIC, producer_id=3, request_id=3,
                                         schema={"name": "STRING", "schema_data": b"null", "type": pb.Schema.STRING})
    assert (reply.error, reply.message) == (pb.IncompatibleSchema, "Incompatible schema: exists schema type JSON, "
                                                                    "new schema type STRING")
    # nothing of the refused producers is left: their ids are free
    assert isinstance(await client.create_producer(TOPIC, producer_id=2, request_id=4), pb.CommandProducerSuccess)


@pytest.mark.parametrize("bad, reason", [
    ({"name": "x", "schema_data": b"{broken", "type": pb.Schema.AVRO}, "invalid Avro"),
    ({"name": "x", "schema_data": b"text", "type": pb.Schema.STRING}, "STRING schema"),
    ({"name": "x", "schema_data": b"", "type": pb.Schema.AUTO_CONSUME}, "client-side"),
])
async def test_invalid_schema_data_is_refused(client: WireClient, bad: dict, reason: str) -> None:
    reply = await client.create_producer(TOPIC, producer_id=1, request_id=1, schema=bad)
    assert (reply.error, reason in reply.message) == (pb.IncompatibleSchema, True)


async def test_namespace_policies_turn_off_auto_update_and_enforce_validation(service: BrokerService,
                                                                              client: WireClient) -> None:
    await client.create_producer(TOPIC, producer_id=1, request_id=1, schema=schema(Rec))
    policies = service.policies.policies("public/default")
    await service.policies.set_policies("public/default", dataclasses.replace(
        policies, is_allow_auto_update_schema=False, schema_validation_enforced=True))
    reply = await client.create_producer(TOPIC, producer_id=2, request_id=2, schema=schema(Rec_b))
    assert (reply.error, reply.message) == (pb.IncompatibleSchema, "Schema not found and schema auto updating "
                                                                    "is disabled.")
    known = await client.create_producer(TOPIC, producer_id=3, request_id=3, schema=schema(Rec))
    assert known.schema_version == encode_version(0)
    # the same schema written otherwise (as another client's JSON encoder would) is known too
    respelled = {**schema(Rec), "schema_data": json.dumps(Rec, indent=2).encode()}
    assert (await client.create_producer(TOPIC, producer_id=6, request_id=6, schema=respelled)).schema_version \
        == encode_version(0)
    reply = await client.create_producer(TOPIC, producer_id=4, request_id=4)
    assert reply.error == pb.IncompatibleSchema and "without a schema" in reply.message
    # a topic without a schema still takes producers of bytes
    assert isinstance(await client.create_producer(TOPIC + "-other", producer_id=5, request_id=5),
                      pb.CommandProducerSuccess)


async def test_a_consumer_registers_the_schema_of_an_idle_topic_and_is_checked_on_a_busy_one(
        service: BrokerService, client: WireClient) -> None:
    reply = await client.subscribe(TOPIC, "s1", consumer_id=1, request_id=1, schema=schema(Rec))
    assert isinstance(reply, pb.CommandSuccess)
    assert service.schemas.registry.latest("public/default/typed").version == 0
    # a reader of Rec_b can read Rec data (BACKWARD); one needing a required b cannot
    assert isinstance(await client.subscribe(TOPIC, "s2", consumer_id=2, request_id=2, schema=schema(Rec_b)),
                      pb.CommandSuccess)
    reply = await client.subscribe(TOPIC, "s3", consumer_id=3, request_id=3, schema=schema(Rec_required_b))
    assert (reply.request_id, reply.error) == (3, pb.IncompatibleSchema)
    assert len(service.schemas.registry.versions("public/default/typed")) == 1   # consumers on a busy topic add none


async def test_a_consumer_schema_on_a_busy_topic_without_schema_is_refused(client: WireClient) -> None:
    await client.create_producer(TOPIC, producer_id=1, request_id=1)      # a producer of bytes: busy
    reply = await client.subscribe(TOPIC, "s", consumer_id=1, request_id=2, schema=schema(Rec))
    assert reply.error == pb.IncompatibleSchema
    assert "active topic with empty(BYTES) schema: new schema type JSON" in reply.message


async def test_auto_consume_takes_whatever_the_topic_has(service: BrokerService, client: WireClient) -> None:
    auto = {"name": "AutoConsume", "schema_data": b"", "type": pb.Schema.AUTO_CONSUME}
    assert isinstance(await client.subscribe(TOPIC, "auto", consumer_id=1, request_id=1, schema=auto),
                      pb.CommandSuccess)
    assert service.schemas.registry.latest("public/default/typed") is None
    # an AUTO_CONSUME consumer does not make the topic busy: the next consumer's schema registers
    assert isinstance(await client.subscribe(TOPIC, "typed", consumer_id=2, request_id=2, schema=schema(Rec)),
                      pb.CommandSuccess)
    assert service.schemas.registry.latest("public/default/typed").version == 0


async def test_get_schema_answers_latest_or_a_version_and_errors_inside_its_response(client: WireClient) -> None:
    reply = await client.request("GET_SCHEMA", request_id=9, topic=TOPIC)
    assert isinstance(reply, pb.CommandGetSchemaResponse)
    assert (reply.request_id, reply.error_code, reply.error_message) == (9, pb.TopicNotFound,
                                                                         f"Topic not found or no-schema {TOPIC}")
    await client.create_producer(TOPIC + "-partition-1", producer_id=1, request_id=1, schema=schema(Rec, p="1"))
    await client.create_producer(TOPIC, producer_id=2, request_id=2, schema=schema(Rec_b))
    latest = await client.request("GET_SCHEMA", request_id=10, topic=TOPIC)
    assert not latest.HasField("error_code")
    assert latest.schema_version == encode_version(1)
    assert (latest.schema.name, latest.schema.type) == ("public/default/typed", pb.Schema.JSON)
    assert json.loads(latest.schema.schema_data) == Rec_b
    first = await client.request("GET_SCHEMA", request_id=11, topic=TOPIC, schema_version=encode_version(0))
    assert json.loads(first.schema.schema_data) == Rec
    assert [(p.key, p.value) for p in first.schema.properties] == [("p", "1")]
    missing = await client.request("GET_SCHEMA", request_id=12, topic=TOPIC, schema_version=encode_version(5))
    assert missing.error_code == pb.TopicNotFound
    empty = await client.request("GET_SCHEMA", request_id=13, topic=TOPIC, schema_version=b"")
    assert (empty.error_code, empty.error_message) == (pb.IncompatibleSchema, "Empty schema version")
    short = await client.request("GET_SCHEMA", request_id=14, topic=TOPIC, schema_version=b"\x01")
    assert short.error_code == pb.IncompatibleSchema and "8 bytes" in short.error_message
    bad = await client.request("GET_SCHEMA", request_id=15, topic="bad://a/b/c")
    assert (bad.request_id, bad.error_code) == (15, pb.InvalidTopicName)


async def test_get_or_create_schema(client: WireClient) -> None:
    reply = await client.request("GET_OR_CREATE_SCHEMA", request_id=1, topic=TOPIC, schema=schema(Rec))
    assert isinstance(reply, pb.CommandGetOrCreateSchemaResponse)
    assert (reply.request_id, reply.error_code) == (1, pb.TopicNotFound)       # the topic must exist
    await client.create_producer(TOPIC, producer_id=1, request_id=2)
    reply = await client.request("GET_OR_CREATE_SCHEMA", request_id=3, topic=TOPIC, schema=schema(Rec))
    assert (reply.request_id, reply.schema_version) == (3, encode_version(0))
    reply = await client.request("GET_OR_CREATE_SCHEMA", request_id=4, topic=TOPIC, schema=schema(Rec_required_b))
    assert (reply.request_id, reply.error_code) == (4, pb.IncompatibleSchema)


async def test_a_schema_of_a_type_this_broker_does_not_know_closes_only_that_connection(
        client: WireClient, connect, server) -> None:
    # Schema.Type is a closed enum: 99 cannot be set through protobuf, so patch the bytes. The
    # value is dropped while parsing, which leaves the required `type` missing: a malformed
    # command, answered as every malformed command is (that connection is closed).
    command = pb.BaseCommand(type=pb.BaseCommand.PRODUCER)
    command.producer.topic, command.producer.producer_id, command.producer.request_id = TOPIC, 1, 1
    command.producer.schema.name, command.producer.schema.schema_data = "S", b""
    command.producer.schema.type = pb.Schema.STRING
    raw = command.SerializeToString()
    assert raw.count(b"\x20\x01") == 1
    other = await connect(server.port)
    client.send_raw(encode_command(raw.replace(b"\x20\x01", b"\x20\x63")))
    assert await client.closed()
    assert isinstance(await other.create_producer(TOPIC, producer_id=2, request_id=2), pb.CommandProducerSuccess)


@pytest.mark.parametrize("namespace_value", [None, False, True])
async def test_a_namespace_cannot_turn_off_the_brokers_schema_validation(tmp_path, namespace_value) -> None:
    """Apache refuses a schema-less producer on a topic with a schema when the broker's
    schemaValidationEnforced OR the namespace's is set: a namespace's `false` does not lift
    the broker's `true` (it did here)."""
    async with serving(tmp_path, schema_validation_enforced=True) as (service, client):
        policies = service.policies.policies("public/default")
        await service.policies.set_policies("public/default", dataclasses.replace(
            policies, schema_validation_enforced=namespace_value))
        await client.create_producer(TOPIC, producer_id=1, request_id=1, schema=schema(Rec))
        reply = await client.create_producer(TOPIC, producer_id=2, request_id=2)
        assert reply.error == pb.IncompatibleSchema and "without a schema" in reply.message
