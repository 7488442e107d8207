"""Key_Shared draining hashes (Pulsar 4.0, PIP-379): a key is delivered and unacknowledged at one
consumer at a time. When the consumers change, a key hash whose previous consumer still holds
unacknowledged messages of it drains there: its new consumer gets none of its messages until
they are acknowledged (or that consumer leaves, giving them back first). Keys that did not
move, or that moved with nothing unacknowledged, go on at once."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from pyengine.admin.stats import subscription_stats
from pyengine.broker import Broker
from pyengine.broker.hash_ring import ring_key_hash
from tests.broker.helpers import drain
from tests.broker.test_key_shared_look_ahead import settle
from tests.broker.test_key_shared_ordering_on_joins import ring_owner

T = "persistent://public/default/key-shared-draining"


def keys(owner_before: str | None, owner_after: str, before: list[str], after: list[str]) -> Iterator[str]:
    """Keys the hash ring gives `owner_before` among `before` and `owner_after` among `after`."""
    for i in range(10_000):
        key = f"key-{i}"
        if ((owner_before is None or ring_owner(before, key) == owner_before)
                and ring_owner(after, key) == owner_after):
            yield key


def a_key(owner_before: str | None, owner_after: str, before: list[str], after: list[str]) -> str:
    return next(keys(owner_before, owner_after, before, after))


def subscription(broker):
    return broker.service.topics[T].subscriptions["s"]


def broker_consumer(broker, name: str):
    return next(c for c in subscription(broker).consumers if c.name == name)


async def join(broker, name: str, **options):
    return await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest",
                                  consumer_name=name, **options)


async def c0_holding_a_moved_key(broker, received: int = 2, **c0_options):
    """c0, alone, gets m0 and m1 of a key that c1 takes when it joins (`received` of them taken
    from its queue: all unacknowledged), then c1 joins and m2 is sent. Returns (producer, c0,
    c1, what c0 received)."""
    moved = a_key("c0", "c1", ["c0"], ["c0", "c1"])
    producer = await broker.create_producer(T)
    c0 = await join(broker, "c0", **c0_options)
    for i in range(2):
        await producer.send(b"m%d" % i, key=moved)
    first = [await c0.receive(timeout=5) for _ in range(received)]
    c1 = await join(broker, "c1")
    await producer.send(b"m2", key=moved)
    return producer, c0, c1, first


async def test_a_moved_key_waits_only_while_the_previous_consumer_holds_unacked_messages_of_it(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer, c0, c1, first = await c0_holding_a_moved_key(broker)
        assert await drain(c1) == []                 # m0, m1 unacknowledged at c0
        await c0.acknowledge(first[0])
        assert await drain(c1) == []                 # m1 still is
        await c0.acknowledge(first[1])
        assert [m.data for m in await drain(c1)] == [b"m2"]
        assert await drain(c0) == []


async def test_a_joiner_gets_the_keys_that_moved_with_nothing_unacked_at_once(tmp_path):
    """The old recently-joined rule held back everything after the joiner's arrival while any
    earlier message was unacknowledged; only the keys with unacknowledged messages wait now."""
    stays = a_key(None, "c0", ["c0"], ["c0", "c1"])
    busy, idle = list(itertools.islice(keys(None, "c1", ["c0"], ["c0", "c1"]), 2))
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        c0 = await join(broker, "c0")
        await producer.send(b"stays-0", key=stays)
        await producer.send(b"busy-0", key=busy)
        held_by_c0 = [await c0.receive(timeout=5) for _ in range(2)]   # never acknowledged here
        c1 = await join(broker, "c1")
        await producer.send(b"idle-0", key=idle)
        await producer.send(b"busy-1", key=busy)
        await producer.send(b"stays-1", key=stays)
        assert [m.data for m in await drain(c1)] == [b"idle-0"]       # not busy-1: busy-0 is at c0
        assert [m.data for m in await drain(c0)] == [b"stays-1"]      # its own key goes on
        await c0.acknowledge(held_by_c0[1])
        assert [m.data for m in await drain(c1)] == [b"busy-1"]


async def test_a_leaving_consumer_gives_its_messages_back_first_and_releases_its_hashes(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer, c0, c1, _ = await c0_holding_a_moved_key(broker, received=1)   # m1 still queued
        assert await drain(c1) == []
        await c0.close()
        assert [m.data for m in await drain(c1)] == [b"m0", b"m1", b"m2"]
        assert subscription(broker).dispatcher._draining == {}


async def test_entries_held_before_a_join_do_not_reach_the_joiner_ahead_of_unacked_ones(tmp_path):
    """The known defect of the recently-joined rule: entries read before the join and held back
    (c0 had no permits) were given to the joiner while older ones of their key were still
    unacknowledged at c0."""
    moved = a_key("c0", "c1", ["c0", "other"], ["c0", "other", "c1"])
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        c0 = await join(broker, "c0", receiver_queue_size=1)
        await join(broker, "other")                  # can take: the reading goes on past c0's key
        for i in range(3):
            await producer.send(b"m%d" % i, key=moved)
        await settle(subscription(broker).dispatcher)
        assert len(subscription(broker).dispatcher.redeliveries) == 2   # m1, m2 held: c0 is full
        c1 = await join(broker, "c1")
        assert await drain(c1) == []                 # m0 is unacknowledged at c0
        m0 = await c0.receive(timeout=5)
        assert m0.data == b"m0"
        assert await drain(c1) == []
        await c0.acknowledge(m0)
        assert [m.data for m in await drain(c1)] == [b"m1", b"m2"]


async def test_a_negative_ack_while_draining_goes_to_the_new_consumer_in_order(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer, c0, c1, (m0, m1) = await c0_holding_a_moved_key(broker, negative_ack_redelivery_delay_ms=0)
        await c0.negative_acknowledge(m0)
        assert await drain(c1) == [] and await drain(c0) == []   # m1 still unacknowledged at c0
        await c0.acknowledge(m1)
        got = await drain(c1)
        assert [(m.data, m.redelivery_count) for m in got] == [(b"m0", 1), (b"m2", 0)]


async def test_a_negative_ack_of_the_keys_own_consumer_comes_back_before_later_messages(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        c0 = await join(broker, "c0", negative_ack_redelivery_delay_ms=0, receiver_queue_size=2)
        for i in range(4):
            await producer.send(b"m%d" % i, key="k")
        m0 = await c0.receive(timeout=5)
        await c0.negative_acknowledge(m0)            # m1 queued; m2, m3 wait behind m0
        received = []
        for _ in range(4):
            message = await c0.receive(timeout=5)
            received.append(message.data)
            await c0.acknowledge(message)
        assert received == [b"m1", b"m0", b"m2", b"m3"]


async def test_a_key_moving_back_to_its_draining_consumer_is_not_blocked(tmp_path):
    moved = a_key("c0", "c1", ["c0"], ["c0", "c1"])
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        c0 = await join(broker, "c0")
        await producer.send(b"m0", key=moved)
        m0 = await c0.receive(timeout=5)
        c1 = await join(broker, "c1")
        await c1.close()                             # the key is c0's again, m0 still unacked
        await producer.send(b"m1", key=moved)
        assert [m.data for m in await drain(c0)] == [b"m1"]
        await c0.acknowledge(m0)
        assert subscription(broker).dispatcher._draining == {}


async def test_draining_hashes_in_the_consumer_and_subscription_stats(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer, c0, c1, first = await c0_holding_a_moved_key(broker)
        assert await drain(c1) == []
        stats = subscription_stats(subscription(broker))
        by_name = {c["consumerName"]: c for c in stats["consumers"]}
        assert by_name["c0"]["drainingHashesCount"] == 1
        assert by_name["c0"]["drainingHashesUnackedMessages"] == 2
        [draining] = by_name["c0"]["drainingHashes"]
        assert draining["hash"] == ring_key_hash(first[0].partition_key.encode()) and draining["unackMsgs"] == 2
        assert draining["blockedAttempts"] >= 1
        assert by_name["c1"]["drainingHashesCount"] == 0 and by_name["c1"]["drainingHashes"] == []
        assert (stats["drainingHashesCount"], stats["drainingHashesUnackedMessages"]) == (1, 2)
        for message in first:
            await c0.acknowledge(message)
        assert [m.data for m in await drain(c1)] == [b"m2"]
        stats = subscription_stats(subscription(broker))
        by_name = {c["consumerName"]: c for c in stats["consumers"]}
        assert by_name["c0"]["drainingHashesCount"] == 0 and by_name["c0"]["drainingHashesClearedTotal"] == 1
        assert (stats["drainingHashesCount"], stats["drainingHashesClearedTotal"]) == (0, 1)


async def test_a_moved_key_waits_across_several_joins_until_the_first_consumer_acks(tmp_path):
    moved = a_key("c0", "c2", ["c0"], ["c0", "c1", "c2"])
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        c0 = await join(broker, "c0")
        await producer.send(b"m0", key=moved)
        m0 = await c0.receive(timeout=5)
        c1 = await join(broker, "c1")
        await producer.send(b"m1", key=moved)
        c2 = await join(broker, "c2")
        await producer.send(b"m2", key=moved)
        assert await drain(c1) == [] and await drain(c2) == []
        await c0.acknowledge(m0)
        assert [m.data for m in await drain(c2)] == [b"m1", b"m2"]
        assert await drain(c1) == []
