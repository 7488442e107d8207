"""An embedded consumer that does not queue an entry gives back exactly the permits the
dispatcher took for it: a permit per message, and for a batch partly acknowledged (delivered
with an ack set) one per index left unacknowledged, as Pulsar's Consumer.sendMessages charges.
Before, it gave back one per message of the batch, acknowledged or not: the receiver queue was
over-credited (as the network client was, see tests/client/test_undecodable_batch_permits.py)."""

from __future__ import annotations

import asyncio

import pytest

from core_ext.batch import build_batch
from pyengine.broker import Broker
from pyengine.broker.consumer import permits_taken, unacked_messages
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import headers_and_payload
from pyengine.transaction.pendingack import IndividualAck

T = "persistent://public/default/permits-given-back"
QUEUE = 10


def _batch(size: int, *, decodable: bool) -> bytes:
    singles = [(pb.SingleMessageMetadata(payload_size=1, sequence_id=i).SerializeToString(), b"x")
               for i in range(size)]
    fields = {} if decodable else {"compression": pb.LZ4, "uncompressed_size": 100}   # no LZ4 block
    metadata = message_metadata("raw", 0, 1, num_messages_in_batch=size, **fields)
    return headers_and_payload(metadata.SerializeToString(), build_batch(singles))


async def _partly_acked_batch(broker, *, decodable: bool):
    """A batch of 4 on T, indexes 0 and 2 acknowledged on subscription "s" (no consumer yet):
    the next delivery of it carries the ack set 0b1010 and takes 2 permits."""
    topic = await broker.service.get_topic(T)
    subscription = await topic.open_subscription("s", "earliest")
    producer = topic.add_producer("raw")
    position = await topic.publish(producer, _batch(4, decodable=decodable), sequence_id=0,
                                   highest_sequence_id=3, num_messages=4)
    topic.remove_producer(producer)
    await subscription.ack_individual(None, [IndividualAck(position, batch_size=4, ack_set=(0b1010,))])
    return topic, subscription


async def test_an_undecodable_partly_acked_batch_gives_back_the_permits_it_took(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic, subscription = await _partly_acked_batch(broker, decodable=False)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", receiver_queue_size=QUEUE)
        producer = await broker.create_producer(T)
        await producer.send(b"good")
        assert (await consumer.receive(timeout=5)).data == b"good"     # the bad batch went first
        assert subscription.backlog() == 1                              # acknowledged whole
        # Taken: 2 for the batch, 1 for "good"; given back: the batch's 2. Before: its 4.
        assert consumer._consumer.permits == QUEUE - 1


async def test_a_stale_partly_acked_batch_gives_back_the_permits_it_took(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic, subscription = await _partly_acked_batch(broker, decodable=True)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", receiver_queue_size=QUEUE)
        messages = [await consumer.receive(timeout=5) for _ in range(2)]
        assert [m.message_id.batch_index for m in messages] == [1, 3]
        assert consumer._consumer.permits == QUEUE - 2
        # A redeliver-all asked for and not yet applied at the subscription (on a v5 one it
        # waits for decisions): what the subscription sends meanwhile is stale, dropped.
        consumer._epoch += 1
        subscription.redeliver_unacknowledged(consumer._consumer)
        assert not consumer._consumer.pending
        for _ in range(100):                    # until the batch went out again
            if consumer._consumer.pending:
                break
            await asyncio.sleep(0.01)
        assert consumer._consumer.pending       # sent again (and dropped by the consumer)
        assert consumer._consumer.permits == QUEUE - 2                  # given back as taken
        assert not consumer._queue


@pytest.mark.parametrize(("num_messages", "ack_set", "unacked", "permits"), [
    (4, None, 4, 4),
    (4, [0b1111], 4, 4),
    (4, [0b1010], 2, 2),
    (4, [0], 0, 0),
    (1, None, 1, 1),
    (0, None, 1, 0),            # an entry counting no message takes no permit
    (70, [0, 0b100000], 1, 1),  # the ack set's second word: index 69 left
])
def test_permits_taken(num_messages, ack_set, unacked, permits):
    assert unacked_messages(num_messages, ack_set) == unacked
    assert permits_taken(num_messages, ack_set) == permits
