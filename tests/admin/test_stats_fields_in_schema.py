"""The topic stats the admin server serves keep to the response schema `/openapi.json` gives for
them: every field served (of the topic, its subscriptions, their consumers and draining hashes)
is described there, with its type. Served here with the fields of Key_Shared's draining hashes
(PIP-379) and allowOutOfOrderDelivery filled in, for a topic and a partitioned topic."""

from __future__ import annotations

from typing import Any

from pyengine.client import ConsumerKeySharedPolicy
from tests.broker.test_key_shared_draining_hashes import a_key
from tests.broker.test_key_shared_look_ahead import settle

_TYPES = {"integer": int, "boolean": bool, "string": str, "array": list, "object": dict}


def undescribed(value: Any, schema: dict, where: str = "") -> list[str]:
    """What in `value` its `schema` does not describe (a field it lacks, a value of another type)."""
    if value is None:
        return [] if schema.get("nullable") else [f"{where}: null"]
    expected = _TYPES.get(schema.get("type", ""))
    if expected is not None and (not isinstance(value, expected)
                                 or (expected is int and isinstance(value, bool))):
        return [f"{where}: {type(value).__name__}, not {schema['type']}"]
    found = []
    if isinstance(value, dict):
        properties, others = schema.get("properties"), schema.get("additionalProperties")
        for key, item in value.items():
            if properties is not None and key in properties:
                found += undescribed(item, properties[key], f"{where}.{key}")
            elif isinstance(others, dict):
                found += undescribed(item, others, f"{where}[{key}]")
            elif properties is not None:
                found.append(f"{where}.{key}: not in the schema")
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += undescribed(item, schema["items"], f"{where}[{index}]")
    return found


async def response_schema(api, path: str) -> dict:
    operation = (await api.get("/openapi.json")).body["paths"][path]["get"]
    return operation["responses"]["200"]["content"]["application/json"]["schema"]


async def hold_a_draining_hash(client, topic: str) -> None:
    """c0 holds an unacknowledged message of a key that moved to c1: its hash drains at c0, and a
    later message of it was kept from c1 (a blocked attempt)."""
    moved = a_key("c0", "c1", ["c0"], ["c0", "c1"])
    producer = await client.create_producer(topic)
    c0 = await client.subscribe(topic, "s", consumer_type="key_shared", initial_position="earliest",
                                consumer_name="c0")
    await producer.send(b"m0", key=moved)
    await c0.receive(timeout=5)
    await client.subscribe(topic, "s", consumer_type="key_shared", consumer_name="c1")
    await producer.send(b"m1", key=moved)


async def test_topic_stats_with_draining_hashes_keep_to_the_schema(api, client, service):
    topic = "persistent://public/default/stats-schema"
    await hold_a_draining_hash(client, topic)
    await settle(service.topics[topic].subscriptions["s"].dispatcher)
    served = (await api.get("/admin/v2/persistent/public/default/stats-schema/stats")).body
    subscription = served["subscriptions"]["s"]
    assert [c["consumerName"] for c in subscription["consumers"]] == ["c0", "c1"]
    assert subscription["drainingHashesCount"] == 1 and subscription["allowOutOfOrderDelivery"] is False
    assert subscription["consumers"][0]["drainingHashes"][0]["blockedAttempts"] >= 1
    schema = await response_schema(api, "/admin/v2/persistent/{tenant}/{namespace}/{topic}/stats")
    assert undescribed(served, schema) == []


async def test_partitioned_topic_stats_keep_to_the_schema(api, client, service):
    assert (await api.put("/admin/v2/persistent/public/default/stats-schema-p/partitions", 2)).status < 300
    topic = "persistent://public/default/stats-schema-p"
    await client.subscribe(f"{topic}-partition-0", "s", consumer_type="key_shared",
                           key_shared_policy=ConsumerKeySharedPolicy(allow_out_of_order_delivery=True))
    served = (await api.get("/admin/v2/persistent/public/default/stats-schema-p/partitioned-stats"
                            "?perPartition=true")).body
    assert served["subscriptions"]["s"]["allowOutOfOrderDelivery"] is True
    assert served["partitions"]
    schema = await response_schema(api, "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitioned-stats")
    assert undescribed(served, schema) == []


def test_the_check_finds_a_field_the_schema_lacks():
    schema = {"type": "object", "properties": {"a": {"type": "integer"},
                                               "b": {"type": "array", "items": {"type": "object",
                                                                                "properties": {}}}}}
    assert undescribed({"a": 1, "b": [{"c": 2}], "d": True}, schema) == [".b[0].c: not in the schema",
                                                                        ".d: not in the schema"]
    assert undescribed({"a": True}, schema) == [".a: bool, not integer"]
