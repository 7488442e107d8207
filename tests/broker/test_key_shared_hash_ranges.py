"""Key_Shared consumers' hash ranges (Pulsar 4.0's keyHashRangeArrays) and the key hashes that
route messages to them: a key goes to the consumer whose reported range holds its hash, as a
Pulsar user computes it (hash_ring.py)."""

from __future__ import annotations

from pyengine.admin.stats import subscription_stats
from pyengine.broker import Broker
from pyengine.broker.hash_ring import ring_key_hash, sticky_key_hash
from tests.broker.helpers import drain
from tests.broker.test_key_shared_draining_hashes import T, join, subscription
from tests.broker.test_key_shared_sticky_assignment import sticky


def ranges_by_consumer(broker) -> dict[str, list[list[int]]]:
    return {c["consumerName"]: c["keyHashRangeArrays"] for c in subscription_stats(subscription(broker))["consumers"]}


def owner_by_ranges(ranges: dict[str, list[list[int]]], hash_value: int) -> str:
    [owner] = [name for name, spans in ranges.items() if any(s <= hash_value <= e for s, e in spans)]
    return owner


async def test_auto_split_ranges_cover_every_hash_once_and_route_the_keys(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumers = {name: await join(broker, name) for name in ("c0", "c1", "c2")}
        ranges = ranges_by_consumer(broker)
        assert subscription_stats(subscription(broker))["keySharedMode"] == "AUTO_SPLIT"
        spans = sorted(span for spans in ranges.values() for span in spans)
        assert spans[0][0] == 1 and spans[-1][1] == 65535
        assert all(b[0] == a[1] + 1 for a, b in zip(spans, spans[1:]))
        keys = [f"key-{i}" for i in range(60)]
        for key in keys:
            await producer.send(key.encode(), key=key)
        for name, consumer in consumers.items():
            got = [m.data.decode() for m in await drain(consumer)]
            assert got == [k for k in keys if owner_by_ranges(ranges, ring_key_hash(k.encode())) == name]
            assert got                                  # 60 keys: each of the three has some


async def test_sticky_ranges_are_reported_and_route_by_the_sticky_hash(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        low = await join(broker, "low", key_shared_policy=sticky((32768, 65535), (0, 99)))
        high = await join(broker, "high", key_shared_policy=sticky((100, 32767)))
        ranges = ranges_by_consumer(broker)
        assert ranges == {"low": [[0, 99], [32768, 65535]], "high": [[100, 32767]]}
        # the mode is reported as Pulsar's SubscriptionStats.keySharedMode (found by an audit)
        assert subscription_stats(subscription(broker))["keySharedMode"] == "STICKY"
        keys = [f"key-{i}" for i in range(40)]
        for key in keys:
            await producer.send(key.encode(), key=key)
        for name, consumer in (("low", low), ("high", high)):
            got = [m.data.decode() for m in await drain(consumer)]
            assert got == [k for k in keys if owner_by_ranges(ranges, sticky_key_hash(k.encode())) == name]


async def test_other_subscription_types_report_no_hash_ranges(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        await broker.subscribe(T, "s", consumer_type="shared", consumer_name="c0")
        stats = subscription_stats(subscription(broker))
        [consumer] = stats["consumers"]
        assert "keyHashRangeArrays" not in consumer and "keySharedMode" not in stats


async def test_messages_given_back_under_auto_split_reach_the_sticky_consumer_that_follows(tmp_path):
    # The given-back entries carried the ring's hash of their key; the STICKY selector that
    # comes next hashes keys otherwise, so they are read and hashed again.
    key = next(k for k in (f"key-{i}" for i in range(1000))
               if ring_key_hash(k.encode()) != sticky_key_hash(k.encode()))
    slot = sticky_key_hash(key.encode())
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        c0 = await join(broker, "c0")
        for i in range(3):
            await producer.send(b"m%d" % i, key=key)
        assert len(await drain(c0)) == 3                   # delivered, not acknowledged
        await c0.close()                                   # given back
        only_it = await join(broker, "only-it", key_shared_policy=sticky((slot, slot)))
        assert [m.data for m in await drain(only_it)] == [b"m0", b"m1", b"m2"]
