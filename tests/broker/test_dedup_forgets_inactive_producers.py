"""De-duplication forgets producers gone for longer than the inactivity timeout (found by an
audit): it kept every producer name it ever saw — generated names are never reused, so each
producer a client ever created stayed in memory and in LMDB for the topic's life. Pulsar
purges them after brokerDeduplicationProducerInactivityTimeoutMinutes (MessageDeduplication.
purgeInactiveProducers)."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.broker.service import BrokerConfig

T = "persistent://public/default/dedup-inactive"
MINUTE = 60_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


async def test_producers_gone_past_the_timeout_are_forgotten(tmp_path):
    clock = Clock()
    async with Broker.embedded(tmp_path / "data", sync=False, deduplication_enabled=True, clock=clock,
                               deduplication_producer_inactivity_timeout_minutes=10) as client:
        service = client.service
        kept = await client.create_producer(T)
        await kept.send(b"kept")
        for i in range(100):
            producer = await client.create_producer(T)
            await producer.send(b"m%d" % i)
            await producer.close()
        dedup = service.topics[T].dedup
        assert len(dedup._pushed) == 101
        await service.dedup_purge.check_now()           # seen gone from now on
        clock.now += 10 * MINUTE - 1
        await service.dedup_purge.check_now()
        assert len(dedup._pushed) == 101                 # not yet
        clock.now += 1
        await service.dedup_purge.check_now()
        assert list(dedup._pushed) == list(dedup._persisted) == [kept.producer_name]
        assert not dedup._inactive
        await service.env.barrier()
        assert list(dedup._stored_names()) == [kept.producer_name]
        await kept.send(b"still de-duplicated")
        assert dedup.last_sequence_id(kept.producer_name) == 1


@pytest.mark.parametrize("minutes", [0, -1, "6", True, float("nan")])
def test_the_inactivity_timeout_must_be_a_positive_number(tmp_path, minutes):
    with pytest.raises(ValueError, match="deduplication_producer_inactivity_timeout_minutes"):
        BrokerConfig(data_dir=tmp_path, deduplication_producer_inactivity_timeout_minutes=minutes)
