"""A seek to a message inside a batch acknowledges the batch's earlier indexes on the
subscription's cursor (Pulsar's resetCursor takes the ack set of the reset position, which the
Java client's seek sends): another consumer, or the same after a reconnect, does not get them
again. An ack set that acknowledges every message of the entry moves the seek past it; one for
an entry not stored is ignored."""

from __future__ import annotations

from pyengine.broker import Broker
from pyengine.client.message import MessageId, seek_ack_set, unacked_from
from pyengine_kernels import Position

from .helpers import drain, publish_batch

T = "persistent://public/default/seek-batch"


async def test_an_embedded_seek_into_a_batch_acknowledges_its_earlier_indexes(tmp_path):
    async with Broker.embedded(tmp_path / "data", sync=False) as broker:
        producer = await broker.create_producer(T)
        position = await publish_batch(broker, producer, [b"%d" % i for i in range(5)])
        await producer.send(b"after")
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        received = await drain(consumer)
        assert [m.data for m in received] == [b"0", b"1", b"2", b"3", b"4", b"after"]
        await consumer.seek(received[2].message_id)
        await consumer.close()
        again = await broker.subscribe(T, "s")
        assert [m.data for m in await drain(again)] == [b"2", b"3", b"4", b"after"]
        assert broker.service.topics[T].subscriptions["s"].cursor.batch_ack_set(position) == unacked_from(2, 5)


async def test_an_ack_set_of_the_whole_entry_or_of_no_entry(tmp_path):
    async with Broker.embedded(tmp_path / "data", sync=False) as broker:
        producer = await broker.create_producer(T)
        position = await publish_batch(broker, producer, [b"a", b"b", b"c"])
        await producer.send(b"next")
        subscription = await broker.service.topics[T].open_subscription("s", "earliest")
        await subscription.seek(position, ack_set=[0b1000])        # only index 3: not in a batch of 3
        assert subscription.cursor.mark_delete == position                # acknowledged whole
        await subscription.seek(Position(position.ledger_id, 99), ack_set=[0b1])     # no such entry
        assert subscription.cursor.batch_ack_set(Position(position.ledger_id, 99)) is None
        await subscription.seek(position, ack_set=[0b110])
        consumer = await broker.subscribe(T, "s")
        assert [m.data for m in await drain(consumer)] == [b"b", b"c", b"next"]


def test_the_ack_set_a_seek_sends():
    assert seek_ack_set(MessageId(1, 2, 3, batch_size=5)) == [0b11000]
    assert seek_ack_set(MessageId(1, 2, 0, batch_size=5)) is None          # the batch's first: nothing before
    assert seek_ack_set(MessageId(1, 2, 3)) is None                         # size not known
    assert seek_ack_set(MessageId(1, 2)) is None
    assert unacked_from(63, 65) == [-(1 << 63), 1]                          # Pulsar's signed words
