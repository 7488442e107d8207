"""A batch the client cannot decode is acknowledged with its validation error and dropped; the
permits the broker counted for it (one per message of the batch) must come back, or a small
receiver queue stalls for good."""

import asyncio

import pytest

from core_ext.batch import build_batch
from pyengine.client.consumer import _messages_in
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import headers_and_payload

TOPIC = "persistent://public/default/undecodable-batch"


async def _store_undecodable_batch(broker, size: int) -> None:
    """A batch entry of `size` messages said to be LZ4-compressed, whose payload is no LZ4 block."""
    topic = await broker.service.get_topic(TOPIC)
    producer = topic.add_producer("raw")
    singles = [(pb.SingleMessageMetadata(payload_size=1, sequence_id=i).SerializeToString(), b"x")
               for i in range(size)]
    metadata = message_metadata("raw", 0, 1, num_messages_in_batch=size, compression=pb.LZ4,
                                uncompressed_size=100)
    await topic.publish(producer, headers_and_payload(metadata.SerializeToString(), build_batch(singles)),
                        sequence_id=0, highest_sequence_id=size - 1, num_messages=size)
    topic.remove_producer(producer)


async def test_an_undecodable_batch_gives_back_a_permit_per_message(broker, client):
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest", receiver_queue_size=4)
    await _store_undecodable_batch(broker, 4)
    producer = await client.create_producer(TOPIC)
    for i in range(3):
        await producer.send(b"good-%d" % i)
    received = [await consumer.receive(timeout=5) for _ in range(3)]
    assert [m.data for m in received] == [b"good-0", b"good-1", b"good-2"]
    subscription = broker.service.topics[TOPIC].subscriptions["s"]
    await asyncio.sleep(0)
    assert subscription.backlog() == 3                   # the bad batch was acknowledged


@pytest.mark.parametrize("entry", [None, b"", b"\x00", b"\x0e\x01", b"\x00\x00\x00\x05abc", b"\x00\x00\x00\x02\xff\xff"])
def test_an_entry_whose_headers_cannot_be_read_counts_as_one_message(entry):
    assert _messages_in(entry) == 1
