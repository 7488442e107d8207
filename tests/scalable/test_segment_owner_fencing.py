"""A segment topic lives on the one broker its owner record names (segments.py). A create of a
child that reaches a broker late, after the owner record naming that broker was forgotten and
another broker claimed the child and made it, must not make a second copy of the segment there:
the segment's broker claims the owner record under its fence lock before it creates the topic,
and refuses when another broker holds it."""

import asyncio

import pytest

from pyengine.errors import PulsarError
from pyengine.naming import TopicName
from pyengine.scalable.segments import SegmentFencedError
from pyengine.scalable.service import scalable_topic_name
from tests.scalable.conftest import TOPIC, Held
from tests.scalable.test_child_segment_fencing import CHILD
from tests.scalable.test_segment_fencing_leftovers import two_brokers  # noqa: F401  (fixture)


async def test_a_late_create_at_a_broker_that_no_longer_owns_the_child_is_refused(two_brokers):  # noqa: F811
    store, a, b = two_brokers
    on_a = await a.scalable_topics()
    on_b = await b.scalable_topics()
    await on_a.create_topic(TOPIC, 1)                    # segment 0 on a: its children go there too
    leader = await on_a.controller(TOPIC)
    assert leader.is_leader
    await leader.create_subscription("sub")
    on_a.segments.local = held = Held(on_a.segments.local, "create", first_only=True)

    split = asyncio.ensure_future(on_a.split_segment(TOPIC, 0))
    await asyncio.wait_for(held.sent.wait(), 5)          # child 1 claimed for a, its create on its way
    child = TopicName.parse(CHILD)
    await on_b.resources.forget_owner(child)             # the record is forgotten...
    assert await on_b.segments.resources.claim_owner(child, b.service_url) == b.service_url
    await on_b.segments.local.create(CHILD, ["sub"])     # ... b claims the child and makes it
    held.land.set()                                      # only now does the create land at a
    with pytest.raises(PulsarError):
        await split
    assert not a.topic_exists(CHILD)                     # refused: no second copy on a
    # A rolled its split back: the child's delete went to its owner, b
    assert not b.topic_exists(CHILD) and await on_b.resources.owner(child) is None


async def test_a_create_at_a_broker_that_does_not_own_the_segment_names_its_owner(two_brokers):  # noqa: F811
    store, a, b = two_brokers
    on_a = await a.scalable_topics()
    on_b = await b.scalable_topics()
    await on_b.create_topic(TOPIC, 1)                    # segment 0 on b
    parent = "segment://public/default/orders/0000-ffff-0"
    await b.delete_topic(parent)                         # as if it were to be created again
    with pytest.raises(SegmentFencedError, match="owned by broker pulsar://b:6650"):
        await on_a.segments.local.create(parent, [])
    assert not a.topic_exists(parent)
    await on_a.segments.create(parent, [])               # routed to its owner instead
    assert b.topic_exists(parent) and not a.topic_exists(parent)


async def test_a_delete_at_a_broker_that_does_not_own_the_segment_keeps_the_owners_record(two_brokers):  # noqa: F811
    store, a, b = two_brokers
    on_a = await a.scalable_topics()
    on_b = await b.scalable_topics()
    layout = await on_b.create_topic(TOPIC, 1)           # segment 0 on b
    parent = "segment://public/default/orders/0000-ffff-0"
    await on_b.resources.mark_deleting(scalable_topic_name(TOPIC), layout.incarnation)    # its segments may go
    await on_a.segments.local.delete(parent)             # reaches a, which has no copy of it
    assert b.topic_exists(parent)
    assert await on_b.resources.owner(TopicName.parse(parent)) == b.service_url    # still found at b
    await on_a.segments.delete(parent)                   # routed to its owner
    assert not b.topic_exists(parent) and await on_b.resources.owner(TopicName.parse(parent)) is None
