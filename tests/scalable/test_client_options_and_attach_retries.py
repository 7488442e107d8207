"""pyengine.client on scalable topics: every create_producer option is honoured or refused,
and a consumer whose subscribe to a new segment fails once keeps trying (QueueConsumer,
StreamConsumer) instead of silently never reading the segment."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import ServiceNotReadyError
from pyengine.naming import TopicName
from pyengine.scalable import key_hash

T = "topic://public/default/orders"


def fail_first_subscribe(client, monkeypatch, segment_ids):
    """The first subscribe of each of `segment_ids` fails; an event per segment is set once a
    subscribe of it succeeded."""
    real = client.subscribe
    failed: set[int] = set()
    attached = {sid: asyncio.Event() for sid in segment_ids}

    async def subscribe(topic, *args, **kwargs):
        name = TopicName.parse(topic)
        sid = name.segment_id if name.is_segment else None
        if sid in attached and sid not in failed:
            failed.add(sid)
            raise ServiceNotReadyError(f"injected: segment {sid} is not ready")
        consumer = await real(topic, *args, **kwargs)
        if sid in attached:
            attached[sid].set()
        return consumer
    monkeypatch.setattr(client, "subscribe", subscribe)
    return failed, attached


def key_in(low: int, high: int) -> str:
    return next(k for k in (f"key-{i}" for i in range(10_000)) if low <= key_hash(k) <= high)


async def assert_both_children_reached(client, consumer) -> None:
    """A key of each child of segment 0's split, sent now, arrives at `consumer` from that child."""
    producer = await client.create_producer(T)
    keys = {key_in(0x0000, 0x7FFF): 1, key_in(0x8000, 0xFFFF): 2}
    for key in keys:
        assert (await producer.send(key.encode(), key=key))[0] == keys[key]
    got = {}
    for _ in keys:
        message = await consumer.receive(5)
        got[message.data.decode()] = TopicName.parse(message.topic).segment_id
        await consumer.acknowledge(message)
    assert got == keys


async def test_a_scalable_producer_honours_batching_and_refuses_what_it_cannot_honour(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T, batching_enabled=True, batching_max_messages=5,
                                            batching_max_publish_delay_ms=200)
    sent = await asyncio.gather(*(producer.send(b"m%d" % i, key="k") for i in range(5)))
    ids = [message_id for _, message_id in sent]
    assert {segment for segment, _ in sent} == {0}
    assert all(m.batch_index >= 0 for m in ids), ids                  # batched, not one entry each
    assert len({(m.ledger_id, m.entry_id) for m in ids}) == 1, ids
    with pytest.raises(ValueError, match="initial_sequence_id"):
        await client.create_producer(T, initial_sequence_id=7)
    with pytest.raises((TypeError, ValueError)):
        await client.create_producer(T, batching_max_messages=0)     # checked, not ignored
    with pytest.raises(TypeError, match="unknown"):
        await client.create_scalable_producer(T, batching=True)
    with pytest.raises(ValueError, match="schema"):
        await client.create_scalable_producer(T, schema=object())


async def test_a_queue_consumer_retries_a_failed_attach_to_a_new_segment(client, service, monkeypatch):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    consumer = await client.subscribe_queue(T, "q")
    failed, attached = fail_first_subscribe(client, monkeypatch, (1, 2))
    await scalable.split_segment(T, 0)
    # no further layout change: the failed attaches are tried again on their own
    await asyncio.wait_for(asyncio.gather(attached[1].wait(), attached[2].wait()), 10)
    assert failed == {1, 2}
    await assert_both_children_reached(client, consumer)
    # the empty sealed parent is drained: let go (PIP-468), the children are read
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while loop.time() < deadline and consumer.segments != [1, 2]:
        await asyncio.sleep(0.02)
    assert consumer.segments == [1, 2]


async def test_a_queue_consumer_keeps_no_finished_task_across_layout_changes(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    consumer = await client.subscribe_queue(T, "q")
    for parent in (0, 1, 2):                     # three splits: epochs 1..3, segments 0..6
        await scalable.split_segment(T, parent)
    await consumer.watch.wait_newer_than(2, 5)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while loop.time() < deadline and (consumer.segments != [3, 4, 5, 6]
                                      or len(consumer._tasks) > len(consumer.segments)):
        await asyncio.sleep(0.02)
    assert consumer.segments == [3, 4, 5, 6]          # the empty sealed ones drained: let go
    # one forwarding task per attached segment, nothing kept per layout change (nor per drop)
    assert len(consumer._tasks) <= len(consumer.segments), consumer._tasks


async def test_a_stream_consumer_reads_a_segment_whose_subscribe_failed_once(client, service, monkeypatch):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    stream = await client.subscribe_stream(T, "ordered", "c1")
    assert stream.assigned == [0]
    failed, attached = fail_first_subscribe(client, monkeypatch, (1, 2))
    await scalable.split_segment(T, 0)                     # the empty parent is drained: children go out
    await asyncio.wait_for(asyncio.gather(attached[1].wait(), attached[2].wait()), 10)
    assert failed == {1, 2}
    await assert_both_children_reached(client, stream)
    assert sorted(stream.assigned) == [1, 2]
    # what `assigned` lists is read here
    assert {TopicName.parse(t).segment_id for t in stream._consumers} == set(stream.assigned)


async def test_a_stream_consumer_lists_as_assigned_only_the_segments_it_reads(client, service, monkeypatch):
    """While a segment's subscribe keeps failing, it is not in `assigned` (and no error is lost:
    it is tried again)."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    stream = await client.subscribe_stream(T, "ordered", "c1")
    real = client.subscribe
    tries = {1: 0, 2: 0}
    retried = asyncio.Event()

    async def subscribe(topic, *args, **kwargs):
        name = TopicName.parse(topic)
        if name.is_segment and name.segment_id == 1:
            tries[1] += 1
            if tries[1] >= 2:
                retried.set()
            raise ServiceNotReadyError("injected: segment 1 is not ready")
        return await real(topic, *args, **kwargs)
    monkeypatch.setattr(client, "subscribe", subscribe)
    await scalable.split_segment(T, 0)
    await asyncio.wait_for(retried.wait(), 10)
    assert stream.assigned == [2]
    assert {TopicName.parse(t).segment_id for t in stream._consumers} == {2}
