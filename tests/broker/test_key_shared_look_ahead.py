"""Key_Shared look-ahead caps: the entries held back for redelivery (mostly those read past a
blocked consumer for its keys) stop the reading of new entries once they reach the cap, as
Pulsar's keySharedLookAheadMsgInReplayThresholdPerConsumer (times the consumers, at most
...PerSubscription); the other consumers get nothing new meanwhile, and reading goes on once
the held entries drain. Held entries are counted, never timed."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from pyengine.broker import Broker
from pyengine.broker.dispatcher import Dispatcher
from pyengine.broker.service import BrokerConfig
from pyengine.cli import serve

T = "persistent://public/default/key-shared-look-ahead"
PER_CONSUMER = "key_shared_look_ahead_msg_in_replay_threshold_per_consumer"
PER_SUBSCRIPTION = "key_shared_look_ahead_msg_in_replay_threshold_per_subscription"


def dispatcher(broker) -> Dispatcher:
    return broker.service.topics[T].subscriptions["s"].dispatcher


def track_largest_held(d: Dispatcher) -> list[int]:
    """A one-item list that keeps the most entries `d` holds back from now on."""
    largest = [len(d.redeliveries)]
    hold = d.redeliveries.hold

    def counting_hold(position, hash_value: int) -> None:
        hold(position, hash_value)
        largest[0] = max(largest[0], len(d.redeliveries))
    d.redeliveries.hold = counting_hold                     # type: ignore[method-assign]
    return largest


async def settle(d: Dispatcher) -> None:
    """Let the dispatch passes already asked for run (no wall time involved)."""
    for _ in range(1000):
        await asyncio.sleep(0)
        if not d._scheduled:
            return
    raise AssertionError("the dispatcher never settled")


async def receive_in_order(consumer, name: str, numbers: range) -> None:
    for i in numbers:
        message = await consumer.receive(timeout=5)
        assert message.data == b"%s%d" % (name.encode(), i)
        await consumer.acknowledge(message)


async def a_blocked_with_b_behind(broker, n: int):
    """a (receiver queue 2: blocked once it holds 2 unreceived) owns the key of the first `n`
    messages, b the key of the next `n`. Returns a, b, the most entries ever held back."""
    a = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest",
                               consumer_name="a", receiver_queue_size=2)
    b = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="b")
    d = dispatcher(broker)
    keys: dict[str, str] = {}
    for i in range(100):
        keys.setdefault(d._owner(d.key_hash(b"k%d" % i)).name, "k%d" % i)
    largest = track_largest_held(d)
    producer = await broker.create_producer(T)
    for name in "ab":
        for i in range(n):
            await producer.send(b"%s%d" % (name.encode(), i), key=keys[name])
    await settle(d)
    return a, b, largest


def delivered_to(d: Dispatcher, name: str) -> int:
    return len(next(c for c in d.consumers if c.name == name).pending)


async def test_reading_stops_at_the_cap_and_goes_on_once_the_held_entries_drain(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, **{PER_CONSUMER: 4}) as broker:   # 2 consumers: 8
        a, b, largest = await a_blocked_with_b_behind(broker, 30)
        d = dispatcher(broker)
        assert delivered_to(d, "a") == 2                    # a0, a1
        assert len(d.redeliveries) == 8 and largest[0] == 8  # a2..a9 held; a10.. not read
        assert delivered_to(d, "b") == 0                    # b's messages are past the cap: nothing yet
        await receive_in_order(a, "a", range(30))           # a drains its held entries, reading goes on
        await receive_in_order(b, "b", range(30))
        assert largest[0] == 8 and len(d.redeliveries) == 0


async def test_the_subscription_threshold_caps_the_per_consumer_ones(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, **{PER_CONSUMER: 100, PER_SUBSCRIPTION: 5}) as broker:
        a, b, largest = await a_blocked_with_b_behind(broker, 20)
        d = dispatcher(broker)
        assert len(d.redeliveries) == 5 and delivered_to(d, "b") == 0
        await receive_in_order(a, "a", range(20))
        await receive_in_order(b, "b", range(20))
        assert largest[0] == 5


async def test_zero_per_consumer_leaves_the_subscription_threshold(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, **{PER_CONSUMER: 0, PER_SUBSCRIPTION: 3}) as broker:
        a, b, largest = await a_blocked_with_b_behind(broker, 20)
        assert len(dispatcher(broker).redeliveries) == 3 and delivered_to(dispatcher(broker), "b") == 0
        await receive_in_order(a, "a", range(20))
        await receive_in_order(b, "b", range(20))
        assert largest[0] == 3


async def test_both_zero_and_no_unacked_limits_is_no_cap(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=0,
                               max_unacked_messages_per_subscription=0,
                               **{PER_CONSUMER: 0, PER_SUBSCRIPTION: 0}) as broker:
        a, b, largest = await a_blocked_with_b_behind(broker, 30)
        d = dispatcher(broker)
        assert len(d.redeliveries) == 28 and delivered_to(d, "b") > 0   # all of a's read past, b served
        await receive_in_order(b, "b", range(30))
        await receive_in_order(a, "a", range(30))


@pytest.mark.parametrize(("per_consumer", "per_subscription", "unacked", "consumers", "cap"), [
    (2000, 20_000, (50_000, 200_000), 3, 6000),            # Pulsar's defaults: per consumer x consumers
    (2000, 20_000, (50_000, 200_000), 11, 20_000),         # at most the subscription's
    (2000, 0, (50_000, 200_000), 11, 22_000),              # 0: no subscription threshold
    (0, 700, (50_000, 200_000), 11, 700),                  # 0: the subscription threshold alone
    (0, 0, (50_000, 200_000), 3, 150_000),                 # both 0: the unacked-messages limits
    (0, 0, (50_000, 200_000), 5, 200_000),
    (0, 0, (0, 200_000), 5, 200_000),
    (0, 0, (0, 0), 5, None),                               # ... and no limits: no cap
])
def test_the_cap_is_pulsars_effective_look_ahead_limit(per_consumer, per_subscription, unacked, consumers, cap):
    config = SimpleNamespace(**{PER_CONSUMER: per_consumer, PER_SUBSCRIPTION: per_subscription},
                             max_unacked_messages_per_consumer=unacked[0],
                             max_unacked_messages_per_subscription=unacked[1])
    subscription = SimpleNamespace(sub_type="key_shared", topic=SimpleNamespace(service=SimpleNamespace(config=config)))
    d = SimpleNamespace(subscription=subscription, consumers=[object()] * consumers)
    assert Dispatcher._look_ahead_limit(d) == cap           # type: ignore[arg-type]
    subscription.sub_type = "shared"
    assert Dispatcher._look_ahead_limit(d) is None          # type: ignore[arg-type]


def serve_config(tmp_path: Path, *argv: str) -> BrokerConfig:
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers(dest="command"))
    return serve.broker_config(parser.parse_args(["serve", "--data-dir", str(tmp_path), *argv]))


def test_defaults_and_flags(tmp_path):
    for config in (BrokerConfig(data_dir=tmp_path), serve_config(tmp_path)):
        assert (getattr(config, PER_CONSUMER), getattr(config, PER_SUBSCRIPTION)) == (2000, 20_000)
    config = serve_config(tmp_path, "--key-shared-look-ahead-msg-in-replay-threshold-per-consumer", "0",
                          "--key-shared-look-ahead-msg-in-replay-threshold-per-subscription", "500")
    assert (getattr(config, PER_CONSUMER), getattr(config, PER_SUBSCRIPTION)) == (0, 500)


@pytest.mark.parametrize("flag", ["--key-shared-look-ahead-msg-in-replay-threshold-per-consumer",
                                  "--key-shared-look-ahead-msg-in-replay-threshold-per-subscription"])
@pytest.mark.parametrize("value", ["-1", "x", "2.5", str(2**31)])
def test_bad_flags_are_refused(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit):
        serve_config(tmp_path, flag, value)
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("name", [PER_CONSUMER, PER_SUBSCRIPTION])
@pytest.mark.parametrize(("value", "error"), [(-1, ValueError), ("10", TypeError), (True, TypeError), (2.0, TypeError)])
def test_bad_config_values_are_refused(tmp_path, name, value, error):
    with pytest.raises(error, match=name):
        BrokerConfig(data_dir=tmp_path, **{name: value})
