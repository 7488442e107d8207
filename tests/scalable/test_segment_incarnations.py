"""A scalable topic deleted and created again under the same name starts its segment ids at 0
again, so its segments have the names of the old topic's. A late create of a segment sent for
the old topic (its incarnation) must not act on the new one: it carries the incarnation of the
layout it was sent for, and the segment's broker refuses it unless the current layout is of
that incarnation (segments.py, LocalSegments)."""

import asyncio

import pytest

from pyengine.errors import PulsarError
from pyengine.scalable.layout import SegmentLayout
from pyengine.scalable.segments import SegmentFencedError
from pyengine.scalable.service import scalable_topic_name
from tests.scalable.conftest import TOPIC, Held
from tests.scalable.test_child_segment_fencing import CHILD, deposed


@pytest.fixture
def session_ttl() -> float:
    """Short: these tests wait for a crashed broker's session to expire."""
    return 0.5


PARENT = "segment://public/default/orders/0000-ffff-0"


async def test_a_late_create_of_the_old_topic_leaves_the_new_topics_segment_alone(broker, services):
    a = await services("a")
    b = await services("b")
    await a.create_topic(TOPIC, 1)
    leader = await a.controller(TOPIC)
    await b.controller(TOPIC)
    await leader.create_subscription("old-sub")
    leader.segments = held = Held(leader.segments, "create")

    split = asyncio.ensure_future(a.split_segment(TOPIC, 0))
    await asyncio.wait_for(held.sent.wait(), 5)          # A sent the create of child 1 with "old-sub"
    await deposed(a, b)                                  # B rolled the split back...
    await b.delete_topic(TOPIC)                          # ... deleted the topic, created it again
    await b.create_topic(TOPIC, 1)
    await b.split_segment(TOPIC, 0)                      # the new topic's child 1: the same name
    assert "old-sub" not in (await broker.service.get_topic(CHILD, create=False)).subscriptions
    held.land.set()                                      # only now does A's create land
    with pytest.raises(PulsarError):
        await split
    # refused: the new topic's child has no cursor of the old topic's subscription
    assert "old-sub" not in (await broker.service.get_topic(CHILD, create=False)).subscriptions
    assert (await b.get_layout(TOPIC)).epoch == 1


async def test_a_late_create_of_a_deleted_topic_is_refused_by_its_incarnation(broker, services):
    a = await services("a")
    old = await a.create_topic(TOPIC, 1)
    await a.delete_topic(TOPIC)
    await a.create_topic(TOPIC, 1)
    await broker.service.delete_topic(PARENT)            # as if the new topic's create had not landed yet
    with pytest.raises(SegmentFencedError, match="incarnation"):
        await a.segments.create(PARENT, ["old-sub"], incarnation=old.incarnation)
    assert not broker.service.topic_exists(PARENT)
    await a.delete_topic(TOPIC)
    with pytest.raises(SegmentFencedError, match="incarnation"):     # no topic of that incarnation
        await a.segments.create(PARENT, [], incarnation=old.incarnation)
    assert not broker.service.topic_exists(PARENT)


async def test_a_topic_stored_before_incarnations_is_still_served(broker, services):
    a = await services("a")
    stored = SegmentLayout.initial(1).to_metadata()
    del stored["incarnation"]                            # as written before the field existed
    legacy = SegmentLayout.from_metadata(stored)
    assert legacy.incarnation is None and "incarnation" not in legacy.split_segment(0).to_metadata()
    await a.resources.create(scalable_topic_name(TOPIC), legacy)
    await a.segments.create(PARENT, [])                  # its creates carry no incarnation: not checked by one
    layout = await a.split_segment(TOPIC, 0)
    assert layout.incarnation is None and broker.service.topic_exists(CHILD)
