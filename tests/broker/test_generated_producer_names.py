"""A producer that gives no name gets one the broker never handed out before, across restarts
too (found by an audit): the per-topic counter started again at 0 whenever the topic was
loaded, so after a restart a new producer took an old one's name, and with de-duplication on
inherited its last sequence id: its messages were dropped as duplicates while the sends
answered OK. Pulsar's generateUniqueProducerName takes a new instance id at every start."""

from __future__ import annotations

from pyengine.broker import Broker

from .helpers import drain

T = "persistent://public/default/generated-names"


async def _send_as_unnamed(data_dir, payloads: list[bytes]) -> str:
    async with Broker.embedded(data_dir, sync=False, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(T, initial_sequence_id=-1)
        for sequence_id, payload in enumerate(payloads):
            await producer.send(payload, sequence_id=sequence_id)
        other = await broker.create_producer(T + "-other")
        assert other.producer_name != producer.producer_name
        return producer.producer_name


async def test_an_unnamed_producer_after_a_restart_is_not_taken_for_an_earlier_one(tmp_path):
    first = await _send_as_unnamed(tmp_path / "data", [b"run1-%d" % i for i in range(5)])
    second = await _send_as_unnamed(tmp_path / "data", [b"run2-%d" % i for i in range(5)])
    assert first != second and first.startswith("standalone-0-")
    async with Broker.embedded(tmp_path / "data", sync=False) as broker:
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        assert [m.data for m in await drain(consumer)] == [b"run%d-%d" % (r, i) for r in (1, 2) for i in range(5)]
