"""Findings of a review of the scalable topics' client: DAG updates a broker got wrong."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.protocol import scalable as protocol_scalable
from pyengine.scalable import LayoutError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.scalable.wire import dag_to_layout, layout_to_dag

T = "topic://public/default/orders"


@pytest.fixture
def operation_timeout() -> float:
    return 5


def corrupting(monkeypatch, times: list[int], from_epoch: int = 0) -> None:
    """The broker's DAG updates of layout epoch `from_epoch` on lose their last segment (the
    active ones no longer tile the hash space) while `times` holds a count, one taken per update."""
    def bad_dag(layout, controller_url, segment_brokers, dag=None):
        dag = layout_to_dag(layout, controller_url, segment_brokers, dag)
        if times and layout.epoch >= from_epoch:
            times.pop()
            del dag.segments[-1]
        return dag
    monkeypatch.setattr(protocol_scalable, "layout_to_dag", bad_dag)


async def test_a_malformed_first_dag_fails_the_watch_at_once(client, service, server, monkeypatch):
    """The first DAG of a watch that dag_to_layout refuses raised LayoutError in the
    connection's dispatch (logged there): the watch waited out the operation timeout and then
    failed with TimeoutError ("no DAG"), saying nothing of the broken DAG, and the broker's
    session was left open. Now it fails at once with the LayoutError, and its session is closed."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    corrupting(monkeypatch, [1] * 100)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(LayoutError, match="DAG of topic://public/default/orders"):
        await client.watch_scalable_topic(T)
    assert loop.time() - started < 2                 # not the operation timeout
    for _ in range(100):
        if sum(len(c.scalable.sessions) for c in server.connections) == 0:
            break
        await asyncio.sleep(0.02)
    assert sum(len(c.scalable.sessions) for c in server.connections) == 0


async def test_a_malformed_later_dag_opens_the_watch_again(client, service, monkeypatch):
    """A later DAG the client cannot read was dropped (LayoutError logged by the connection's
    dispatch) and the session went on: the watch kept the layout before the change for good
    (nothing else is pushed until the next change), and a producer's sends for a split range
    waited for a layout that never came. Now the session is closed and opened again, whose
    first DAG is current."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    watch = await client.watch_scalable_topic(T)
    corrupting(monkeypatch, [1], from_epoch=1)       # the update of the split only
    await scalable.split_segment(T, 0)
    assert (await watch.wait_newer_than(0, 5)).epoch == 1
    await watch.close()


def test_a_dag_listing_a_segment_twice_is_refused():
    """dag_to_layout kept the last of two records of one segment id: a DAG saying both that
    segment 0 is the only active segment, over the whole hash space, and that it covers the
    lower half beside segment 1 was read as the latter, and keys routed by a guess. A DAG
    whose records contradict each other is invalid (LayoutError)."""
    dag = pb.ScalableTopicDAG(epoch=0, next_segment_id=2)
    for sid, start, end in ((0, 0, 0xFFFF), (0, 0, 0x7FFF), (1, 0x8000, 0xFFFF)):
        dag.segments.add(segment_id=sid, hash_start=start, hash_end=end, state=pb.SEGMENT_ACTIVE)
    with pytest.raises(LayoutError, match="segment 0 .*twice"):
        dag_to_layout(dag)


@pytest.mark.parametrize("ending", ["error", "malformed"])
async def test_a_session_ended_right_after_its_first_dag_is_opened_again(client, service, monkeypatch, ending):
    """An update ending the session (an error update, or a DAG the client cannot read) that
    came right behind the first one, before the opening resumed, found the session not
    established yet and opened nothing again; the opening then went on and kept the dead
    session: the watch never saw a change again. Now the opening sees its session gone and
    opens another."""
    from pyengine.client.scalable import DagWatch
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    on_update, injected = DagWatch._on_update, []

    def on_update_then_end(watch, connection, session_id, first, update):
        on_update(watch, connection, session_id, first, update)
        if not injected:
            injected.append(session_id)
            end = pb.CommandScalableTopicUpdate(session_id=session_id)
            if ending == "error":
                end.error, end.message = pb.MetadataError, "the metadata store is away"
            on_update(watch, connection, session_id, first, end)
    monkeypatch.setattr(DagWatch, "_on_update", on_update_then_end)
    watch = await client.watch_scalable_topic(T)
    assert injected
    await scalable.split_segment(T, 0)
    assert (await watch.wait_newer_than(0, 5)).epoch == 1
    await watch.close()
