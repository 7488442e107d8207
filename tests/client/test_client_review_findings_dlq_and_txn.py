"""Review findings in the client: the dead letters of an AUTO_CONSUME consumer, and a transaction
of one client used with another client's producer or consumer."""

from __future__ import annotations

import json

import pytest

from pyengine.client import Client, ConsumerDeadLetterPolicy, SchemaData, SchemaType

TOPIC = "persistent://public/default/findings"
Rec = {"type": "record", "name": "Rec", "fields": [{"name": "a", "type": "int"}]}
Rec_b = {**Rec, "fields": [*Rec["fields"], {"name": "b", "type": ["null", "string"], "default": None}]}


def json_schema(definition: dict) -> SchemaData:
    return SchemaData(SchemaType.JSON, json.dumps(definition).encode(), name="Rec")


async def test_an_auto_consume_consumer_dead_letters_with_each_message_s_schema(client: Client) -> None:
    """The dead letter producer was created with the consumer's AUTO_CONSUME schema, which the
    broker refuses for a producer ("a client-side schema type"): every dead letter failed, and
    the poison message came back to the application forever, past max_redeliver_count, while the
    DLQ stayed empty. As the Java client (AUTO_PRODUCE_BYTES), each dead letter now goes with the
    schema it was written with (the topic's version 0 here, not its latest), bytes unchanged."""
    first = await client.create_producer(TOPIC, schema=json_schema(Rec))
    await client.create_producer(TOPIC, schema=json_schema(Rec_b))          # the topic's latest: 1
    plain = await client.create_producer(TOPIC)
    consumer = await client.subscribe(
        TOPIC, "s", consumer_type="shared", negative_ack_redelivery_delay_ms=0,
        schema=SchemaData(SchemaType.AUTO_CONSUME),
        dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=1, initial_subscription_name="dlq"))
    await first.send(b'{"a": 1}')
    await plain.send(b"raw")
    for count in range(2):                  # the second nack of each goes to the DLQ
        for _ in range(2):
            message = await consumer.receive(5)
            assert message.redelivery_count == count
            await consumer.negative_acknowledge(message)
    dead = await client.subscribe(f"{TOPIC}-s-DLQ", "dlq")
    got = {m.data: m.schema_version for m in [await dead.receive(5), await dead.receive(5)]}
    assert got.keys() == {b'{"a": 1}', b"raw"} and got[b"raw"] is None
    info = await client.get_schema_info(f"{TOPIC}-s-DLQ", got[b'{"a": 1}'])
    assert (info.schema.type, json.loads(info.schema.data)) == (SchemaType.JSON, Rec)
    with pytest.raises(TimeoutError):       # dead-lettered and acknowledged: never seen again
        await consumer.receive(0.5)
