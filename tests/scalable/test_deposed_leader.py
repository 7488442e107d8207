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
