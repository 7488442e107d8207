"""A batch the client cannot decode is acknowledged with its validation error and dropped; the
permits the broker counted for it (one per message of the batch, or with an ack set one per
message it leaves unacknowledged) must come back, or a small receiver queue stalls for good;
no more than those, or the receiver queue overflows its size."""

import asyncio

import pytest

from core_ext.batch import build_batch
from pyengine.client.consumer import _permits_of
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
    assert _permits_of(entry) == 1
    assert _permits_of(entry, [0b1010]) == 1


def _batch_entry(size: int) -> bytes:
    metadata = message_metadata("raw", 0, 1, num_messages_in_batch=size)
    return headers_and_payload(metadata.SerializeToString(), b"")


@pytest.mark.parametrize(("size", "ack_set", "permits"), [
    (4, [], 4),                     # no ack set: every message of the batch
    (4, [0b1111], 4),               # nothing acknowledged yet
    (4, [0b1010], 2),               # indexes 0 and 2 acknowledged: the broker charged 2
    (4, [0], 0),                    # (all acknowledged: the broker sends no such entry)
    (4, [-1], 4),                   # bits past the batch count for nothing
    (70, [-1, 0b11], 66),           # two words
    (70, [-1], 64),                 # a short ack set: its missing bits are acknowledged indexes
])
def test_a_partly_acknowledged_batch_gives_back_the_permits_it_took(size, ack_set, permits):
    # As the broker charges (Consumer.sendMessages): only the indexes the ack set leaves
    # unacknowledged took permits. Giving back all of them over-credits the receiver queue.
    assert _permits_of(_batch_entry(size), ack_set) == permits
