"""Messages whose metadata is legal but unusual, as other Pulsar clients (Go, C++, hand-made
frames) can produce them, read through the embedded API."""

from __future__ import annotations

import time

from pyengine.broker import Broker
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import headers_and_payload

T = "persistent://public/default/unusual-metadata"


async def test_a_batch_of_no_message_is_acknowledged_and_its_permit_given_back(tmp_path):
    """An entry announcing a batch of no message (num_messages_in_batch 0, empty payload)
    decoded to no message: the embedded consumer neither acknowledged it nor gave back the
    permit it took, so with a receiver queue of one the message after it never came."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic = await broker.service.get_topic(T)
        now = int(time.time() * 1000)
        await topic.ledger.append(headers_and_payload(
            message_metadata("p", 0, now, num_messages_in_batch=0).SerializeToString(), b""))
        await topic.ledger.append(headers_and_payload(message_metadata("p", 1, now).SerializeToString(), b"after"))
        consumer = await broker.subscribe(T, "s", initial_position="earliest", receiver_queue_size=1)
        message = await consumer.receive(timeout=5)
        assert message.data == b"after"
