"""A controller leader deposed without noticing (a paused process: the store ended its session
and another broker's election record replaced its own, while its local view still says it
leads) must not write anything, not even a record that did not exist.

Before, its compare-and-sets refused only records it had read: it still created the record of a
consumer name new to it (create-if-absent: no version to compare), a subscription, and the
operation record of a split over the cleared one it had just read — after which it ran the whole
split under the new leader. Every write of the leader is now guarded by its election record
(controller.py), and a refused write makes it step down."""

import pytest

from pyengine.scalable.controller import NotLeaderError
from pyengine.scalable.service import scalable_topic_name
from tests.scalable.conftest import TOPIC

NAME = scalable_topic_name(TOPIC)


async def deposed_unnoticed(store, services):
    """`a` leads with consumers c1 and c2 of "s" (one segment: c1 reads it); then the store
    ends its session and `b` takes over, while `a` has not noticed."""
    a = await services("a", session_ttl=30, grace_period=30)
    b = await services("b", grace_period=30)
    await a.create_topic(TOPIC, 1)
    old, new = await a.controller(TOPIC), await b.controller(TOPIC)
    pushed: list = []
    await old.register_consumer("s", "c1", 1, pushed.append)
    await old.register_consumer("s", "c2", 2)
    old.election._task.cancel()                     # its election watch: the deletion not seen yet
    a._session.abandon()                            # nor a refresh that would report it
    await store._end_session(a._session.id, expired=False)
    await new.wait_leading(timeout=3)
    assert old.is_leader                            # still believes it leads
    assert (await store.get(new.election.path)).value == b"pulsar://b:6650"
    return a, b, old, new, pushed


async def consumers(service, subscription="s") -> dict[str, list[int]]:
    return {r.consumer_name: r.segment_ids for r in await service.resources.consumers(NAME, subscription)}


async def test_a_deposed_leader_does_not_create_the_record_of_a_new_consumer(store, services):
    """c3 takes no segment from c1 or c2 (one segment): its record is the only write."""
    a, b, old, new, pushed = await deposed_unnoticed(store, services)
    kept = await consumers(b)
    assert kept == {"c1": [0], "c2": []}
    with pytest.raises(NotLeaderError):
        await old.register_consumer("s", "c3", 3)
    assert await consumers(b) == kept               # refused: no record of c3
    assert not old.subscriptions                    # it stepped down ...
    assert isinstance(pushed[-1], NotLeaderError)   # ... sending its consumers to the leader
    with pytest.raises(NotLeaderError, match="pulsar://b:6650"):
        await old.register_consumer("s", "c3")      # and does not take over again
    assert await consumers(b) == kept
    assert (await new.register_consumer("s", "c3")).segment_ids == []
    assert await consumers(b) == {**kept, "c3": []}


async def test_a_deposed_leader_does_not_create_a_subscription(broker, store, services):
    a, b, old, new, pushed = await deposed_unnoticed(store, services)
    with pytest.raises(NotLeaderError):
        await old.create_subscription("audit")
    assert await b.resources.subscriptions(NAME) == ["s"]
    layout = await b.get_layout(TOPIC)
    segment = await broker.service.get_topic(layout.segment(0).topic_name(TOPIC), create=False)
    assert "audit" not in segment.subscriptions     # refused before any cursor was made
    assert not old.subscriptions


async def test_a_deposed_leader_does_not_split(store, services):
    a, b, old, new, pushed = await deposed_unnoticed(store, services)
    with pytest.raises(NotLeaderError):
        await old.split_segment(0)
    layout = await b.get_layout(TOPIC)
    assert layout.epoch == 0 and layout.segment(0).is_active
    assert await b.resources.pending_operation(NAME) is None
    assert not await b.segments.is_terminated(layout.segment(0).topic_name(TOPIC))
    assert not old.subscriptions
    assert (await b.split_segment(TOPIC, 0)).epoch == 1     # the leader's split goes
