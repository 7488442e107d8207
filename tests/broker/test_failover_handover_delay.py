"""Failover: when another consumer becomes the active one, the broker waits
active_consumer_failover_delay_time_ms before handing over, as Pulsar's
PersistentDispatcherSingleActiveConsumer.scheduleReadOnActiveConsumer waits
activeConsumerFailoverDelayTimeMillis (default 1000 ms) before it rewinds the cursor, tells the
consumers which one is active and reads for the new one. Meanwhile nothing is delivered, and
what the previous consumer acknowledges is not delivered again. Found by an audit: the new
active consumer was given the previous one's unacknowledged messages at once, so messages
whose acknowledgements were on their way came twice.

The first consumer of a subscription, with nothing to hand over, starts at once (Pulsar makes
it wait the delay too)."""

from __future__ import annotations

import asyncio
import time

import pytest

from pyengine.broker import Broker
from pyengine.broker.service import BrokerConfig

from .helpers import drain
from .test_key_shared_look_ahead import serve_config

T = "persistent://public/default/failover-handover-delay"
DELAY_MS = 300


async def test_the_new_active_consumer_waits_and_misses_what_the_old_one_acknowledged_meanwhile(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, active_consumer_failover_delay_time_ms=DELAY_MS) as broker:
        producer = await broker.create_producer(T)
        old = await broker.subscribe(T, "s", consumer_type="failover", consumer_name="old", priority=1,
                                     initial_position="earliest")
        for i in range(3):
            await producer.send(b"m%d" % i)
        held = await drain(old)
        assert [m.data for m in held] == [b"m0", b"m1", b"m2"]
        await old.acknowledge(held[0])
        switched = time.monotonic()
        new = await broker.subscribe(T, "s", consumer_type="failover", consumer_name="new", priority=0)
        assert old.active and not new.active             # told only when the handover comes
        await producer.send(b"m3")
        assert await drain(new, timeout=0.1) == [] and await drain(old, timeout=0.01) == []
        await old.acknowledge(held[1])                   # still on its way when the switch came
        first = await new.receive(timeout=5)
        assert time.monotonic() - switched >= DELAY_MS / 1000
        rest = await drain(new)
        assert [(m.data, m.redelivery_count) for m in [first, *rest]] == [(b"m2", 0), (b"m3", 0)]
        assert new.active and not old.active
        assert await drain(old) == []


async def test_a_standby_takes_over_after_the_delay_when_the_active_consumer_leaves(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, active_consumer_failover_delay_time_ms=DELAY_MS) as broker:
        producer = await broker.create_producer(T)
        active = await broker.subscribe(T, "s", consumer_type="failover", consumer_name="a",
                                        initial_position="earliest")
        standby = await broker.subscribe(T, "s", consumer_type="failover", consumer_name="b", priority=1)
        await producer.send(b"m0")
        assert [m.data for m in await drain(active)] == [b"m0"]
        left = time.monotonic()
        await active.close()
        message = await standby.receive(timeout=5)
        assert time.monotonic() - left >= DELAY_MS / 1000
        assert (message.data, message.redelivery_count) == (b"m0", 0) and standby.active


async def test_a_switch_while_a_handover_waits_does_not_restart_the_wait(tmp_path):
    delay_ms = 600
    async with Broker.embedded(tmp_path, sync=False, active_consumer_failover_delay_time_ms=delay_ms) as broker:
        producer = await broker.create_producer(T)
        first = await broker.subscribe(T, "s", consumer_type="failover", consumer_name="a", priority=2,
                                       initial_position="earliest")
        await producer.send(b"m0")
        assert [m.data for m in await drain(first)] == [b"m0"]
        switched = time.monotonic()
        passed_over = await broker.subscribe(T, "s", consumer_type="failover", consumer_name="b", priority=1)
        await asyncio.sleep(delay_ms / 2000)
        last = await broker.subscribe(T, "s", consumer_type="failover", consumer_name="c", priority=0)
        message = await last.receive(timeout=5)
        waited = time.monotonic() - switched
        assert delay_ms / 1000 <= waited < 1.4 * delay_ms / 1000      # restarted, it would be 1.5 delays
        assert message.data == b"m0" and last.active and not passed_over.active and not first.active
        assert await drain(passed_over, timeout=0.05) == []


async def test_the_first_consumer_of_a_subscription_starts_at_once(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:          # the default delay, 1000 ms
        producer = await broker.create_producer(T)
        await producer.send(b"m0")
        consumer = await broker.subscribe(T, "s", consumer_type="failover", initial_position="earliest")
        assert consumer.active
        assert (await consumer.receive(timeout=0.5)).data == b"m0"


@pytest.mark.parametrize("value", ["-1", "x", "2.5"])
def test_bad_flag_values_are_refused(tmp_path, capsys, value):
    with pytest.raises(SystemExit):
        serve_config(tmp_path, "--active-consumer-failover-delay-time-ms", value)
    assert "--active-consumer-failover-delay-time-ms" in capsys.readouterr().err


@pytest.mark.parametrize(("value", "error"), [(-1, ValueError), ("10", TypeError), (True, TypeError), (2.0, TypeError)])
def test_bad_config_values_are_refused(tmp_path, value, error):
    with pytest.raises(error, match="active_consumer_failover_delay_time_ms"):
        BrokerConfig(data_dir=tmp_path, active_consumer_failover_delay_time_ms=value)
