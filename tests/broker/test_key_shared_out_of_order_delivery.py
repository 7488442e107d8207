"""Key_Shared with allowOutOfOrderDelivery (KeySharedMeta, pulsar-client's
ConsumerKeySharedPolicy(allow_out_of_order_delivery=True)), as Apache Pulsar: the subscription
keeps no per-key order while its consumers change. A key that moves to a joining consumer goes
there at once, whatever the previous consumer still holds unacknowledged of it (no draining
hashes), and the entries of it held back go there too. The setting is the subscription's: its
first consumer's, and a consumer asking otherwise while it has consumers is refused
(ConsumerBusyError, Pulsar's SubscriptionBusyException)."""

from __future__ import annotations

import pytest

from pyengine.admin.stats import subscription_stats
from pyengine.broker import Broker
from pyengine.client import ConsumerKeySharedPolicy, KeySharedMode
from pyengine.errors import ConsumerBusyError
from tests.broker.helpers import drain
from pyengine.broker.hash_ring import KEY_HASH_RANGE_SIZE as HASH_RANGE, sticky_key_hash
from tests.broker.test_key_shared_draining_hashes import T, a_key, broker_consumer, join, subscription
from tests.broker.test_key_shared_look_ahead import settle

OUT_OF_ORDER = ConsumerKeySharedPolicy(allow_out_of_order_delivery=True)


async def test_a_moved_key_goes_to_the_joiner_while_the_previous_consumer_holds_it(tmp_path):
    moved = a_key("c0", "c1", ["c0"], ["c0", "c1"])
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        c0 = await join(broker, "c0", key_shared_policy=OUT_OF_ORDER)
        await producer.send(b"m0", key=moved)
        assert (await c0.receive(timeout=5)).data == b"m0"          # never acknowledged
        c1 = await join(broker, "c1", key_shared_policy=OUT_OF_ORDER)
        await producer.send(b"m1", key=moved)
        assert (await c1.receive(timeout=5)).data == b"m1"
        stats = subscription_stats(subscription(broker))
        assert stats["allowOutOfOrderDelivery"] is True
        assert stats["drainingHashesCount"] == 0
        assert subscription(broker).dispatcher._draining == {}


async def test_entries_held_back_before_a_join_go_to_the_joiner(tmp_path):
    """Read while c0 had no permits, they wait for c0; once c1 owns their key they go to c1,
    though m0 is still unacknowledged at c0."""
    moved = a_key("c0", "c1", ["c0", "other"], ["c0", "other", "c1"])
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        c0 = await join(broker, "c0", receiver_queue_size=1, key_shared_policy=OUT_OF_ORDER)
        await join(broker, "other", key_shared_policy=OUT_OF_ORDER)
        for i in range(3):
            await producer.send(b"m%d" % i, key=moved)
        await settle(subscription(broker).dispatcher)
        assert len(subscription(broker).dispatcher.redeliveries) == 2   # m1, m2 held: c0 is full
        c1 = await join(broker, "c1", key_shared_policy=OUT_OF_ORDER)
        assert [(await c1.receive(timeout=5)).data for _ in range(2)] == [b"m1", b"m2"]
        assert (await c0.receive(timeout=5)).data == b"m0"


async def test_in_order_is_still_the_default(tmp_path):
    moved = a_key("c0", "c1", ["c0"], ["c0", "c1"])
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        c0 = await join(broker, "c0", key_shared_policy=ConsumerKeySharedPolicy())
        await producer.send(b"m0", key=moved)
        await c0.receive(timeout=5)
        await join(broker, "c1")
        await producer.send(b"m1", key=moved)
        await settle(subscription(broker).dispatcher)
        assert not broker_consumer(broker, "c1").pending        # m1 waits for m0's ack
        assert subscription_stats(subscription(broker))["allowOutOfOrderDelivery"] is False


@pytest.mark.parametrize("first, second", [(True, False), (False, True)])
async def test_a_consumer_asking_for_the_other_setting_is_refused(tmp_path, first, second):
    async with Broker.embedded(tmp_path) as broker:
        c0 = await join(broker, "c0", key_shared_policy=ConsumerKeySharedPolicy(allow_out_of_order_delivery=first))
        with pytest.raises(ConsumerBusyError, match="out of order delivery"):
            await join(broker, "c1", key_shared_policy=ConsumerKeySharedPolicy(allow_out_of_order_delivery=second))
        assert [c.name for c in subscription(broker).consumers] == ["c0"]
        assert subscription(broker).allow_out_of_order_delivery is first
        # Once its consumers are gone, the next one sets it again (Pulsar: a new dispatcher).
        await c0.close()
        await join(broker, "c1", key_shared_policy=ConsumerKeySharedPolicy(allow_out_of_order_delivery=second))
        assert subscription(broker).allow_out_of_order_delivery is second


async def test_the_policy_only_matters_to_key_shared_consumers(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        await broker.subscribe(T, "s", consumer_type="shared", key_shared_policy=OUT_OF_ORDER)
        assert subscription(broker).allow_out_of_order_delivery is False
        await broker.subscribe(T, "s", consumer_type="shared")      # not refused


async def test_sticky_ranges_of_the_embedded_policy_route_by_key(tmp_path):
    slot = sticky_key_hash(b"k")
    mine = [(slot, slot)]
    rest = [r for r in ((0, slot - 1), (slot + 1, HASH_RANGE - 1)) if r[0] <= r[1]]
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        sticky = ConsumerKeySharedPolicy(KeySharedMode.Sticky, sticky_ranges=mine)
        owner = await join(broker, "owner", key_shared_policy=sticky)
        await join(broker, "rest", key_shared_policy=ConsumerKeySharedPolicy("sticky", sticky_ranges=rest))
        assert broker_consumer(broker, "owner").sticky_ranges == mine
        for i in range(3):
            await producer.send(b"k%d" % i, key="k")
        assert [(await owner.receive(timeout=5)).data for _ in range(3)] == [b"k0", b"k1", b"k2"]
        assert await drain(owner) == []


async def test_a_bad_policy_is_refused_before_subscribing(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        with pytest.raises(TypeError, match="key_shared_policy"):
            await broker.subscribe(T, "s", consumer_type="key_shared", key_shared_policy={"allow": True})
        assert T not in broker.service.topics or "s" not in broker.service.topics[T].subscriptions
