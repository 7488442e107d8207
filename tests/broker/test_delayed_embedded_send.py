"""The embedded producer's `send(..., deliver_after=, deliver_at=)`, as pulsar-client's and
`pyengine.client`'s: deliver_at_time in the metadata, bad values refused at the call, and the
delayed delivery policy's maxDeliveryDelayInMillis enforced by the topic (NotAllowedError).

Their brokers skip fsync (sync=False): due times of a few hundred milliseconds were outlasted
by the fsyncs of a set-up on a loaded CI machine, and durability is not what they check."""

import asyncio
import datetime
import time

import pytest

from pyengine.broker import Broker
from pyengine.broker.delayed import deliver_at_time
from pyengine.errors import NotAllowedError
from pyengine_kernels import Position
from tests.broker.helpers import drain

T = "persistent://public/default/delayed-embedded"


def now_ms() -> int:
    return int(time.time() * 1000)


def stored(broker, message_id) -> int | None:
    topic = broker.service.topics[T]
    return deliver_at_time(topic.ledger.read_entry(Position(message_id.ledger_id, message_id.entry_id)).data)


async def test_deliver_after_holds_the_message_on_a_shared_subscription(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        sent = time.monotonic()
        # 4 s: the sends and the drain before its time have room on a loaded machine (800 ms did not)
        later = await producer.send(b"later", deliver_after=datetime.timedelta(milliseconds=4000))
        at = await producer.send(b"at", deliver_at=now_ms() + 60_000)
        await producer.send(b"now")
        assert stored(broker, later) is not None and stored(broker, at) is not None
        assert [m.data for m in await drain(consumer, 0.3)] == [b"now"]
        message = await consumer.receive(timeout=15)
        assert message.data == b"later" and time.monotonic() - sent >= 3.95


async def test_bad_values_are_refused_at_the_call(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        with pytest.raises(TypeError):
            await producer.send(b"x", deliver_after=5)
        with pytest.raises(TypeError):
            await producer.send(b"x", deliver_at=1.5)
        with pytest.raises(ValueError):
            await producer.send(b"x", deliver_after=-datetime.timedelta(seconds=1))
        with pytest.raises(ValueError):
            await producer.send(b"x", deliver_after=datetime.timedelta(seconds=1), deliver_at=now_ms())
        assert broker.service.topics[T].ledger.number_of_entries == 0


async def test_max_delivery_delay_is_enforced(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await broker.service.policies.set_topic_policy(
            T, "delayedDeliveryPolicies", {"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 1000})
        with pytest.raises(NotAllowedError, match="Exceeds max allowed delivery delay of 1000 milliseconds"):
            await producer.send(b"x", deliver_after=datetime.timedelta(seconds=2))
        assert (await producer.send(b"y", deliver_after=datetime.timedelta(milliseconds=500))).entry_id == 0
        txn = await broker.new_transaction()
        with pytest.raises(NotAllowedError):
            await producer.send(b"z", txn=txn, deliver_at=now_ms() + 5000)
        await txn.abort()


async def test_the_broker_config_switches_delayed_delivery_off(tmp_path):
    # BrokerConfig(delayed_delivery_enabled=False), `pyengine serve --no-delayed-delivery`:
    # the broker's default policy, so a delayed message is delivered at once.
    async with Broker.embedded(tmp_path, delayed_delivery_enabled=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await producer.send(b"later", deliver_after=datetime.timedelta(seconds=30))
        assert [m.data for m in await drain(consumer, 0.5)] == [b"later"]


async def test_the_broker_config_limits_the_delay(tmp_path):
    async with Broker.embedded(tmp_path, delayed_delivery_max_delay_ms=1000) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"soon", deliver_after=datetime.timedelta(milliseconds=500))
        with pytest.raises(NotAllowedError):
            await producer.send(b"too late", deliver_after=datetime.timedelta(seconds=30))


async def test_the_broker_config_sets_whether_the_tracker_is_strict(tmp_path):
    for strict in (True, False):
        async with Broker.embedded(tmp_path / str(strict), delayed_delivery_deliver_at_time_strict=strict) as broker:
            producer = await broker.create_producer(T)
            await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
            await producer.send(b"later", deliver_after=datetime.timedelta(seconds=30))
            await asyncio.sleep(0.2)
            tracker = broker.service.topics[T].subscriptions["s"].dispatcher.delayed
            assert tracker is not None and tracker.strict is strict
