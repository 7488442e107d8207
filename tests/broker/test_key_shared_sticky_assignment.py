"""Key_Shared consumers that cannot join, as Apache Pulsar refuses them:

- while the subscription has consumers, one asking for the other mode (AutoSplit or Sticky) is
  refused with ConsumerBusyError (Pulsar's SubscriptionBusyException, "Subscription is of
  different type");
- a Sticky consumer whose hash ranges are empty, reversed, or overlap a range of another
  consumer (or another of its own) is refused with ConsumerAssignError (Pulsar's
  HashRangeExclusiveStickyKeyConsumerSelector). Before, overlapping consumers were accepted and
  the first one listed silently took the shared slots, and an AutoSplit consumer beside Sticky
  ones was accepted and never given anything.

The refused consumer changes nothing: the subscription keeps its consumers and its mode.
"""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.broker.hash_ring import KEY_HASH_RANGE_SIZE as HASH_RANGE, sticky_key_hash
from pyengine.client import ConsumerKeySharedPolicy, KeySharedMode
from pyengine.errors import ConsumerAssignError, ConsumerBusyError
from tests.broker.helpers import drain
from tests.broker.test_key_shared_draining_hashes import T, join, subscription


def sticky(*ranges: tuple[int, int]) -> ConsumerKeySharedPolicy:
    return ConsumerKeySharedPolicy(KeySharedMode.Sticky, sticky_ranges=list(ranges))


def names(broker) -> list[str]:
    return [c.name for c in subscription(broker).consumers]


@pytest.mark.parametrize("first, second, active", [
    (None, sticky((0, 100)), "AUTO_SPLIT"),
    (sticky((0, 100)), None, "STICKY"),
])
async def test_a_consumer_of_the_other_mode_is_refused(tmp_path, first, second, active):
    async with Broker.embedded(tmp_path) as broker:
        c0 = await join(broker, "c0", key_shared_policy=first)
        with pytest.raises(ConsumerBusyError, match=f"key_shared mode '{active}' is different"):
            await join(broker, "c1", key_shared_policy=second)
        assert names(broker) == ["c0"]
        # Once its consumers are gone, the next one chooses again (Pulsar: a new dispatcher).
        await c0.close()
        await join(broker, "c1", key_shared_policy=second)
        assert names(broker) == ["c1"]


@pytest.mark.parametrize("taken, asked", [
    ([(0, 100)], [(100, 200)]),                 # one shared slot, at the end
    ([(50, 60)], [(0, 65535)]),                 # covers it
    ([(0, 10), (500, 600)], [(20, 30), (550, 550)]),
])
async def test_a_sticky_consumer_overlapping_another_is_refused(tmp_path, taken, asked):
    async with Broker.embedded(tmp_path) as broker:
        await join(broker, "c0", key_shared_policy=sticky(*taken))
        with pytest.raises(ConsumerAssignError, match="Range conflict with consumer 'c0'"):
            await join(broker, "c1", key_shared_policy=sticky(*asked))
        assert names(broker) == ["c0"]
        assert [c.sticky_ranges for c in subscription(broker).consumers] == [taken]


async def test_adjacent_sticky_ranges_are_accepted_and_each_slot_has_one_owner(tmp_path):
    keys = {name: next(k for k in map(str, range(1000)) if (sticky_key_hash(k.encode()) < 32768) == low)
            for name, low in (("low", True), ("high", False))}
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        low = await join(broker, "low", key_shared_policy=sticky((0, 32767)))
        high = await join(broker, "high", key_shared_policy=sticky((32768, HASH_RANGE - 1)))
        for name, key in keys.items():
            await producer.send(name.encode(), key=key)
        assert (await low.receive(timeout=5)).data == b"low"
        assert (await high.receive(timeout=5)).data == b"high"
        assert await drain(low) == [] and await drain(high) == []
