"""An embedded producer sends bytes, as a network client's producer without a schema: where
schema validation is enforced (by the broker, the namespace or the topic), the broker refuses it
on a topic with a schema (IncompatibleSchemaError). The embedding API did not ask the schema
registry at all, and wrote anything to typed topics."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pyengine.broker import Broker
from pyengine.errors import IncompatibleSchemaError
from pyengine.schema import SchemaData, SchemaType

T = "persistent://public/default/typed"
AVRO = SchemaData(SchemaType.AVRO, json.dumps(
    {"type": "record", "name": "Rec", "fields": [{"name": "a", "type": "int"}]}).encode())


async def enforce(broker: Broker, where: str) -> None:
    service = broker.service
    if where == "namespace":
        policies = service.policies.policies("public/default")
        await service.policies.set_policies("public/default",
                                            dataclasses.replace(policies, schema_validation_enforced=True))
    elif where == "topic":
        await service.policies.set_topic_policy(T, "schemaValidationEnforced", True)


@pytest.mark.parametrize("where", ["broker", "namespace", "topic"])
async def test_an_embedded_producer_is_refused_on_a_typed_topic_where_validation_is_enforced(
        tmp_path, where) -> None:
    """The wire refuses a PRODUCER without a schema there; the embedded producer wrote bytes."""
    async with Broker.embedded(tmp_path, sync=False, schema_validation_enforced=where == "broker") as broker:
        await (await broker.create_producer(T)).close()     # no schema yet: allowed
        assert await broker.service.schemas.for_producer(T, AVRO) == 0
        await enforce(broker, where)
        with pytest.raises(IncompatibleSchemaError, match="without a schema"):
            await broker.create_producer(T)
        topic = await broker.service.get_topic(T)
        assert topic.ledger.total_size == 0 and not topic.producers


async def test_an_embedded_producer_is_allowed_on_a_typed_topic_without_enforcement(tmp_path) -> None:
    """As Pulsar: with validation not enforced, a producer without a schema may write."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        assert await broker.service.schemas.for_producer(T, AVRO) == 0
        producer = await broker.create_producer(T)
        await producer.send(b"bytes")
        await producer.close()


async def test_an_embedded_producer_attaching_again_is_checked_too(tmp_path) -> None:
    """A producer whose topic is deleted attaches to the topic created again, as a network
    client's producer reconnects with a PRODUCER without a schema: refused if that topic now has
    a schema and validation is enforced."""
    async with Broker.embedded(tmp_path, sync=False, schema_validation_enforced=True) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"before")
        await broker.service.delete_topic(T)
        assert await broker.service.schemas.for_producer(T, AVRO) == 0
        with pytest.raises(IncompatibleSchemaError, match="without a schema"):
            await producer.send(b"after")
