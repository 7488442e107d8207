"""Deleting a scalable topic's subscription marks its record first, under the leader's guard,
and deletes the segments' cursors only after that.

Before, the controller deleted every segment's cursor and only then the record, guarded: a
leader deposed without noticing (a paused process) deleted the cursors of a subscription that
the new leader still served — its consumers then read from wherever a new cursor starts — and
only the last write was refused. And a deletion cut short between the two (a crash, a segment's
broker unreachable) left a listed subscription with some of its cursors gone, which the next
consumer resurrected as it was."""

import pytest

from pyengine.errors import ServiceNotReadyError, SubscriptionNotFoundError
from pyengine.scalable.controller import NotLeaderError
from pyengine.scalable.service import scalable_topic_name
from tests.scalable.conftest import TOPIC
from tests.scalable.test_deposed_leader_writes_nothing import deposed_unnoticed

NAME = scalable_topic_name(TOPIC)


async def cursors(broker, layout, subscription="s") -> list[int]:
    """The ids of the segments (of `layout`) that have a cursor of `subscription`."""
    found = []
    for segment in layout.all_segments.values():
        topic = await broker.service.get_topic(segment.topic_name(TOPIC), create=False)
        if subscription in topic.subscriptions:
            found.append(segment.segment_id)
    return sorted(found)


class DeleteFailsOnce:
    """Segment operations whose `delete_subscription` fails for the `nth` call (a segment's
    broker unreachable), once."""

    def __init__(self, inner, nth: int):
        self.inner, self.nth, self.calls = inner, nth, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def delete_subscription(self, segment: str, subscription: str) -> None:
        self.calls += 1
        if self.calls == self.nth:
            raise ServiceNotReadyError(f"{segment}: its broker does not answer")
        await self.inner.delete_subscription(segment, subscription)


async def test_a_deposed_leader_deletes_no_cursor(broker, store, services):
    a, b, old, new, pushed = await deposed_unnoticed(store, services)
    layout = await b.get_layout(TOPIC)
    assert await cursors(broker, layout) == [0]
    with pytest.raises(NotLeaderError):
        await old.delete_subscription("s")
    assert await cursors(broker, layout) == [0]             # refused before any cursor went
    assert await b.resources.subscription_states(NAME) == {"s": False}
    assert not old.subscriptions                             # it stepped down
    await new.delete_subscription("s")                      # the leader's deletion goes
    assert await cursors(broker, layout) == []
    assert await b.resources.subscription_states(NAME) == {}


async def half_deleted(broker, services):
    """`a` leads a topic of two segments with subscription "s" (consumer c1); its deletion
    deleted the first segment's cursor and failed on the second."""
    a = await services("a", grace_period=30)
    await a.create_topic(TOPIC, 2)
    controller = await a.controller(TOPIC)
    await controller.register_consumer("s", "c1", 1)
    layout = await a.get_layout(TOPIC)
    assert await cursors(broker, layout) == [0, 1]
    controller.segments = DeleteFailsOnce(controller.segments, nth=2)
    with pytest.raises(ServiceNotReadyError):
        await controller.delete_subscription("s")
    assert await cursors(broker, layout) == [1]
    assert await a.resources.subscription_states(NAME) == {"s": True}
    assert await a.resources.subscriptions(NAME) == []      # listed by no one
    return a, controller, layout


async def test_a_deletion_cut_short_is_finished_by_the_next_delete(broker, services):
    a, controller, layout = await half_deleted(broker, services)
    await controller.delete_subscription("s")
    assert await cursors(broker, layout) == []
    assert await a.resources.subscription_states(NAME) == {}
    with pytest.raises(SubscriptionNotFoundError):
        await controller.delete_subscription("s")


async def test_a_deletion_cut_short_is_finished_by_the_next_leader(broker, services):
    a, controller, layout = await half_deleted(broker, services)
    b = await services("b", grace_period=30)
    new = await b.controller(TOPIC)
    await a.close()
    await new.wait_leading(timeout=5)
    assert await cursors(broker, layout) == []
    assert await b.resources.subscription_states(NAME) == {}
    assert "s" not in new.subscriptions


async def test_subscribing_again_to_a_half_deleted_subscription_makes_a_new_one(broker, services):
    """The old deletion is finished first: every segment's cursor starts anew (at Earliest),
    not only the one the deletion had reached."""
    a, controller, layout = await half_deleted(broker, services)
    segment = await broker.service.get_topic(layout.segment(1).topic_name(TOPIC), create=False)
    old_cursor = segment.subscriptions["s"]
    assignment = await controller.register_consumer("s", "c2", 2)
    assert sorted(assignment.segment_ids) == [0, 1]
    assert await cursors(broker, layout) == [0, 1]
    assert segment.subscriptions["s"] is not old_cursor     # deleted, then made again
    assert await a.resources.subscription_states(NAME) == {"s": False}
    assert [r.consumer_name for r in await a.resources.consumers(NAME, "s")] == ["c2"]   # c1 went with it


async def test_a_split_gives_its_children_no_cursor_of_a_subscription_being_deleted(broker, services):
    a, controller, layout = await half_deleted(broker, services)
    after = await controller.split_segment(1)                # the parent still has the cursor
    children = [s for s in after.active_segments if s.segment_id not in (0, 1)]
    assert len(children) == 2
    assert await cursors(broker, after) == [1]
    await controller.delete_subscription("s")
    assert await cursors(broker, after) == []


async def test_a_record_that_is_not_json_is_a_live_subscription(store, services):
    a = await services("a")
    await a.create_topic(TOPIC, 1)
    await store.put(a.resources.subscription_path(NAME, "legacy"), b"\xff not json")
    await store.put(a.resources.subscription_path(NAME, "list"), b"[1, 2]")
    assert await a.resources.subscription_states(NAME) == {"legacy": False, "list": False}
    assert await a.resources.create_subscription(NAME, "legacy") is False


async def test_marking_again_is_a_guarded_write_too(store, services):
    """A retried deletion finds the record marked already: the mark is written again under the
    leader's guard, so a deposed leader's retry is refused before it touches a cursor."""
    from pyengine.metadata import GuardFailedError

    a = await services("a")
    await a.create_topic(TOPIC, 1)
    controller = await a.controller(TOPIC)
    await controller.create_subscription("s")
    guard = controller._leadership()
    assert await a.resources.mark_subscription_deleting(NAME, "s", guard=guard) is True
    stale = (guard[0], guard[1] + 1000)             # an election record that is not the store's
    with pytest.raises(GuardFailedError):
        await a.resources.mark_subscription_deleting(NAME, "s", guard=stale)
    assert await a.resources.mark_subscription_deleting(NAME, "s", guard=guard) is True
    assert await a.resources.mark_subscription_deleting(NAME, "gone", guard=guard) is False
    assert await a.resources.subscription_states(NAME) == {"s": True}
