"""A deposed controller leader's create or delete of a child segment that lands late at the
segment's broker must leave the layout and the segments as the new leader decided.

Only the parents' terminate was fenced (by the sealing phase of the operation record). Now the
segment's broker acts on the decision in the metadata store: it creates a segment only while
the layout or the operation in progress (not rolling back) keeps it, and deletes one only while
neither does (segments.py, LocalSegments)."""

import asyncio

import pytest

from pyengine.errors import PulsarError
from pyengine.scalable.controller import NotLeaderError
from pyengine.scalable.service import scalable_topic_name
from tests.scalable.conftest import TOPIC, Held
from tests.scalable.test_operation_fencing import check_consistent


@pytest.fixture
def session_ttl() -> float:
    """Short: these tests wait for a crashed broker's session to expire."""
    return 0.5


CHILD = "segment://public/default/orders/0000-7fff-1"


async def deposed(a, b):
    """A's session expires: B takes over (and completes or rolls back what A was doing)."""
    a._session.abandon()
    follower = await b.controller(TOPIC)
    await follower.wait_leading(timeout=5)
    return follower


async def test_a_late_create_of_a_rolled_back_split_leaves_no_child(broker, services):
    a = await services("a")
    b = await services("b")
    await a.create_topic(TOPIC, 1)
    leader = await a.controller(TOPIC)
    await b.controller(TOPIC)
    await leader.create_subscription("sub")
    leader.segments = held = Held(leader.segments, "create")

    split = asyncio.ensure_future(a.split_segment(TOPIC, 0))
    await asyncio.wait_for(held.sent.wait(), 5)          # A sent the create of child 1
    await deposed(a, b)                                  # B rolled the split back
    assert await b.resources.pending_operation(scalable_topic_name(TOPIC)) is None
    held.land.set()                                      # only now does A's create land
    with pytest.raises(NotLeaderError):
        await split
    assert not broker.service.topic_exists(CHILD)        # refused: no empty leftover child
    layout = await check_consistent(broker, b)
    assert layout.epoch == 0 and layout.segment(0).is_active
    assert (await b.split_segment(TOPIC, 0)).epoch == 1
    await check_consistent(broker, b)


async def test_a_late_delete_of_a_rolled_back_split_spares_the_retried_splits_child(broker, services):
    failed = asyncio.Event()

    async def fail_after_first_create(step):
        if step == "create" and not failed.is_set():
            failed.set()                                 # A rolls its split back itself
            raise PulsarError("the second child's broker is away")

    a = await services("a", fault=fail_after_first_create)
    b = await services("b")
    await a.create_topic(TOPIC, 1)
    leader = await a.controller(TOPIC)
    await b.controller(TOPIC)
    await leader.create_subscription("sub")
    leader.segments = held = Held(leader.segments, "delete")

    split = asyncio.ensure_future(a.split_segment(TOPIC, 0))
    await asyncio.wait_for(held.sent.wait(), 5)          # A claimed the rollback, sent the delete
    await deposed(a, b)                                  # B finished the rollback...
    assert (await b.split_segment(TOPIC, 0)).epoch == 1  # ... and split again: child 1 is live
    producer = await broker.create_producer(CHILD)
    await producer.send(b"in the child")
    held.land.set()                                      # only now does A's delete land
    with pytest.raises(PulsarError):
        await split
    assert broker.service.topic_exists(CHILD)            # refused: the live child stays
    layout = await check_consistent(broker, b)
    assert layout.epoch == 1 and layout.segment(1).is_active
    await producer.send(b"still")
    await producer.close()


async def test_topic_deletion_deletes_the_segments_the_layout_keeps(broker, services):
    a = await services("a")
    await a.create_topic(TOPIC, 1)
    leader = await a.controller(TOPIC)
    await leader.create_subscription("sub")
    await a.split_segment(TOPIC, 0)
    await a.delete_topic(TOPIC)
    for segment in ("segment://public/default/orders/0000-ffff-0", CHILD,
                    "segment://public/default/orders/8000-ffff-2"):
        assert not broker.service.topic_exists(segment)
    # a segment the layout keeps is not deleted on request while the topic stays
    await a.create_topic(TOPIC, 1)
    with pytest.raises(PulsarError, match="not deleted"):
        await a.segments.delete("segment://public/default/orders/0000-ffff-0")
