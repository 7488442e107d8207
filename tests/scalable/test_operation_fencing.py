"""A deposed controller leader's steps that are already on their way (a terminate sent to the
segment's broker, a paused process) must not break what the new leader decided, and a deposed
leader must not clear an operation record that is not its own.

The rule (controller.py): before its first terminate the leader moves the operation record to
the *sealing* phase with a compare-and-set on the version it holds; a leader that takes over
claims the record the same way before it completes or rolls back, and rolls back only an
operation that never reached the sealing phase. A terminate is therefore only ever sent for an
operation that will be completed, so a late one is just a repeat."""

import asyncio

import pytest

from pyengine.scalable.controller import NotLeaderError
from pyengine.scalable.service import scalable_topic_name
from tests.scalable.conftest import TOPIC, Held


@pytest.fixture
def session_ttl() -> float:
    """Short: these tests wait for a crashed broker's session to expire."""
    return 0.5


PARENT = "segment://public/default/orders/0000-ffff-0"


async def check_consistent(broker, service):
    """Every active segment takes messages and has the subscription's cursor; no operation left."""
    layout = await service.get_layout(TOPIC)
    layout.check()
    assert await service.resources.pending_operation(scalable_topic_name(TOPIC)) is None
    for segment in layout.active_segments:
        name = segment.topic_name(TOPIC)
        assert not await service.segments.is_terminated(name), f"active segment {name} is sealed"
        assert "sub" in (await broker.service.get_topic(name, create=False)).subscriptions
        producer = await broker.create_producer(name)
        await producer.send(b"after")
        await producer.close()
    return layout


async def test_a_terminate_in_flight_from_a_deposed_leader_lands_after_the_take_over(broker, services):
    a = await services("a")
    a.segments = held = Held(a.segments, "terminate")
    b = await services("b")
    await a.create_topic(TOPIC, 1)
    leader = await a.controller(TOPIC)
    await b.controller(TOPIC)
    await leader.create_subscription("sub")

    split = asyncio.ensure_future(a.split_segment(TOPIC, 0))
    await asyncio.wait_for(held.sent.wait(), 5)       # a checked it leads and sent the terminate
    a._session.abandon()                              # then a's session expires: b takes over
    follower = await b.controller(TOPIC)
    await follower.wait_leading(timeout=5)            # b completed or rolled the split back
    held.land.set()                                   # only now does a's terminate land
    try:
        await split
    except NotLeaderError:
        pass
    await asyncio.sleep(0.05)

    layout = await check_consistent(broker, b)
    assert (await b.split_segment(TOPIC, layout.active_segments[0].segment_id)).epoch == layout.epoch + 1
    await check_consistent(broker, b)


def pause(obj, method, *, unguarded=False):
    """Hold `obj.method` before it runs: `entered` is set when called, it runs once `go` is set
    and `done` is set when it returned or raised. `unguarded`: its write is not guarded by the
    leader's election record (a broker of a version before the guard)."""
    original = getattr(obj, method)
    gate = {"entered": asyncio.Event(), "go": asyncio.Event(), "done": asyncio.Event(), "calls": 0}

    async def paused(*args, **kwargs):
        gate["calls"] += 1
        if unguarded:
            kwargs.pop("guard", None)
        if gate["calls"] > 1:
            return await original(*args, **kwargs)
        gate["entered"].set()
        await gate["go"].wait()
        try:
            return await original(*args, **kwargs)
        finally:
            gate["done"].set()
    setattr(obj, method, paused)
    return gate


async def started_split(broker, services):
    a = await services("a")
    a.segments = held = Held(a.segments, "terminate")
    held.land.set()
    b = await services("b")
    await a.create_topic(TOPIC, 1)
    leader = await a.controller(TOPIC)
    await b.controller(TOPIC)
    await leader.create_subscription("sub")
    return a, b, held


async def test_a_deposed_leader_paused_before_sealing_sends_no_terminate(broker, services):
    a, b, held = await started_split(broker, services)
    seal = pause(a.resources, "advance_operation")
    split = asyncio.ensure_future(a.split_segment(TOPIC, 0))
    await asyncio.wait_for(seal["entered"].wait(), 5)     # a checked it leads, about to seal
    a._session.abandon()
    follower = await b.controller(TOPIC)
    await follower.wait_leading(timeout=5)                # b claimed the split and rolled it back
    layout = await b.get_layout(TOPIC)
    assert layout.epoch == 0 and await b.resources.pending_operation(scalable_topic_name(TOPIC)) is None
    seal["go"].set()                                      # a wakes up: its seal must fail
    with pytest.raises(NotLeaderError):
        await split
    assert not held.sent.is_set()                         # ... and it sent no terminate
    layout = await check_consistent(broker, b)
    assert layout.epoch == 0 and layout.segment(0).is_active
    assert (await b.split_segment(TOPIC, 0)).epoch == 1
    await check_consistent(broker, b)


async def test_a_deposed_leader_cannot_seal_between_the_new_leaders_read_and_claim(broker, services):
    """b reads the record (preparing), a's seal comes next: refused, its election record is b's
    now (the guard of every leader write). b's claim goes through and b rolls back."""
    a, b, held = await started_split(broker, services)
    seal = pause(a.resources, "advance_operation")
    split = asyncio.ensure_future(a.split_segment(TOPIC, 0))
    await asyncio.wait_for(seal["entered"].wait(), 5)
    claim = pause(b.resources, "advance_operation")
    a._session.abandon()
    follower_task = asyncio.ensure_future(b.controller(TOPIC))
    await asyncio.wait_for(claim["entered"].wait(), 5)    # b read "preparing" and is about to claim
    seal["go"].set()
    await seal["done"].wait()
    with pytest.raises(NotLeaderError):                   # a's seal was refused: it stepped down
        await split
    claim["go"].set()
    follower = await follower_task
    await follower.wait_leading(timeout=5)
    assert not held.sent.is_set()                         # a sent no terminate
    layout = await check_consistent(broker, b)
    assert layout.epoch == 0 and layout.segment(0).is_active
    assert claim["calls"] == 1                            # b's claim went through


async def test_an_unguarded_deposed_leader_sealing_between_the_new_leaders_read_and_claim(broker, services):
    """As a broker of a version before the guard would: b reads the record (preparing), a seals
    it, b's claim fails: b reads again and completes."""
    a, b, held = await started_split(broker, services)
    seal = pause(a.resources, "advance_operation", unguarded=True)
    split = asyncio.ensure_future(a.split_segment(TOPIC, 0))
    await asyncio.wait_for(seal["entered"].wait(), 5)
    claim = pause(b.resources, "advance_operation")
    a._session.abandon()
    follower_task = asyncio.ensure_future(b.controller(TOPIC))
    await asyncio.wait_for(claim["entered"].wait(), 5)    # b read "preparing" and is about to claim
    seal["go"].set()
    await seal["done"].wait()                             # a sealed first
    claim["go"].set()                                     # b's claim fails: b must complete
    follower = await follower_task
    await follower.wait_leading(timeout=5)
    try:
        await split
    except NotLeaderError:
        pass
    layout = await check_consistent(broker, b)
    assert layout.epoch == 1 and not layout.segment(0).is_active
    assert await b.segments.is_terminated(PARENT)
    assert claim["calls"] == 2                           # the failed claim, then its own seal


async def test_a_deposed_leader_does_not_clear_a_newer_operation(broker, services):
    """a applied its split and is paused before clearing the record; b takes over, finishes it
    and starts another split; a's clearing must leave b's record alone."""
    state: dict = {}
    b_paused, b_go = asyncio.Event(), asyncio.Event()

    async def a_fault(step):
        if step != "notify" or state.get("deposed"):
            return
        state["deposed"] = True
        a._session.abandon()
        follower = await b.controller(TOPIC)
        await follower.wait_leading(timeout=5)            # b finished a's split (cleared its record)
        state["second"] = asyncio.ensure_future(b.split_segment(TOPIC, 1))
        await asyncio.wait_for(b_paused.wait(), 5)        # b's split is in progress

    async def b_fault(step):
        if step == "create" and not b_paused.is_set():
            b_paused.set()
            await b_go.wait()

    a = await services("a", fault=a_fault)
    b = await services("b", fault=b_fault)
    await a.create_topic(TOPIC, 1)
    leader = await a.controller(TOPIC)
    await b.controller(TOPIC)
    await leader.create_subscription("sub")
    with pytest.raises(NotLeaderError):                   # a ends with its end_operation: refused,
        await a.split_segment(TOPIC, 0)                   # b's election record guards writes now
    pending = await b.resources.pending_operation(scalable_topic_name(TOPIC))
    assert pending is not None and pending.kind == "split" and pending.parent_ids == (1,)
    b_go.set()
    assert (await state["second"]).epoch == 2
    layout = await check_consistent(broker, b)
    assert sorted(s.segment_id for s in layout.active_segments) == [2, 3, 4]


async def test_the_operation_record_is_only_changed_by_its_holder(services):
    from pyengine.metadata import BadVersionError
    from pyengine.scalable.resources import ROLLING_BACK, SEALING, PendingOperation

    a = await services("a")
    layout = await a.create_topic(TOPIC, 1)
    name = scalable_topic_name(TOPIC)
    resources = a.resources
    split = PendingOperation("split", (0,), 0, 0, layout.split_segment(0).to_metadata())
    first = await resources.begin_operation(name, split)
    assert (await resources.pending_operation(name)) == first and first.version >= 0
    with pytest.raises(BadVersionError, match="in progress"):
        await resources.begin_operation(name, split)
    sealed = await resources.advance_operation(name, first, SEALING)
    assert sealed.phase == SEALING and sealed.version > first.version
    with pytest.raises(BadVersionError):                       # the stale holder is fenced off
        await resources.advance_operation(name, first, ROLLING_BACK)
    assert not await resources.end_operation(name, first)     # ... and cannot clear it
    assert await resources.pending_operation(name) == sealed
    assert await resources.end_operation(name, sealed)
    assert await resources.pending_operation(name) is None
    # the record is cleared, not deleted: a new operation's versions never repeat an old one's
    second = await resources.begin_operation(name, split)
    assert second.version > sealed.version
    assert not await resources.end_operation(name, sealed)
    assert await resources.pending_operation(name) == second


async def test_a_record_without_a_phase_and_a_sealed_parent_is_completed(broker, services):
    """A record written before phases existed: a sealed parent still means forward."""
    import json

    from pyengine.scalable.resources import ScalableTopicResources

    a = await services("a")
    layout = await a.create_topic(TOPIC, 1)
    name = scalable_topic_name(TOPIC)
    target = layout.split_segment(0)
    await a.store.put(ScalableTopicResources.operation_path(name), json.dumps(
        {"kind": "split", "parentIds": [0], "baseEpoch": 0, "baseVersion": 0,
         "target": target.to_metadata()}).encode())
    await a.segments.terminate(PARENT)
    controller = await a.controller(TOPIC)
    await controller.wait_leading(timeout=5)
    after = await a.get_layout(TOPIC)
    assert after.epoch == 1 and not after.segment(0).is_active
    assert await a.resources.pending_operation(name) is None
