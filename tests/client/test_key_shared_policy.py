"""subscribe(..., key_shared_policy=ConsumerKeySharedPolicy(...)) as pulsar-client's: the mode
(AutoSplit, or Sticky with its hash ranges) and allow_out_of_order_delivery go in the SUBSCRIBE's
KeySharedMeta, and the broker keeps to them: with out-of-order delivery allowed, a key moved to
a joining consumer reaches it while the previous consumer still holds unacknowledged messages of
it; consumers of one subscription must agree on it (ConsumerBusyError)."""

from __future__ import annotations

import asyncio

import pulsar
import pytest

from pyengine.broker.hash_ring import sticky_key_hash
from pyengine.client import ConsumerAssignError, ConsumerBusyError, ConsumerKeySharedPolicy, KeySharedMode
from tests.broker.test_key_shared_draining_hashes import a_key
from tests.broker.test_key_shared_look_ahead import settle

TOPIC = "persistent://public/default/key-shared-policy"


def broker_side(broker, name: str):
    subscription = broker.service.topics[TOPIC].subscriptions["s"]
    return next(c for c in subscription.consumers if c.name == name)


async def join(client, name: str, policy=None, **options):
    return await client.subscribe(TOPIC, "s", consumer_type="key_shared", initial_position="earliest",
                                  consumer_name=name, key_shared_policy=policy, **options)


@pytest.mark.parametrize("allowed", [True, False])
async def test_a_moved_key_reaches_the_joiner_only_when_out_of_order_delivery_is_allowed(broker, client, allowed):
    moved = a_key("c0", "c1", ["c0"], ["c0", "c1"])
    policy = ConsumerKeySharedPolicy(allow_out_of_order_delivery=allowed)
    producer = await client.create_producer(TOPIC, batching_enabled=False)
    c0 = await join(client, "c0", policy)
    await producer.send(b"m0", key=moved)
    held = await c0.receive(timeout=5)                   # not acknowledged yet
    c1 = await join(client, "c1", policy)
    assert broker_side(broker, "c1").allow_out_of_order_delivery is allowed
    await producer.send(b"m1", key=moved)
    if allowed:
        assert (await c1.receive(timeout=5)).data == b"m1"
    else:
        await settle(broker.service.topics[TOPIC].subscriptions["s"].dispatcher)
        assert not broker_side(broker, "c1").pending    # m1 waits for m0's acknowledgement
        await c0.acknowledge(held)                       # the hash drains: m1 goes on
        assert (await c1.receive(timeout=5)).data == b"m1"


async def test_a_consumer_with_the_other_setting_is_refused(client):
    await join(client, "c0", ConsumerKeySharedPolicy(allow_out_of_order_delivery=True))
    with pytest.raises(ConsumerBusyError, match="out of order delivery"):
        await join(client, "c1")


async def test_overlapping_sticky_ranges_fail_the_subscribe_at_once(client):
    """ConsumerAssignError is not retried (as the C++ client's ResultConsumerAssignError)."""
    sticky = ConsumerKeySharedPolicy(KeySharedMode.Sticky, sticky_ranges=[(0, 100)])
    await join(client, "c0", sticky)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ConsumerAssignError, match="Range conflict with consumer 'c0'"):
        await join(client, "c1", sticky)
    assert loop.time() - started < 2
    with pytest.raises(ConsumerBusyError, match="key_shared mode 'STICKY' is different"):
        await join(client, "c2")


async def test_pulsar_clients_policy_is_taken_and_sticky_ranges_are_sent(broker, client):
    slot = sticky_key_hash(b"k")
    official = pulsar.ConsumerKeySharedPolicy(pulsar.KeySharedMode.Sticky, allow_out_of_order_delivery=True,
                                              sticky_ranges=[(slot, slot)])
    owner = await join(client, "owner", official)
    assert broker_side(broker, "owner").sticky_ranges == [(slot, slot)]
    assert broker_side(broker, "owner").allow_out_of_order_delivery is True
    producer = await client.create_producer(TOPIC, batching_enabled=False)
    await producer.send(b"k0", key="k")
    assert (await owner.receive(timeout=5)).data == b"k0"


def test_the_policy_takes_modes_by_enum_or_name():
    assert ConsumerKeySharedPolicy().key_shared_mode is KeySharedMode.AutoSplit
    assert ConsumerKeySharedPolicy("AUTO_SPLIT").key_shared_mode is KeySharedMode.AutoSplit
    assert ConsumerKeySharedPolicy(pulsar.KeySharedMode.AutoSplit).key_shared_mode is KeySharedMode.AutoSplit
    sticky = ConsumerKeySharedPolicy("sticky", sticky_ranges=[(0, 9), [20, 29]])
    assert sticky.key_shared_mode is KeySharedMode.Sticky and sticky.sticky_ranges == [(0, 9), (20, 29)]


@pytest.mark.parametrize("arguments, error, message", [
    ({"key_shared_mode": 1}, TypeError, "key_shared_mode"),
    ({"key_shared_mode": "exclusive"}, ValueError, "key_shared_mode"),
    ({"allow_out_of_order_delivery": 1}, TypeError, "allow_out_of_order_delivery must be a bool"),
    ({"key_shared_mode": KeySharedMode.Sticky}, ValueError, "needs sticky_ranges"),
    ({"key_shared_mode": "sticky", "sticky_ranges": []}, ValueError, "must not be empty"),
    ({"key_shared_mode": "sticky", "sticky_ranges": (0, 9)}, TypeError, "sticky_ranges"),
    ({"key_shared_mode": "sticky", "sticky_ranges": "0-9"}, TypeError, "sticky_ranges"),
    ({"key_shared_mode": "sticky", "sticky_ranges": [(0, 9.5)]}, TypeError, "must be an int"),
    ({"key_shared_mode": "sticky", "sticky_ranges": [(0, True)]}, TypeError, "must be an int"),
    ({"key_shared_mode": "sticky", "sticky_ranges": [(0, 65536)]}, ValueError, "65535"),
    ({"key_shared_mode": "sticky", "sticky_ranges": [(-1, 5)]}, ValueError, "65535"),
    ({"key_shared_mode": "sticky", "sticky_ranges": [(9, 0)]}, ValueError, "start <= end"),
    ({"key_shared_mode": "sticky", "sticky_ranges": [(0, 9), (9, 12)]}, ValueError, "overlap"),
])
def test_a_bad_policy_is_a_clear_error(arguments, error, message):
    with pytest.raises(error, match=message):
        ConsumerKeySharedPolicy(**arguments)


async def test_subscribe_refuses_what_is_not_a_policy(broker, client):
    with pytest.raises(TypeError, match="key_shared_policy must be a ConsumerKeySharedPolicy"):
        await join(client, "c0", {"allow_out_of_order_delivery": True})
    assert TOPIC not in broker.service.topics
