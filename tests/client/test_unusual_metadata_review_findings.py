"""Messages whose metadata is legal but unusual, as other Pulsar clients (Go, C++, hand-made
frames) can produce them, read by the client. protobuf hands a proto2 string field whose bytes
are not UTF-8 over as bytes (pyengine.protocol.text): such a key, property or producer name
reaches the application as bytes."""

from __future__ import annotations

import asyncio
import time

from pyengine.client import ConsumerDeadLetterPolicy
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import headers_and_payload

TOPIC = "persistent://public/default/unusual-metadata"
BAD = b"\xff\xfe"


def _not_utf8(metadata: pb.MessageMetadata, marker: str) -> bytes:
    """`metadata` encoded, with each `marker` (a UTF-8 text) turned into bytes that are not UTF-8."""
    encoded = metadata.SerializeToString()
    assert len(marker.encode()) == len(BAD)
    return encoded.replace(marker.encode(), BAD)


async def _store(broker, topic: str, metadata: bytes, payload: bytes) -> None:
    stored = await broker.service.get_topic(topic)
    await stored.ledger.append(headers_and_payload(metadata, payload))


async def test_a_message_whose_key_and_properties_are_not_utf8_is_dead_lettered(broker, client):
    """The dead letter producer refused the copy of such a message (its key and properties
    came as bytes: "key must be a string"), so it was never dead-lettered: it came back to the
    application at every redelivery instead. It goes to the DLQ, its text decoded as the Java
    client reads it (each invalid sequence as U+FFFD)."""
    meta = message_metadata("p", 0, int(time.time() * 1000), partition_key="\u00e9",
                            properties=[pb.KeyValue(key="\u00e9", value="\u00e9")])
    await _store(broker, TOPIC, _not_utf8(meta, "\u00e9"), b"poison")
    consumer = await client.subscribe(TOPIC, "s", consumer_type="shared", initial_position="earliest",
                                      negative_ack_redelivery_delay_ms=0,
                                      dead_letter_policy=ConsumerDeadLetterPolicy(
                                          max_redeliver_count=1, initial_subscription_name="dlq"))
    for count in range(2):
        message = await consumer.receive(5)
        assert message.redelivery_count == count and message.partition_key == BAD
        assert message.properties == {BAD: BAD}
        await consumer.negative_acknowledge(message)        # the second one goes to the DLQ
    dead = await client.subscribe(f"{TOPIC}-s-DLQ", "dlq")
    letter = await dead.receive(5)
    assert letter.data == b"poison" and letter.partition_key == "\ufffd\ufffd"
    assert letter.properties["\ufffd\ufffd"] == "\ufffd\ufffd"


async def test_a_batch_of_no_message_is_acknowledged_and_its_permit_given_back(broker, client):
    """An entry announcing a batch of no message (num_messages_in_batch 0, empty payload)
    decoded to no message: the consumer neither acknowledged it nor gave back the permit the
    broker took for it (one, as for any entry). With a receiver queue of one, the message after
    it never came; and the entry stayed in the backlog for good."""
    now = int(time.time() * 1000)
    await _store(broker, TOPIC, message_metadata("p", 0, now, num_messages_in_batch=0).SerializeToString(), b"")
    await _store(broker, TOPIC, message_metadata("p", 1, now).SerializeToString(), b"after")
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest", receiver_queue_size=1)
    message = await consumer.receive(5)
    assert message.data == b"after"
    await consumer.acknowledge(message)
    subscription = (await broker.service.get_topic(TOPIC)).subscriptions["s"]
    for _ in range(100):
        if subscription.cursor.mark_delete.entry_id == message.message_id.entry_id:
            break
        await asyncio.sleep(0.02)
    assert subscription.cursor.mark_delete.entry_id == message.message_id.entry_id
