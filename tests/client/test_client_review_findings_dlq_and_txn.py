"""Review findings in the client: the dead letters of an AUTO_CONSUME consumer, and a transaction
of one client used with another client's producer or consumer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pyengine.client import Client, ConsumerDeadLetterPolicy, SchemaData, SchemaType
from tests.client.conftest import NetworkBroker

TOPIC = "persistent://public/default/findings"
Rec = {"type": "record", "name": "Rec", "fields": [{"name": "a", "type": "int"}]}
Rec_b = {**Rec, "fields": [*Rec["fields"], {"name": "b", "type": ["null", "string"], "default": None}]}


OTHER = "persistent://public/default/findings-other"


@pytest.fixture
async def two_clients(tmp_path: Path) -> AsyncIterator[tuple[Client, Client]]:
    """Two clients of two brokers, each numbering its transactions from (0,0)."""
    async with NetworkBroker(tmp_path / "a", num_coordinators=1) as a, \
            NetworkBroker(tmp_path / "b", num_coordinators=1) as b:
        async with Client(a.url) as client_a, Client(b.url) as client_b:
            yield client_a, client_b


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


async def test_a_producer_refuses_a_transaction_of_another_client(two_clients) -> None:
    """Producer B took client A's transaction: A registered the topic with its broker's
    coordinator, while the message went to broker B with the txn id alone, (0,0) as B's own
    unrelated open transaction: A's commit succeeded, the message stayed invisible, then was
    dropped with B's abort. As the embedded API, send and send_async now refuse it (ValueError),
    before anything is sent: A's transaction commits with nothing, B's topic gets nothing."""
    client_a, client_b = two_clients
    producer = await client_b.create_producer(TOPIC)
    consumer = await client_b.subscribe(TOPIC, "s", initial_position="earliest")
    txn_b = await client_b.new_transaction()
    txn_a = await client_a.new_transaction()
    assert txn_a.txn_id == txn_b.txn_id                 # (0,0) both: why it must be refused
    with pytest.raises(ValueError, match="of another client"):
        await producer.send(b"cross", txn=txn_a)
    with pytest.raises(ValueError, match="of another client"):
        producer.send_async(b"cross", txn=txn_a)
    await txn_a.commit()
    await txn_b.abort()
    await producer.send(b"plain")
    assert (await consumer.receive(5)).data == b"plain"
    with pytest.raises(TimeoutError):
        await consumer.receive(0.3)


@pytest.mark.parametrize("topics", [TOPIC, [TOPIC, OTHER]], ids=["one topic", "multi-topic"])
async def test_a_consumer_refuses_a_transaction_of_another_client(two_clients, topics) -> None:
    """Consumer B acknowledged with client A's transaction, the ack filed on broker B under
    B's own transaction of the same id. Individual and cumulative acks now refuse it
    (ValueError), acknowledging nothing and leaving A's transaction as it was — a closed
    consumer's refusal included, which fails a transaction of its own client's commit."""
    client_a, client_b = two_clients
    producer = await client_b.create_producer(TOPIC)
    consumer = await client_b.subscribe(topics, "s", initial_position="earliest")
    await client_b.new_transaction()                    # B's (0,0), open
    txn_a = await client_a.new_transaction()
    await producer.send(b"m")
    message = await consumer.receive(5)
    with pytest.raises(ValueError, match="of another client"):
        await consumer.acknowledge(message, txn_a)
    with pytest.raises(ValueError, match="of another client"):
        await consumer.acknowledge_cumulative(message, txn_a)
    await consumer.redeliver_unacknowledged_messages()
    assert (await consumer.receive(5)).data == b"m"     # not acknowledged
    await consumer.close()
    with pytest.raises(ValueError, match="of another client"):
        await consumer.acknowledge(message, txn_a)
    await txn_a.commit()                                # nothing of it failed here
