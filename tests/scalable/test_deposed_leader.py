"""A controller leader deposed in the middle of a split (its metadata session expired: a long
GC pause, a partition from the store) while a follower takes over and rolls the split back.

The deposed leader must not carry on with the steps of an operation it no longer owns: sealing
the parent and writing a layout whose children the new leader has deleted leaves the topic
pointing at segment topics without subscription cursors (spec, Split Protocol: "all
subscription cursors exist before producers are redirected")."""

import asyncio

import pytest

from pyengine.scalable.controller import NotLeaderError
from pyengine.scalable.service import scalable_topic_name
from tests.scalable.conftest import TOPIC


@pytest.fixture
def session_ttl() -> float:
    """Short: these tests wait for a crashed broker's session to expire."""
    return 0.5


async def test_a_deposed_leader_does_not_finish_a_split_the_new_leader_rolled_back(broker, services):
    state: dict = {}

    async def depose_during_create(step):
        if step != "create" or state.get("deposed"):
            return
        state["deposed"] = True
        a._session.abandon()                              # a stops refreshing: its session expires
        follower = await b.controller(TOPIC)
        await follower.wait_leading(timeout=5)            # b took over: it rolled the split back
        assert await b.resources.pending_operation(scalable_topic_name(TOPIC)) is None

    a = await services("a", fault=depose_during_create)
    b = await services("b")
    await a.create_topic(TOPIC, 1)
    leader = await a.controller(TOPIC)
    await b.controller(TOPIC)
    await leader.create_subscription("sub")
    producer = await broker.create_producer("segment://public/default/orders/0000-ffff-0")
    await producer.send(b"before")

    with pytest.raises(NotLeaderError):
        await a.split_segment(TOPIC, 0)
    assert state["deposed"]

    layout = await b.get_layout(TOPIC)
    layout.check()
    assert layout.epoch == 0 and layout.segment(0).is_active
    parent = layout.segment(0).topic_name(TOPIC)
    assert not await b.segments.is_terminated(parent)     # the parent still takes messages
    await producer.send(b"after")
    # every active segment has the subscription's cursor (nothing written there is missed)
    for segment in layout.active_segments:
        topic = await broker.service.get_topic(segment.topic_name(TOPIC), create=False)
        assert "sub" in topic.subscriptions
    # the new leader can split: the topic goes on
    assert (await b.split_segment(TOPIC, 0)).epoch == 1
    await asyncio.sleep(0)


async def _deposed_unnoticed(store, services, num_segments):
    """`a` leads with consumers c1 and c2 of "s"; then the store ends its session (its election
    record goes, `b` takes over) while `a`, a paused process, has not noticed: its session still
    looks alive, its election view still says it leads, its coordinators still run."""
    a = await services("a", session_ttl=30, grace_period=0.2)
    b = await services("b", grace_period=30)
    await a.create_topic(TOPIC, num_segments)
    old, new = await a.controller(TOPIC), await b.controller(TOPIC)
    pushed: list = []
    await old.register_consumer("s", "c1", 1, pushed.append)
    await old.register_consumer("s", "c2", 2)
    old.election._task.cancel()                     # its election watch: the deletion not seen yet
    a._session.abandon()                            # nor a refresh that would report it
    await store._end_session(a._session.id, expired=False)
    await new.wait_leading(timeout=3)
    assert old.is_leader                            # still believes it leads
    return a, b, old, new, pushed


async def stored(service) -> dict[str, list[int]]:
    return {r.consumer_name: r.segment_ids for r in await service.resources.consumers(scalable_topic_name(TOPIC), "s")}


async def test_a_deposed_leaders_grace_timer_does_not_evict_the_new_leaders_session(store, services):
    """Before, its eviction deleted c2's record under the new leader (which still serves c2's
    session) and pushed c1 every segment at the same layout epoch as the new leader's."""
    a, b, old, new, pushed = await _deposed_unnoticed(store, services, 2)
    kept = await stored(b)
    assert kept == {"c1": [0], "c2": [1]}
    old.consumer_disconnected("s", "c2")            # its connection to `a` drops: a grace timer there
    await asyncio.sleep(0.5)
    assert await stored(b) == kept                  # the delete was refused
    assert isinstance(pushed[-1], NotLeaderError)   # c1 is sent to the leader, not given segment 1
    assert not any(getattr(p, "segment_ids", None) == [0, 1] for p in pushed)
    assert not old.subscriptions                    # it stepped down, and does not take over again
    with pytest.raises(NotLeaderError, match="pulsar://b:6650"):
        await old.register_consumer("s", "c3")
    assert new.is_leader and (await new.register_consumer("s", "c2")).segment_ids == [1]


async def test_a_deposed_leaders_rebalance_does_not_overwrite_the_new_leaders_records(store, services):
    """Before, registering c3 on the deposed leader rewrote c1's record (taking segment 2 from
    it under the new leader) and created c3's, which the new leader knew nothing of."""
    a, b, old, new, pushed = await _deposed_unnoticed(store, services, 3)
    kept = await stored(b)
    assert kept == {"c1": [0, 2], "c2": [1]}
    with pytest.raises(NotLeaderError):
        await old.register_consumer("s", "c3", 3)
    assert await stored(b) == kept
    assert isinstance(pushed[-1], NotLeaderError)
    assert not any(getattr(p, "segment_ids", None) == [0] for p in pushed)
    assert new.is_leader and (await new.register_consumer("s", "c1")).segment_ids == [0, 2]
