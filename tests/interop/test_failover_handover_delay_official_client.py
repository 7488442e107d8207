"""The official client on a Failover subscription whose active consumer changes: `pyengine
serve --active-consumer-failover-delay-time-ms` (Pulsar's activeConsumerFailoverDelayTimeMillis)
holds the handover back, so the new active consumer gets only what the previous one still had
not acknowledged when the delay ended, without a redelivery count (found by an audit: it got
everything at once, also what the previous one was acknowledging)."""

from __future__ import annotations

import time

import pulsar
import pytest

from tests.broker.helpers import pulsar_failover_pick
from tests.interop.conftest import FAILOVER_DELAY_MS

NS = "persistent://public/default"


def test_the_new_active_consumer_gets_only_what_the_old_one_left_unacknowledged(official: pulsar.Client) -> None:
    topic = f"{NS}/failover-handover-delay"
    picked = pulsar_failover_pick(topic, ["a", "b"])   # the active one once both have joined
    other = "b" if picked == "a" else "a"
    old = official.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Failover, consumer_name=other,
                             initial_position=pulsar.InitialPosition.Earliest)
    producer = official.create_producer(topic, batching_enabled=False)
    for i in range(3):
        producer.send(b"m%d" % i)
    held = [old.receive(timeout_millis=5000) for _ in range(3)]
    assert [m.data() for m in held] == [b"m0", b"m1", b"m2"]
    old.acknowledge(held[0])
    switched = time.monotonic()
    new = official.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Failover, consumer_name=picked)
    old.acknowledge(held[1])                            # on its way while the handover waits
    message = new.receive(timeout_millis=5000)
    waited = time.monotonic() - switched
    assert FAILOVER_DELAY_MS / 1000 <= waited < 0.9                  # the flag's delay, not the default 1 s
    assert (message.data(), message.redelivery_count()) == (b"m2", 0)
    with pytest.raises(pulsar.Timeout):
        new.receive(timeout_millis=300)
