"""Review findings of the server side of scalable topics (PIP-468): layout, coordinator,
controller, DAG watch sessions."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.scalable.layout import LayoutError, SegmentLayout
from pyengine.scalable.resources import ScalableTopicNotFoundError
from pyengine.scalable.service import scalable_topic_name
from pyengine.scalable.watch import DagWatchSession

T = "topic://public/default/server-review"


async def test_a_watch_whose_topic_was_deleted_and_created_again_before_its_reread_ends(services):
    """A DAG watch session re-reads the layout after a notification and pushes it only when its
    epoch (or the leader) changed. A topic deleted and created again before that re-read (of
    another shape, its epoch again 0) went unnoticed: the session lived on and its client kept
    the deleted topic's DAG. It now ends, as it does when the re-read finds no topic."""
    service = await services("a")
    await service.create_topic(T, 1)
    updates, errors = [], []
    session = DagWatchSession(service.resources, scalable_topic_name(T),
                              lambda layout, url, brokers: updates.append(layout), errors.append)
    await session.start()
    refresh, reread = session._refresh, asyncio.Event()

    async def late_refresh():
        await reread.wait()                 # a slow store: the re-read comes after the re-creation
        return await refresh()
    session._refresh = late_refresh
    await service.delete_topic(T)
    await service.create_topic(T, 4)
    reread.set()
    for _ in range(100):
        if errors:
            break
        await asyncio.sleep(0.01)
    assert len(updates) == 1 and len(errors) == 1 and isinstance(errors[0], ScalableTopicNotFoundError)
    assert session.ended
    session.close()


def _segment(sid, state, parents=(), children=(), created=0, sealed=0, start=0, end=0xFFFF):
    return {"segmentId": sid, "hashRange": {"start": start, "end": end}, "state": state,
            "parentIds": list(parents), "childIds": list(children), "createdAtEpoch": created,
            "sealedAtEpoch": sealed}


def test_a_layout_whose_parent_links_form_a_cycle_is_refused():
    """from_metadata checked that links point both ways, not that they go from older segments
    to newer ones: two sealed segments naming each other as parent and child were accepted,
    and lineage() (and the coordinator's drain gate, walking up from an active child) then
    recursed until RecursionError instead of the metadata being refused with a LayoutError."""
    raw = {"epoch": 2, "nextSegmentId": 4, "segments": {
        "1": _segment(1, "SEALED", parents=[2], children=[2, 3], sealed=1),
        "2": _segment(2, "SEALED", parents=[1], children=[1], sealed=1),
        "3": _segment(3, "ACTIVE", parents=[1], created=1)}}
    with pytest.raises(LayoutError, match="parent 2"):
        SegmentLayout.from_metadata(raw)
    # a parent listed by itself is refused too
    raw = {"epoch": 1, "nextSegmentId": 2, "segments": {
        "0": _segment(0, "ACTIVE"), "1": _segment(1, "SEALED", parents=[1], children=[1], sealed=1)}}
    with pytest.raises(LayoutError):
        SegmentLayout.from_metadata(raw)


async def test_a_stats_read_landing_after_a_split_does_not_roll_the_leaders_layout_back(broker, services):
    """The controller's `get_layout` (used by `stats`, outside the controller's lock) stored
    what it read as the leader's layout. A read issued before a split's compare-and-set and
    answered after it put the pre-split layout back, and the next subscription was then created
    on the sealed parent and not on the children: its consumers never saw the messages written
    to them. A read no longer replaces a newer layout."""
    service = await services("a")
    await service.create_topic(T, 1)
    controller = await service.controller(T)
    load, stale_read, split_done = service.resources.load, asyncio.Event(), asyncio.Event()

    async def slow_load(topic):
        result = await load(topic)
        if not stale_read.is_set():
            stale_read.set()
            await split_done.wait()             # answered only once the split is done
        return result
    service.resources.load = slow_load
    reading = asyncio.ensure_future(controller.get_layout())
    await stale_read.wait()
    service.resources.load = load
    layout = await service.split_segment(T, 0)
    split_done.set()
    assert (await reading).epoch == 0           # the read itself answers what it read
    assert controller.layout.epoch == layout.epoch == 1
    await controller.create_subscription("late")
    for child in layout.active_segments:
        topic = await broker.service.get_topic(child.topic_name(scalable_topic_name(T)), create=False)
        assert "late" in topic.subscriptions, child
