"""The controller: leader election, split and merge in the spec's order, crash recovery at every
step, subscriptions, and consumer sessions with their grace period."""

import asyncio
import time

import pytest

from pyengine.errors import NotAllowedError, SubscriptionNotFoundError, TopicTerminatedError
from pyengine.metadata import BadVersionError
from pyengine.scalable import LayoutError, key_hash
from pyengine.scalable.controller import STEPS, NotLeaderError
from pyengine.scalable.coordinator import round_robin
from pyengine.scalable.resources import ScalableTopicExistsError, ScalableTopicNotFoundError
from pyengine.scalable.service import scalable_topic_name
from tests.broker.helpers import drain
from tests.scalable.conftest import TOPIC


@pytest.fixture
def session_ttl() -> float:
    """Short: these tests wait for a crashed broker's session to expire."""
    return 0.5


class Crash(Exception):
    pass


def crash_at(step, nth=1):
    seen = []

    async def fault(name):
        seen.append(name)
        if seen.count(step) == nth and name == step:
            raise Crash(step)
    return fault


async def test_create_split_merge_and_the_segment_topics(broker, services):
    a = await services("a")
    layout = await a.create_topic(TOPIC, 2)
    assert [s.descriptor for s in layout.active_segments] == ["0000-7fff-0", "8000-ffff-1"]
    with pytest.raises(ScalableTopicExistsError):
        await a.create_topic(TOPIC, 1)
    controller = await a.controller(TOPIC)
    assert controller.is_leader and await a.leader_url(TOPIC) == "pulsar://a:6650"
    await controller.create_subscription("sub")
    split = await a.split_segment(TOPIC, 0)
    assert [(s.segment_id, s.descriptor) for s in split.active_segments] == [
        (2, "0000-3fff-2"), (3, "4000-7fff-3"), (1, "8000-ffff-1")]
    segments = broker.service
    parent = await segments.get_topic("segment://public/default/orders/0000-7fff-0", create=False)
    assert parent.ledger.terminated_at is not None
    for child in ("segment://public/default/orders/0000-3fff-2", "segment://public/default/orders/4000-7fff-3"):
        assert list((await segments.get_topic(child, create=False)).subscriptions) == ["sub"]
    merged = await a.merge_segments(TOPIC, 3, 1)
    assert [s.descriptor for s in merged.active_segments] == ["0000-3fff-2", "4000-ffff-4"]
    assert (await a.get_layout(TOPIC)).epoch == 2
    assert await a.list_topics("public/default") == [TOPIC]
    with pytest.raises(LayoutError):
        await a.merge_segments(TOPIC, 2, 0)             # sealed
    with pytest.raises(LayoutError):
        await a.split_segment(TOPIC, 99)
    merged_topic = await segments.get_topic("segment://public/default/orders/4000-ffff-4", create=False)
    now = time.monotonic()
    merged_topic.update_rates(now)                       # a stats interval: 6 messages in 2 s
    merged_topic.rate_in.add(6, 600)
    merged_topic.update_rates(now + 2.0)
    stats = await controller.stats()
    assert stats["activeSegmentCount"] == 2 and stats["sealedSegmentCount"] == 3
    # the spec's per-segment rates, from each segment's broker
    assert stats["segments"]["4"]["msgRateIn"] == 3.0 and stats["segments"]["4"]["msgThroughputIn"] == 300.0
    assert stats["segments"]["2"]["msgRateOut"] == 0.0
    assert stats["controllerBrokerUrl"] == "pulsar://a:6650"
    await a.delete_topic(TOPIC)
    assert await a.list_topics("public/default") == []
    assert not [t for t in segments.list_topics() if t.startswith("segment://public/default/orders/")]
    with pytest.raises(ScalableTopicNotFoundError):
        await a.get_layout(TOPIC)


async def test_bad_names_and_arguments(services):
    a = await services("a")
    for bad in ("persistent://public/default/x", "segment://public/default/x/0000-ffff-0", "a/b/c/d", 7):
        with pytest.raises((NotAllowedError, ValueError)):
            await a.create_topic(bad)
    for bad in (0, -1, 70000, "2"):
        with pytest.raises(LayoutError):
            await a.create_topic(TOPIC, bad)
    assert await a.list_topics("public/default") == []
    with pytest.raises(ScalableTopicNotFoundError):
        await a.controller("public/default/missing")
    await a.create_topic(TOPIC)
    controller = await a.controller(TOPIC)
    for bad in ("", None, "a/b"):
        with pytest.raises(NotAllowedError):
            await controller.create_subscription(bad)
        with pytest.raises(NotAllowedError):
            await controller.register_consumer(bad, "c")
    with pytest.raises(NotAllowedError):
        await controller.register_consumer("s", "")
    with pytest.raises(SubscriptionNotFoundError):
        await controller.delete_subscription("nope")
    assert scalable_topic_name("t/ns/x").local_name == "x"


async def test_only_the_leader_mutates_and_a_follower_takes_over(services):
    a, b = await services("a"), await services("b")
    await a.create_topic(TOPIC, 1)
    leader, follower = await a.controller(TOPIC), await b.controller(TOPIC)
    assert leader.is_leader and not follower.is_leader and follower.leader_url == "pulsar://a:6650"
    for op in (lambda: follower.split_segment(0), lambda: follower.merge_segments(0, 1),
               lambda: follower.create_subscription("s"), lambda: follower.register_consumer("s", "c"),
               lambda: b.split_segment(TOPIC, 0)):
        with pytest.raises(NotLeaderError, match="pulsar://a:6650"):
            await op()
    assert (await follower.get_layout()).epoch == 0          # reads work anywhere
    a.crash()                                                # kill: the session is left to expire
    await follower.wait_leading(timeout=3)
    assert await b.leader_url(TOPIC) == "pulsar://b:6650"
    assert (await b.split_segment(TOPIC, 0)).epoch == 1


@pytest.mark.parametrize("operation", ["split", "merge"])
@pytest.mark.parametrize("step", STEPS)
async def test_a_crash_between_any_two_steps_is_completed_or_rolled_back(broker, services, operation, step):
    a = await services("a", fault=crash_at(step))
    b = await services("b")
    await a.create_topic(TOPIC, 2)
    controller = await a.controller(TOPIC)
    await b.controller(TOPIC)
    await controller.create_subscription("sub")
    layout = await a.get_layout(TOPIC)
    parents = [0] if operation == "split" else [0, 1]
    parent_topics = [layout.segment(p).topic_name(TOPIC) for p in parents]
    producers = [await broker.create_producer(t) for t in parent_topics]
    for producer in producers:
        for i in range(5):
            await producer.send(f"{producer.topic}-{i}".encode())
    with pytest.raises(Crash):
        if operation == "split":
            await a.split_segment(TOPIC, 0)
        else:
            await a.merge_segments(TOPIC, 0, 1)
    a.crash()
    new_leader = await b.leader(TOPIC, timeout=3)
    await new_leader.wait_leading(timeout=3)
    after = await b.get_layout(TOPIC)
    after.check()
    assert await b.resources.pending_operation(scalable_topic_name(TOPIC)) is None
    terminated = [await b.segments.is_terminated(t) for t in parent_topics]
    completed = step not in ("operation", "subscriptions", "create")
    if completed:                                  # a parent was sealed: the new leader finished
        assert after.epoch == 1 and all(terminated)
        assert all(not after.segment(p).is_active for p in parents)
        for child in after.active_segments:
            if child.segment_id >= 2:
                topic = await broker.service.get_topic(child.topic_name(TOPIC), create=False)
                assert "sub" in topic.subscriptions
    else:                                          # nothing sealed: rolled back, children gone
        assert after.epoch == 0 and not any(terminated)
        assert not [t for t in broker.service.list_topics() if t.endswith(("-2", "-3"))]
        for producer in producers:                 # the parents still take messages
            await producer.send(b"after-rollback")
    # nothing the parents accepted is lost
    for parent_topic in parent_topics:
        consumer = await broker.subscribe(parent_topic, "sub")
        data = [m.data for m in await drain(consumer)]
        expected = [f"{parent_topic}-{i}".encode() for i in range(5)]
        assert data == expected + ([] if completed else [b"after-rollback"])
        await consumer.close()
    # the topic goes on: another split works
    target = after.active_segments[0].segment_id
    assert (await b.split_segment(TOPIC, target)).epoch == after.epoch + 1


async def test_a_producer_on_a_sealed_parent_is_told_to_reroute(broker, services):
    a = await services("a")
    await a.create_topic(TOPIC, 1)
    producer = await broker.create_producer("segment://public/default/orders/0000-ffff-0")
    await a.split_segment(TOPIC, 0)
    with pytest.raises(TopicTerminatedError):
        await producer.send(b"x", key="k")
    layout = await a.get_layout(TOPIC)
    child = layout.segment_for_key("k")
    assert child.hash_range.contains(key_hash("k")) and child.segment_id in (1, 2)


async def test_concurrent_operations_are_serialised_and_an_operation_record_blocks_others(services):
    a = await services("a")
    await a.create_topic(TOPIC, 4)
    results = await asyncio.gather(a.split_segment(TOPIC, 0), a.split_segment(TOPIC, 1),
                                   a.merge_segments(TOPIC, 2, 3), return_exceptions=True)
    assert not [r for r in results if isinstance(r, Exception)]
    layout = await a.get_layout(TOPIC)
    assert layout.epoch == 3 and len(layout.active_segments) == 5
    from pyengine.scalable.resources import PendingOperation
    name = scalable_topic_name(TOPIC)
    await a.resources.begin_operation(name, PendingOperation("split", (4,), 3, 3, layout.to_metadata()))
    with pytest.raises(BadVersionError, match="in progress"):
        await a.resources.begin_operation(name, PendingOperation("split", (4,), 3, 3, layout.to_metadata()))


def test_round_robin_matches_the_spec():
    from pyengine.scalable import SegmentLayout
    layout = SegmentLayout.initial(5)
    assert round_robin(layout, ["c", "a", "b"]) == {"a": [0, 3], "b": [1, 4], "c": [2]}
    assert round_robin(layout, []) == {}
    assert round_robin(layout, ["x"]) == {"x": [0, 1, 2, 3, 4]}


async def test_consumer_sessions_grace_period_rebalance_and_failover(services):
    a = await services("a", grace_period=0.3)
    b = await services("b", grace_period=0.3)
    await a.create_topic(TOPIC, 4)
    controller = await a.controller(TOPIC)
    await b.controller(TOPIC)
    pushed = {"c1": [], "c2": []}
    first = await controller.register_consumer("s", "c1", 1, pushed["c1"].append)
    assert first.segment_ids == [0, 1, 2, 3]
    second = await controller.register_consumer("s", "c2", 2, pushed["c2"].append)
    assert second.segment_ids == [1, 3] and pushed["c1"][-1].segment_ids == [0, 2]
    assert pushed["c2"] == []                                   # got it as the return value
    # a disconnect within the grace period changes nothing
    controller.consumer_disconnected("s", "c2")
    await asyncio.sleep(0.1)
    again = await controller.register_consumer("s", "c2", 3, pushed["c2"].append)
    assert again.segment_ids == [1, 3] and len(pushed["c1"]) == 1
    # a split rebalances and pushes the new epoch
    await controller.split_segment(0)
    assert pushed["c1"][-1].layout_epoch == 1
    assert sorted(pushed["c1"][-1].segment_ids + pushed["c2"][-1].segment_ids) == [1, 2, 3, 4, 5]
    assert all(s.topic.startswith("segment://public/default/orders/") for s in pushed["c2"][-1].assigned_segments)
    # past the grace period the consumer is evicted and the other takes everything
    controller.consumer_disconnected("s", "c2")
    await asyncio.sleep(0.6)
    assert pushed["c1"][-1].segment_ids == [4, 5, 1, 2, 3]
    assert [r.consumer_name for r in await a.resources.consumers(scalable_topic_name(TOPIC), "s")] == ["c1"]
    # failover: the new leader restores c1's session with a fresh grace period
    before = pushed["c1"][-1].segment_ids
    a.crash()
    new_leader = await b.leader(TOPIC, timeout=3)
    await new_leader.wait_leading(3)
    resumed = await new_leader.register_consumer("s", "c1", 9)
    assert resumed.segment_ids == before
    stats = await new_leader.stats()
    assert stats["subscriptions"]["s"]["consumers"][0]["connected"] is True


async def test_failover_evicts_consumers_that_do_not_come_back(services):
    a = await services("a", grace_period=0.3)
    b = await services("b", grace_period=0.3)
    await a.create_topic(TOPIC, 2)
    controller = await a.controller(TOPIC)
    await b.controller(TOPIC)
    await controller.register_consumer("s", "c1")
    await controller.register_consumer("s", "c2")
    a.crash()
    new_leader = await b.leader(TOPIC, timeout=3)
    await new_leader.wait_leading(3)
    await new_leader.register_consumer("s", "c1")          # c2 never returns
    await asyncio.sleep(0.6)
    records = await b.resources.consumers(scalable_topic_name(TOPIC), "s")
    assert [(r.consumer_name, r.segment_ids) for r in records] == [("c1", [0, 1])]


async def test_delete_subscription_removes_it_everywhere(broker, services):
    a = await services("a")
    await a.create_topic(TOPIC, 2)
    controller = await a.controller(TOPIC)
    assert await controller.create_subscription("s") is True
    assert await controller.create_subscription("s") is False
    await controller.register_consumer("s", "c")
    await controller.split_segment(0)
    await controller.delete_subscription("s")
    for topic in broker.service.list_topics():
        if topic.startswith("segment://public/default/orders/"):
            assert "s" not in (await broker.service.get_topic(topic)).subscriptions
    assert await a.resources.subscriptions(scalable_topic_name(TOPIC)) == []
    assert await a.resources.consumers(scalable_topic_name(TOPIC), "s") == []


async def test_children_wait_until_their_parent_is_drained(broker, services):
    """Per-key order across a split: the children are handed out only once the sealed parent's
    backlog on the subscription is acknowledged; until then the parent is assigned instead."""
    a = await services("a", session_ttl=5)
    await a.create_topic(TOPIC, 1)
    controller = await a.controller(TOPIC)
    pushed = {"c1": [], "c2": []}
    await controller.register_consumer("s", "c1", 1, pushed["c1"].append)
    await controller.register_consumer("s", "c2", 2, pushed["c2"].append)
    parent = "segment://public/default/orders/0000-ffff-0"
    producer = await broker.create_producer(parent)
    for i in range(3):
        await producer.send(f"m{i}".encode(), key=f"k{i}")
    await controller.split_segment(0)
    assert pushed["c1"][-1].segment_ids == [0] and pushed["c1"][-1].layout_epoch == 1    # the parent first
    assert pushed["c2"][-1].segment_ids == []
    consumer = await broker.subscribe(parent, "s", initial_position="earliest")
    for message in await drain(consumer):
        await consumer.acknowledge(message)
    await asyncio.sleep(0.4)                                    # the coordinator polls the backlog
    assert pushed["c1"][-1].segment_ids == [1] and pushed["c2"][-1].segment_ids == [2]
    await consumer.close()


async def test_a_new_leader_hands_out_children_the_old_one_held_back(broker, services):
    """The parent held back in place of its children and the children themselves are assigned
    at the same layout epoch: a new leader must still re-check the parent's backlog. Before, it
    rebalanced only on an epoch mismatch, so the consumer kept the sealed parent for good."""
    a = await services("a", grace_period=5)
    b = await services("b", grace_period=5)
    await a.create_topic(TOPIC, 1)
    controller = await a.controller(TOPIC)
    await b.controller(TOPIC)
    await controller.register_consumer("s", "c1")
    parent = "segment://public/default/orders/0000-ffff-0"
    producer = await broker.create_producer(parent)
    await producer.send(b"m", key="k")
    await controller.split_segment(0)
    a.crash()
    new_leader = await b.leader(TOPIC, timeout=3)
    await new_leader.wait_leading(3)
    pushed = []
    resumed = await new_leader.register_consumer("s", "c1", 1, pushed.append)
    assert resumed.segment_ids == [0] and resumed.layout_epoch == 1        # still held back
    consumer = await broker.subscribe(parent, "s", initial_position="earliest")
    for message in await drain(consumer):
        await consumer.acknowledge(message)
    await consumer.close()
    for _ in range(40):
        if pushed and pushed[-1].segment_ids == [1, 2]:
            break
        await asyncio.sleep(0.05)
    assert pushed and pushed[-1].segment_ids == [1, 2] and pushed[-1].layout_epoch == 1


async def test_a_new_leader_completes_a_rebalance_the_old_one_left_half_stored(services):
    """A leader killed between storing two consumers' records of one rebalance (same epoch)
    leaves segments 0 and 2 to no one (c1 gave them up, a0 was not stored: revokes are stored
    before grants): the new leader recomputes rather than trusting the records."""
    a = await services("a", grace_period=5)
    b = await services("b", grace_period=5)
    await a.create_topic(TOPIC, 4)
    controller = await a.controller(TOPIC)
    await b.controller(TOPIC)
    assert (await controller.register_consumer("s", "c1")).segment_ids == [0, 1, 2, 3]
    stored, killed, dead = asyncio.Event(), asyncio.Event(), asyncio.Event()
    save, delete = a.resources.save_consumer, a.resources.delete_consumer

    async def save_then_die(topic, subscription, record, **kwargs):
        if stored.is_set() or dead.is_set():    # the second write of the rebalance
            killed.set()
            await dead.wait()
            raise ConnectionError("the broker is dead")
        await save(topic, subscription, record, **kwargs)
        stored.set()

    async def delete_unless_dead(*args, **kwargs):
        if dead.is_set():
            raise ConnectionError("the broker is dead")
        await delete(*args, **kwargs)

    a.resources.save_consumer, a.resources.delete_consumer = save_then_die, delete_unless_dead
    joining = asyncio.ensure_future(controller.register_consumer("s", "a0"))
    await asyncio.wait_for(killed.wait(), 3)
    assert stored.is_set()
    a.crash()
    dead.set()                  # nothing of `a` reaches the store any more
    with pytest.raises(ConnectionError):
        await joining
    new_leader = await b.leader(TOPIC, timeout=3)
    await new_leader.wait_leading(3)
    first = await new_leader.register_consumer("s", "a0")
    second = await new_leader.register_consumer("s", "c1")
    assert sorted(first.segment_ids + second.segment_ids) == [0, 1, 2, 3]
    assert (first.segment_ids, second.segment_ids) == ([0, 2], [1, 3])


async def test_a_new_leader_takes_over_while_a_segment_broker_is_down(broker, services):
    """The recompute on take-over asks the segments' brokers for backlogs: one that is down
    neither fails the take-over nor stops the drain watch, and the children go out once it is
    back. Before, the take-over failed, and a failing drain check ended the watch for good."""
    from pyengine.errors import ServiceNotReadyError
    a = await services("a", grace_period=5)
    b = await services("b", grace_period=5)
    await a.create_topic(TOPIC, 1)
    controller = await a.controller(TOPIC)
    await b.controller(TOPIC)
    await controller.register_consumer("s", "c1")
    parent = "segment://public/default/orders/0000-ffff-0"
    producer = await broker.create_producer(parent)
    await producer.send(b"m", key="k")
    await controller.split_segment(0)
    down, failed = True, asyncio.Event()
    stats = b.segments.stats

    async def stats_unless_down(segment):
        if down:
            failed.set()
            raise ServiceNotReadyError("the segment's broker is down")
        return await stats(segment)

    b.segments.stats = stats_unless_down
    a.crash()
    new_leader = await b.leader(TOPIC, timeout=3)
    await new_leader.wait_leading(3)
    pushed = []
    resumed = await new_leader.register_consumer("s", "c1", 1, pushed.append)
    assert failed.is_set() and resumed.segment_ids == [0]          # the stored assignment
    await asyncio.sleep(0.5)                                      # the watch fails a few times
    down = False
    consumer = await broker.subscribe(parent, "s", initial_position="earliest")
    for message in await drain(consumer):
        await consumer.acknowledge(message)
    await consumer.close()
    for _ in range(100):
        if pushed and pushed[-1].segment_ids == [1, 2]:
            break
        await asyncio.sleep(0.05)
    assert pushed and pushed[-1].segment_ids == [1, 2]


async def test_a_take_over_that_fails_part_way_leaves_no_coordinator_behind(services):
    """The take-over is all or nothing. Before, the coordinators restored before a failing read
    stayed with their grace timers, and the retried take-over replaced them without closing
    them: their timers then evicted a session the new coordinators served, connected."""
    from pyengine.errors import PulsarError
    from pyengine.metadata import MetadataStoreError
    a = await services("a", grace_period=30)
    b = await services("b", grace_period=0.3)
    await a.create_topic(TOPIC, 2)
    controller = await a.controller(TOPIC)
    new_leader = await b.controller(TOPIC)
    await controller.register_consumer("s1", "c1")
    await controller.register_consumer("s2", "c2")
    failed = asyncio.Event()
    consumers = b.resources.consumers

    async def read_fails_once(topic, subscription):
        if subscription == "s2" and not failed.is_set():
            failed.set()                                # after s1 was restored
            raise MetadataStoreError("the metadata store is unreachable")
        return await consumers(topic, subscription)

    b.resources.consumers = read_fails_once
    a.crash()
    await asyncio.wait_for(failed.wait(), 3)
    await asyncio.sleep(0.05)                           # the take-over gives up
    assert not new_leader.subscriptions and not new_leader._leading
    pushed = []
    resumed = await new_leader.register_consumer("s1", "c1", 1, pushed.append)     # taken over again
    assert resumed.segment_ids == [0, 1]
    await asyncio.sleep(0.5)                            # past the first attempt's grace timers
    records = await b.resources.consumers(scalable_topic_name(TOPIC), "s1")
    assert [(r.consumer_name, r.segment_ids) for r in records] == [("c1", [0, 1])]
    assert new_leader.subscriptions["s1"].consumers["c1"].connected
    assert not any(isinstance(p, PulsarError) for p in pushed)
