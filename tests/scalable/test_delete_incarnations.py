"""A delete of a scalable topic acts only on the incarnation it found first (layout.py): one that
paused while the topic was deleted and created again under the same name must leave the new
topic, its records and its segments alone (resources.py, the deleting marker), while a delete
that crashed midway is completed by the next one."""

import asyncio

import pytest

from pyengine.scalable.layout import SegmentLayout
from pyengine.scalable.resources import ScalableTopicNotFoundError
from pyengine.scalable.segments import SegmentFencedError
from pyengine.scalable.service import scalable_topic_name
from tests.scalable.conftest import TOPIC, Held
from tests.scalable.test_child_segment_fencing import CHILD

PARENT = "segment://public/default/orders/0000-ffff-0"
NAME = scalable_topic_name(TOPIC)


def segment_topics(broker):
    return sorted(t for t in broker.service.list_topics() if t.startswith("segment://"))


async def recreated_meanwhile(broker, a):
    """The topic is deleted and created again (with a subscription) while a delete is paused."""
    await a.delete_topic(TOPIC)
    assert segment_topics(broker) == []
    new = await a.create_topic(TOPIC, 1)
    await (await a.leader(TOPIC, timeout=5)).create_subscription("new-sub")
    return new


async def check_intact(broker, a, new):
    """The re-created topic, its records and its segment survived, and it is not being deleted."""
    assert (await a.get_layout(TOPIC)).incarnation == new.incarnation
    assert await a.resources.subscriptions(NAME) == ["new-sub"]
    assert not await a.resources.is_deleting(NAME)
    assert "new-sub" in (await broker.service.get_topic(PARENT, create=False)).subscriptions
    await a.split_segment(TOPIC, 0)                      # its children are created: not fenced as deleted
    assert broker.service.topic_exists(CHILD)


async def test_a_delete_paused_before_marking_leaves_the_new_incarnation_alone(broker, services):
    a = await services("a")
    late = await services("late")
    await a.create_topic(TOPIC, 1)
    late.resources = held = Held(late.resources, "mark_deleting")
    deleting = asyncio.ensure_future(late.delete_topic(TOPIC))
    await asyncio.wait_for(held.sent.wait(), 5)          # it loaded the old topic, not marked it yet
    new = await recreated_meanwhile(broker, a)
    held.land.set()
    (outcome,) = await asyncio.gather(deleting, return_exceptions=True)
    await check_intact(broker, a, new)
    assert isinstance(outcome, ScalableTopicNotFoundError)       # the topic it was asked to delete is gone


async def test_a_delete_paused_before_its_segment_deletes_leaves_the_new_incarnation_alone(broker, services):
    a = await services("a")
    late = await services("late")
    await a.create_topic(TOPIC, 1)
    late.segments = held = Held(late.segments, "delete")
    deleting = asyncio.ensure_future(late.delete_topic(TOPIC))
    await asyncio.wait_for(held.sent.wait(), 5)          # it marked the old topic, sent its segment's delete
    new = await recreated_meanwhile(broker, a)
    held.land.set()                                      # the delete of segment 0 lands: the new one's name
    (outcome,) = await asyncio.gather(deleting, return_exceptions=True)
    await check_intact(broker, a, new)
    assert isinstance(outcome, ScalableTopicNotFoundError)


async def test_a_late_mark_does_not_take_over_the_new_incarnations_deletion(broker, services, store):
    a = await services("a")
    late = await services("late")
    deleter = await services("deleter")
    await a.create_topic(TOPIC, 1)
    late.resources.store = held = Held(store, "put")
    deleting = asyncio.ensure_future(late.delete_topic(TOPIC))
    await asyncio.wait_for(held.sent.wait(), 5)          # it read the marker, checked the old layout
    await recreated_meanwhile(broker, a)
    deleter.segments = sending = Held(deleter.segments, "delete")
    deleting_new = asyncio.ensure_future(deleter.delete_topic(TOPIC))
    await asyncio.wait_for(sending.sent.wait(), 5)       # the new topic is marked, its segment delete sent
    held.land.set()                                      # only now does the late marker land
    (outcome,) = await asyncio.gather(deleting, return_exceptions=True)
    sending.land.set()
    await deleting_new
    # the new topic's deletion was not unmarked: its segment went with it
    assert segment_topics(broker) == [] and not await a.resources.exists(NAME)
    assert isinstance(outcome, ScalableTopicNotFoundError)


async def test_a_late_delete_of_a_topic_stored_before_incarnations_leaves_the_new_one_alone(broker, services):
    a = await services("a")
    late = await services("late")
    stored = SegmentLayout.initial(1).to_metadata()
    del stored["incarnation"]                            # as written before the field existed
    await a.resources.create(NAME, SegmentLayout.from_metadata(stored))
    await a.segments.create(PARENT, [])
    late.resources = held = Held(late.resources, "mark_deleting")
    deleting = asyncio.ensure_future(late.delete_topic(TOPIC))
    await asyncio.wait_for(held.sent.wait(), 5)
    # a delete of the old topic completes: its segment goes, a late create of it is refused
    await a.delete_topic(TOPIC)
    assert segment_topics(broker) == [] and not await a.resources.exists(NAME)
    with pytest.raises(SegmentFencedError, match="deleted"):
        await a.segments.create(PARENT, [])
    new = await a.create_topic(TOPIC, 1)
    await (await a.leader(TOPIC, timeout=5)).create_subscription("new-sub")
    held.land.set()
    (outcome,) = await asyncio.gather(deleting, return_exceptions=True)
    await check_intact(broker, a, new)
    assert isinstance(outcome, ScalableTopicNotFoundError)


async def test_a_delete_crashed_midway_is_completed_by_the_next_one(broker, services):
    a = await services("a")
    crashed = await services("crashed")
    await a.create_topic(TOPIC, 2)
    await (await a.leader(TOPIC, timeout=5)).create_subscription("sub")
    crashed.segments = held = Held(crashed.segments, "delete")
    deleting = asyncio.ensure_future(crashed.delete_topic(TOPIC))
    await asyncio.wait_for(held.sent.wait(), 5)          # marked, then it stops for good
    deleting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await deleting
    assert await a.resources.is_deleting(NAME) and len(segment_topics(broker)) == 2

    await a.delete_topic(TOPIC)                          # the retry
    assert segment_topics(broker) == [] and not await a.resources.exists(NAME)
    assert await a.resources.subscriptions(NAME) == []
    with pytest.raises(SegmentFencedError, match="deleted"):
        await a.segments.create("segment://public/default/orders/0000-7fff-0", [])
    with pytest.raises(ScalableTopicNotFoundError):
        await a.delete_topic(TOPIC)
    # the name is used again: the previous incarnation's marker does not hold the new topic
    new = await a.create_topic(TOPIC, 1)
    await (await a.leader(TOPIC, timeout=5)).create_subscription("new-sub")
    await check_intact(broker, a, new)


async def test_a_marker_written_before_markers_named_the_incarnation_still_marks(broker, services, store):
    a = await services("a")
    await a.create_topic(TOPIC, 1)
    await store.put(a.resources.deleting_path(NAME), b"")        # an older broker's delete, stopped midway
    assert await a.resources.is_deleting(NAME)
    await a.delete_topic(TOPIC)                          # completed by this one
    assert segment_topics(broker) == [] and not await a.resources.exists(NAME)
    await store.put(a.resources.deleting_path(NAME), b"")        # the tombstone an older broker leaves
    with pytest.raises(SegmentFencedError, match="deleted"):
        await a.segments.create(PARENT, [])
    new = await a.create_topic(TOPIC, 1)                 # clears it
    await (await a.leader(TOPIC, timeout=5)).create_subscription("new-sub")
    await check_intact(broker, a, new)


async def test_a_delete_paused_before_removing_the_records_leaves_the_new_incarnations_records(
        broker, services, store):
    a = await services("a")
    late = await services("late")
    await a.create_topic(TOPIC, 1)
    await (await a.leader(TOPIC, timeout=5)).create_subscription("old-sub")
    late.resources.store = held = Held(store, "delete_recursive", first_only=True)
    deleting = asyncio.ensure_future(late.delete_topic(TOPIC))
    await asyncio.wait_for(held.sent.wait(), 5)          # it read the old layout and its child records
    new = await recreated_meanwhile(broker, a)
    held.land.set()                                      # its record deletes land on the new topic's paths
    (outcome,) = await asyncio.gather(deleting, return_exceptions=True)
    await check_intact(broker, a, new)
    assert isinstance(outcome, ScalableTopicNotFoundError)
