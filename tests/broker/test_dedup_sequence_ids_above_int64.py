"""Sequence ids are uint64 on the wire: de-duplication stores any of them. Before, one of
2^63 or more could not be packed (a signed 64-bit record): the send, already submitted, was
answered with an error and the producer's accepted sequence id was left ahead of what was
stored."""

from __future__ import annotations

from pyengine.broker import Broker

T = "persistent://public/default/dedup-above-int64"
BIG = (1 << 63) + 5


async def test_a_sequence_id_above_int64_is_stored_once_and_remembered(tmp_path):
    async with Broker.embedded(tmp_path, deduplication_enabled=True, sync=False) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        topic = broker.service.topics[T]
        assert await topic.publish(producer._producer, b"m", sequence_id=BIG) is not None
        assert await topic.publish(producer._producer, b"m", sequence_id=BIG) is None     # a duplicate
        assert len(topic.ledger.read_entries(topic.ledger.first_position(), 10)) == 1
    async with Broker.embedded(tmp_path, deduplication_enabled=True, sync=False) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        assert producer.last_sequence_id == BIG    # from the stored record, after a restart
