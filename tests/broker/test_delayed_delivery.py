"""Delayed message delivery (MessageMetadata.deliver_at_time), as Pulsar's
PersistentDispatcherMultipleConsumers with its InMemoryDelayedDeliveryTracker: held back on
Shared and Key_Shared subscriptions until its time, delivered at once on Exclusive and
Failover ones and to readers; backlog until acknowledged; tracked again after a restart.

Their brokers skip fsync (sync=False): due times of a few hundred milliseconds were outlasted
by the fsyncs of a set-up on a loaded CI machine, and durability is not what they check."""

import asyncio
import time

import pytest

from pyengine.broker import Broker
from pyengine.broker.delayed import MAX_DELIVER_AT_MS, DelayedDeliveryTracker, deliver_at_time
from pyengine.broker.policies import DelayedDelivery
from pyengine.client import MessageId
from pyengine.protocol.commands import message_metadata
from pyengine.protocol.pulsar_api_pb2 import SingleMessageMetadata
from pyengine.storage.entry import headers_and_payload
from pyengine_kernels import Position
from tests.broker.helpers import drain
from tests.clocks import PausedWallClock

T = "persistent://public/default/delayed"
# When the held messages of the tests below are due: seconds, so that what must happen before
# (other sends, a drain, a commit, a broker restart) has room on a loaded machine (1 s or less
# did not: a stall of a few tenths of a second let the held message out early).
DUE_MS = 4000


def now_ms() -> int:
    return int(time.time() * 1000)


async def send(broker, producer, data: bytes, *, deliver_at: int | None = None, key: str | None = None,
               txn=None, batch: list[bytes] | None = None):
    """One message (or a batch entry of `batch`) with `deliver_at_time`, as the official
    clients send it (the embedded producer has no delayed send)."""
    topic = broker.service.topics[producer.topic]
    sequence = producer._next_sequence
    fields = {}
    if deliver_at is not None:
        fields["deliver_at_time"] = deliver_at
    if key is not None:
        fields["partition_key"] = key
    payload = data
    count = 1
    if batch is not None:
        from core_ext.batch import build_batch
        singles = [(SingleMessageMetadata(payload_size=len(p), sequence_id=sequence + i).SerializeToString(), p)
                   for i, p in enumerate(batch)]
        payload, count = build_batch(singles), len(batch)
        fields["num_messages_in_batch"] = count
    producer._next_sequence += count
    if txn is not None:
        fields.update(txnid_most_bits=txn.txn_id.most_bits, txnid_least_bits=txn.txn_id.least_bits)
        await txn._register_partition(producer.topic)
    metadata = message_metadata(producer.producer_name, sequence, now_ms(), **fields).SerializeToString()
    position = await topic.publish(producer._producer, headers_and_payload(metadata, payload), sequence_id=sequence,
                                   num_messages=count, txn=txn.txn_id if txn is not None else None)
    return MessageId(position.ledger_id, position.entry_id) if position is not None else None


def subscription(broker, name="s", topic=T):
    return broker.service.topics[topic].subscriptions[name]


async def test_shared_holds_a_delayed_message_until_its_time_while_others_flow(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        sent = time.monotonic()
        await send(broker, producer, b"later", deliver_at=now_ms() + DUE_MS)
        for i in range(3):
            await producer.send(f"now{i}".encode())
        first = await drain(consumer, 0.3)
        assert [m.data for m in first] == [b"now0", b"now1", b"now2"]
        sub = subscription(broker)
        assert sub.stats()["msgDelayed"] == 1
        for message in first:
            await consumer.acknowledge(message)
        assert sub.backlog() == 1                    # held back, still backlog
        late = await consumer.receive(timeout=DUE_MS / 1000 + 10)
        assert late.data == b"later" and late.redelivery_count == 0
        assert time.monotonic() - sent >= DUE_MS / 1000 - 0.05
        assert sub.stats()["msgDelayed"] == 0
        await consumer.acknowledge(late)
        assert sub.backlog() == 0


@pytest.mark.parametrize("consumer_type", ["exclusive", "failover"])
async def test_exclusive_and_failover_deliver_at_once(tmp_path, consumer_type):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type=consumer_type, initial_position="earliest")
        await send(broker, producer, b"delayed", deliver_at=now_ms() + 60_000)
        await producer.send(b"plain")
        assert [m.data for m in await drain(consumer, 0.3)] == [b"delayed", b"plain"]
        assert subscription(broker).stats()["msgDelayed"] == 0


async def test_readers_deliver_at_once(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await send(broker, producer, b"delayed", deliver_at=now_ms() + 60_000)
        reader = await broker.create_reader(T, MessageId.earliest)
        assert [m.data for m in await drain(reader, 0.3)] == [b"delayed"]


async def test_key_shared_delayed_message_does_not_hold_back_its_key(tmp_path):
    # Pulsar tracks the delayed entry instead of dispatching it and reads on: later messages
    # of the same key are delivered first (a delay is out of order by definition); when due
    # it is replayed to the key's consumer.
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        a = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest")
        await send(broker, producer, b"k-delayed", key="k", deliver_at=now_ms() + DUE_MS)
        await send(broker, producer, b"k-next", key="k")
        assert [m.data for m in await drain(a, 0.3)] == [b"k-next"]
        late = await a.receive(timeout=DUE_MS / 1000 + 10)
        assert late.data == b"k-delayed"


async def test_restart_before_due_holds_it_again_and_after_due_delivers_it(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await send(broker, producer, b"soon", deliver_at=now_ms() + DUE_MS)
        await send(broker, producer, b"much-later", deliver_at=now_ms() + 60_000)
        assert await drain(consumer, 0.2) == []
    async with Broker.embedded(tmp_path, sync=False) as broker:
        started = time.monotonic()
        consumer = await broker.subscribe(T, "s", consumer_type="shared")
        assert await drain(consumer, 0.2) == []      # not due: held again
        assert subscription(broker).stats()["msgDelayed"] == 2
        got = await consumer.receive(timeout=DUE_MS / 1000 + 10)
        assert got.data == b"soon" and time.monotonic() - started >= 0.5
        await consumer.acknowledge(got)
    await asyncio.sleep(0.1)
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await broker.subscribe(T, "s", consumer_type="shared")
        assert await drain(consumer, 0.3) == []
        assert subscription(broker).backlog() == 1


async def test_restart_after_due_delivers_at_once(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await send(broker, producer, b"due-while-down", deliver_at=now_ms() + 500)
        assert await drain(consumer, 0.1) == []
    await asyncio.sleep(0.6)
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await broker.subscribe(T, "s", consumer_type="shared")
        assert [m.data for m in await drain(consumer, 0.3)] == [b"due-while-down"]


async def test_acks_around_a_delayed_message_move_the_mark_delete_up_to_it(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        before = [await producer.send(f"b{i}".encode()) for i in range(2)]
        held = await send(broker, producer, b"held", deliver_at=now_ms() + DUE_MS)
        after = [await producer.send(f"a{i}".encode()) for i in range(3)]
        got = await drain(consumer, 0.3)
        assert [m.data for m in got] == [b"b0", b"b1", b"a0", b"a1", b"a2"]
        for message in got:
            await consumer.acknowledge(message)
        sub = subscription(broker)
        cursor = sub.cursor
        assert cursor.mark_delete == before[-1].position          # stops just before it
        assert all(cursor.is_acked(m.position) for m in after)    # acks after it are kept
        assert not cursor.is_acked(held.position) and sub.backlog() == 1
        late = await consumer.receive(timeout=DUE_MS / 1000 + 10)
        assert late.message_id == held
        await consumer.acknowledge(late)
        assert cursor.mark_delete == after[-1].position and sub.backlog() == 0
    async with Broker.embedded(tmp_path, sync=False) as broker:                # and it is durable
        consumer = await broker.subscribe(T, "s", consumer_type="shared")
        assert await drain(consumer, 0.2) == []


async def test_acked_before_its_time_it_is_never_delivered(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        held = await send(broker, producer, b"held", deliver_at=now_ms() + 400)
        assert await drain(consumer, 0.1) == []
        await consumer.acknowledge(held)                          # by id, as a client may
        assert subscription(broker).stats()["msgDelayed"] == 0
        assert await drain(consumer, 0.6) == []


async def test_negative_ack_after_delivery_is_a_normal_redelivery(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                          negative_ack_redelivery_delay_ms=0)
        await send(broker, producer, b"held", deliver_at=now_ms() + 300)
        first = await consumer.receive(timeout=3)
        await consumer.negative_acknowledge(first)
        again = await consumer.receive(timeout=1)
        assert again.message_id == first.message_id and again.redelivery_count == 1


async def test_transactional_delayed_message_waits_for_commit_then_for_its_time(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        txn = await broker.new_transaction()
        await send(broker, producer, b"txn-delayed", deliver_at=now_ms() + DUE_MS, txn=txn)
        await send(broker, producer, b"txn-plain", txn=txn)
        assert await drain(consumer, 0.2) == []                   # not committed
        await txn.commit()
        committed = time.monotonic()
        assert [m.data for m in await drain(consumer, 0.3)] == [b"txn-plain"]
        late = await consumer.receive(timeout=DUE_MS / 1000 + 10)
        assert late.data == b"txn-delayed" and time.monotonic() - committed >= 0.5


async def test_aborted_delayed_message_is_never_delivered(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        txn = await broker.new_transaction()
        await send(broker, producer, b"gone", deliver_at=now_ms() + 300, txn=txn)
        await txn.abort()
        await producer.send(b"plain")
        assert [m.data for m in await drain(consumer, 0.6)] == [b"plain"]
        assert subscription(broker).stats()["msgDelayed"] == 0


async def test_a_delayed_batch_is_held_as_a_whole(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await send(broker, producer, b"", deliver_at=now_ms() + 500, batch=[b"x0", b"x1", b"x2"])
        assert await drain(consumer, 0.2) == []
        got = [await consumer.receive(timeout=3) for _ in range(3)]
        assert [m.data for m in got] == [b"x0", b"x1", b"x2"]


@pytest.mark.parametrize("deliver_at", [-1, -(1 << 63), 0, 1, MAX_DELIVER_AT_MS + 1, (1 << 63) - 1])
async def test_malformed_or_past_deliver_at_time_is_delivered_at_once(tmp_path, deliver_at):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await send(broker, producer, b"odd", deliver_at=deliver_at)
        await producer.send(b"next")
        assert [m.data for m in await drain(consumer, 0.3)] == [b"odd", b"next"]


async def test_policy_turns_delayed_delivery_off(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await broker.service.policies.set_topic_policy(T, "delayedDeliveryPolicies",
                                                       DelayedDelivery(active=False).to_json())
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await send(broker, producer, b"not-delayed", deliver_at=now_ms() + 60_000)
        assert [m.data for m in await drain(consumer, 0.3)] == [b"not-delayed"]


async def test_seek_forgets_held_messages_and_reads_them_again(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        first = await send(broker, producer, b"held", deliver_at=now_ms() + 60_000)
        assert await drain(consumer, 0.1) == []
        sub = subscription(broker)
        await sub.seek(first.position)
        await asyncio.sleep(0.1)
        assert sub.stats()["msgDelayed"] == 1                     # read again, held again


async def test_switch_to_exclusive_releases_what_was_held(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        shared = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await send(broker, producer, b"held", deliver_at=now_ms() + 60_000)
        assert await drain(shared, 0.1) == []
        await shared.close()
        exclusive = await broker.subscribe(T, "s", consumer_type="exclusive")
        assert [m.data for m in await drain(exclusive, 0.3)] == [b"held"]


# --- the tracker and the metadata peek ------------------------------------------------------

def test_deliver_at_time_is_read_from_the_stored_message():
    md = message_metadata("p", 0, 1, deliver_at_time=12345).SerializeToString()
    assert deliver_at_time(headers_and_payload(md, b"\x98\x01payload")) == 12345
    plain = message_metadata("\x98\x01", 0, 1).SerializeToString()     # the tag bytes, not the field
    assert deliver_at_time(headers_and_payload(plain, b"\x98\x01")) is None
    assert deliver_at_time(b"") is None and deliver_at_time(b"\x0e\x01\x00") is None
    assert deliver_at_time(b"\x00\x00\x00\x05\x98\x01\xff\xff\xff") is None     # undecodable
    assert deliver_at_time(b"\xff\xff\xff\xff") is None                         # size overruns


async def test_tracker_releases_in_time_order_and_position_order():
    clock = [1_000_000]
    fired = asyncio.Event()
    tracker = DelayedDeliveryTracker(fired.set, tick_time_ms=0, clock=lambda: clock[0])
    assert tracker.add(Position(1, 3), 1_000_050)
    assert tracker.add(Position(1, 1), 1_000_050)
    assert tracker.add(Position(1, 2), 1_000_900)
    assert not tracker.add(Position(1, 4), 1_000_000)          # due now
    assert not tracker.add(Position(1, 5), -5)
    assert len(tracker) == 3 and tracker.pop_due() == []
    clock[0] = 1_000_050
    assert tracker.pop_due() == [Position(1, 1), Position(1, 3)]
    tracker.discard([Position(1, 2)])
    assert len(tracker) == 0
    clock[0] = 2_000_000
    assert tracker.pop_due() == []
    tracker.close()


async def test_tracker_timer_fires_at_the_earliest_time():
    fired = asyncio.Event()
    tracker = DelayedDeliveryTracker(fired.set, tick_time_ms=1000)
    start = time.monotonic()
    assert tracker.add(Position(0, 0), now_ms() + 200)
    await asyncio.wait_for(fired.wait(), 2)
    assert 0.15 <= time.monotonic() - start < 1.0
    assert tracker.pop_due() == [Position(0, 0)]
    tracker.close()


async def test_delayed_delivery_policy_topic_then_namespace_then_default(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        policies = broker.service.policies
        assert policies.delayed_delivery(T) == DelayedDelivery(active=True, tick_time_ms=1000)
        namespace = policies.policies("public/default")
        namespace.delayed_delivery = {"active": True, "tickTime": 100, "maxDeliveryDelayInMillis": 0}
        await policies.set_policies("public/default", namespace)
        assert policies.delayed_delivery(T).tick_time_ms == 100
        await policies.set_topic_policy(T, "delayedDeliveryPolicies", {"active": False, "tickTime": 5})
        assert policies.delayed_delivery(T) == DelayedDelivery(active=False, tick_time_ms=5)
        await policies.set_topic_policy(T, "delayedDeliveryPolicies", {"active": "maybe"})   # malformed: skipped
        assert policies.delayed_delivery(T).tick_time_ms == 100
        with pytest.raises(ValueError):
            DelayedDelivery(tick_time_ms=-1)


async def test_messages_due_at_different_times_come_in_time_order_with_a_short_tick(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await broker.service.policies.set_topic_policy(T, "delayedDeliveryPolicies", {"active": True, "tickTime": 50})
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        base = now_ms()
        await send(broker, producer, b"third", deliver_at=base + 700)
        await send(broker, producer, b"first", deliver_at=base + 300)
        await send(broker, producer, b"second", deliver_at=base + 500)
        got = []
        for _ in range(3):
            message = await consumer.receive(timeout=3)
            got.append((message.data, now_ms() - base))
        assert [data for data, _ in got] == [b"first", b"second", b"third"]
        assert [at >= due for (_, at), due in zip(got, (300, 500, 700))] == [True] * 3
        assert got[-1][1] < 1500


async def test_key_shared_delayed_messages_go_to_their_keys_consumers_when_due(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        a = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest")
        b = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest")
        keys = [f"key-{i}" for i in range(8)]
        for key in keys:
            await send(broker, producer, key.encode(), key=key, deliver_at=now_ms() + 400)
        assert await drain(a, 0.1) == [] and await drain(b, 0.1) == []
        # Due within a few ms of each other: the first timed release takes those due then,
        # the others come with the next, a tick (1 s by default, as Pulsar's) later.
        await asyncio.sleep(1.6)
        got_a, got_b = await drain(a, 0.3), await drain(b, 0.3)
        assert sorted(m.data for m in got_a + got_b) == sorted(k.encode() for k in keys)
        assert {m.partition_key for m in got_a}.isdisjoint({m.partition_key for m in got_b})


async def test_a_message_is_due_by_the_brokers_clock(tmp_path):
    """BrokerConfig.clock decides when a delayed message is due (as it decides transaction
    timeouts), so a test can hold time still while it sets up."""
    clock = PausedWallClock()
    async with Broker.embedded(tmp_path, sync=False, clock=clock) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await send(broker, producer, b"held", deliver_at=clock() + 100)
        assert await drain(consumer, 0.4) == []             # past it by the wall, not by the broker
        clock.resume()
        assert (await consumer.receive(timeout=3)).data == b"held"
