"""Typed producers and consumers of the official `pulsar-client` against `pyengine serve`: the
schema registry seen through the client's own schemas (StringSchema, JsonSchema), its
`get_schema_info`, and the admin REST API's schema resource."""

from __future__ import annotations

import json

import pulsar
import pytest
from pulsar.schema import Double, Integer, JsonSchema, Record, String, StringSchema

from pyengine.testing import ServeProcess

NS = "persistent://public/default"


class Reading(Record):
    sensor = String()
    value = Integer()


def evolved(with_default: bool) -> type[Record]:
    """The next version of Reading (same record name): a new field, with or without a default."""
    fields = {"sensor": String(), "value": Integer(),
              "unit": Double(required_default=True) if with_default else Double(required=True)}
    return type("Reading", (Record,), fields)


def test_typed_producers_and_consumers_share_the_topic_schema(official: pulsar.Client, broker: ServeProcess) -> None:
    topic = f"{NS}/schema-json"
    producer = official.create_producer(topic, schema=JsonSchema(Reading))
    consumer = official.subscribe(topic, "s", schema=JsonSchema(Reading),
                                  initial_position=pulsar.InitialPosition.Earliest)
    producer.send(Reading(sensor="t1", value=20))
    message = consumer.receive(timeout_millis=5000)
    assert (message.value().sensor, message.value().value) == ("t1", 20)
    consumer.acknowledge(message)
    info = official._client.get_schema_info(topic, -1)
    assert json.loads(info.schema())["name"] == "Reading"
    assert broker.admin("GET", "/admin/v2/schemas/public/default/schema-json/schema")["version"] == 0


def test_an_evolution_with_a_default_is_a_new_version_and_one_without_is_refused(official: pulsar.Client,
                                                                                 broker: ServeProcess) -> None:
    topic = f"{NS}/schema-evolve"
    official.create_producer(topic, schema=JsonSchema(Reading))
    official.create_producer(topic, schema=JsonSchema(evolved(with_default=True)))
    with pytest.raises(pulsar.IncompatibleSchema):
        official.create_producer(topic, schema=JsonSchema(evolved(with_default=False)))
    with pytest.raises(pulsar.IncompatibleSchema):
        official.create_producer(topic, schema=StringSchema())
    versions = broker.admin("GET", "/admin/v2/schemas/public/default/schema-evolve/schemas")["getSchemaResponses"]
    assert [v["version"] for v in versions] == [0, 1]
    # a producer of bytes is still welcome (schema validation is not enforced by default)
    official.create_producer(topic).send(b"raw")


def test_a_consumer_that_cannot_read_the_topic_schema_is_refused(official: pulsar.Client) -> None:
    topic = f"{NS}/schema-consumer"
    official.create_producer(topic, schema=StringSchema())
    official.subscribe(topic, "strings", schema=StringSchema())
    with pytest.raises(pulsar.IncompatibleSchema):
        official.subscribe(topic, "json", schema=JsonSchema(Reading))


def test_get_schema_info_of_a_topic_without_schema_is_topic_not_found(official: pulsar.Client) -> None:
    official.create_producer(f"{NS}/schema-none").send(b"x")
    with pytest.raises(pulsar.TopicNotFound):
        official._client.get_schema_info(f"{NS}/schema-none", -1)
