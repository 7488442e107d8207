"""ScalableProducer: the sends of a key stay in send order across a split, whatever order the
parent's refusals (TopicTerminated) and the new layout reach the producer in.

A consumer reads a key's messages parent first, then child (PIP-468 ordered consumption), so
"in order" means: the key's messages read in that order come in the order they were sent.
These tests drive the interleavings deterministically: the controller is held between sealing
the parent and publishing the new layout (its `fault` hook), and the answers of the parent's
producer (SEND_RECEIPT / SEND_ERROR) are held on the client until the test releases them.
"""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client.errors import AlreadyClosedError
from pyengine.client.message import MessageId
from pyengine.client.producer import PartitionProducer
from pyengine.client import SendOutcomeUnknownError
from pyengine.errors import NotAllowedError, TopicTerminatedError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.scalable import key_hash

T = "topic://public/default/ordered"


class HeldAnswers:
    """Keeps the SEND_RECEIPTs and SEND_ERRORs of one segment producer until `release()`."""

    def __init__(self, part: PartitionProducer, rewrite=None) -> None:
        self.part = part
        self.held: list[tuple] = []
        self.rewrite = rewrite
        part.on_send_receipt = lambda cmd: self.held.append((PartitionProducer.on_send_receipt, cmd))
        part.on_send_error = lambda cmd: self.held.append((PartitionProducer.on_send_error, cmd))

    async def wait_for(self, count: int, timeout: float = 5) -> None:
        async def wait() -> None:
            while len(self.held) < count:
                await asyncio.sleep(0.005)
        await asyncio.wait_for(wait(), timeout)

    @property
    def errors(self) -> int:
        return sum(1 for handler, _ in self.held if handler is PartitionProducer.on_send_error)

    def release(self) -> None:
        del self.part.on_send_receipt, self.part.on_send_error
        held, self.held = self.held, []
        for handler, cmd in held:
            if self.rewrite is not None:
                handler, cmd = self.rewrite(handler, cmd)
            handler(self.part, cmd)


def segment_producer(producer, segment_id: int) -> PartitionProducer:
    return producer._producers[segment_id]._partitions[0]


async def hold_split(scalable, segment_id: int):
    """Start splitting `segment_id` of T; returns (split task, publish event) once the parent
    is sealed: the layout is published when the test sets the event."""
    return await hold_controller_split(await scalable.leader(T), segment_id)


async def hold_controller_split(controller, segment_id: int):
    """`hold_split` by a given controller."""
    sealed, publish = asyncio.Event(), asyncio.Event()

    async def hold(step):
        if step == "terminate":
            sealed.set()
            await publish.wait()
    controller.fault = hold
    split = asyncio.create_task(controller.split_segment(segment_id))
    await sealed.wait()
    controller.fault = None
    return split, publish


async def read_segment(client, producer, segment_id: int) -> list[tuple[str | None, str]]:
    layout = producer.watch.layout
    topic = layout.segment(segment_id).topic_name(producer.watch.topic_name)
    reader = await client.create_reader(topic, MessageId.earliest)
    out = []
    try:
        while await reader.has_message_available():
            message = await reader.read_next()
            out.append((message.partition_key, message.data.decode()))
    finally:
        await reader.close()
    return out


async def read_in_lineage_order(client, producer) -> list[tuple[str | None, str]]:
    """Every segment's messages, parents before children (as an ordered consumer reads a key)."""
    layout = producer.watch.layout
    order = sorted(layout.all_segments, key=lambda s: (layout.segment(s).created_at_epoch, s))
    out = []
    for sid in order:
        out += await read_segment(client, producer, sid)
    return out


def child_of(key: str) -> int:
    return 1 if key_hash(key) <= 0x7FFF else 2


async def wait_epoch(producer, epoch: int) -> None:
    if producer.watch.layout.epoch < epoch:
        await producer.watch.wait_newer_than(epoch - 1, 5)


async def test_concurrent_sends_refused_by_the_parent_are_resent_in_send_order(client, service):
    """Three sends of a key in flight when the parent is sealed, all refused: the first one to
    handle its refusal used to close the stale producer first (a round trip) while the others
    went ahead to the child, so the child stored them out of order (2, 3, 1)."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"0", key="k")
    split, publish = await hold_split(scalable, 0)
    sends = [asyncio.create_task(producer.send(str(i).encode(), key="k")) for i in (1, 2, 3)]
    await asyncio.sleep(0.2)                      # refused by the sealed parent, waiting for a layout
    publish.set()
    await split
    results = await asyncio.gather(*sends)
    assert {sid for sid, _ in results} == {child_of("k")}
    ids = [message_id for _, message_id in results]
    assert ids == sorted(ids), "re-sent to the child out of send order"
    assert [data for key, data in await read_in_lineage_order(client, producer) if key == "k"] == ["0", "1", "2", "3"]
    await producer.close()


async def test_a_send_after_the_new_layout_waits_behind_the_refused_ones(client, service):
    """The producer learns the new layout (DAG watch) before the parent's refusal of an earlier
    send of the key reaches it: a later send of the key must not go to the child first. A key
    of another segment is not held back meanwhile."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    low = [k for k in map(str, range(100)) if key_hash(k) <= 0x7FFF]
    key = low[0]
    other = next(k for k in map(str, range(100)) if key_hash(k) > 0x7FFF)
    producer = await client.create_producer(T)
    await producer.send(b"0", key=key)
    await producer.send(b"-", key=other)
    answers = HeldAnswers(segment_producer(producer, 0))
    split, publish = await hold_split(scalable, 0)
    first = asyncio.create_task(producer.send(b"1", key=key))
    await answers.wait_for(1)                     # its SEND_ERROR (TopicTerminated) is held here
    assert answers.errors == 1
    publish.set()
    await split
    await wait_epoch(producer, 1)
    second = asyncio.create_task(producer.send(b"2", key=key))
    assert (await asyncio.wait_for(producer.send(b"x", key=other), 5))[0] == 1    # not held back
    await asyncio.wait([second], timeout=0.3)     # the old code stored it in the child by now
    assert not second.done()
    answers.release()
    (sid1, id1), (sid2, id2) = await first, await second
    assert sid1 == sid2 == producer.watch.layout.segment_for_key(key).segment_id
    assert id1 < id2, "the later send of the key was stored in the child before the re-sent one"
    assert [data for k, data in await read_in_lineage_order(client, producer) if k == key] == ["0", "1", "2"]
    assert not producer._draining and not producer._waiting and not producer._inflight
    await producer.close()


async def test_a_send_with_a_stale_layout_after_the_new_one_keeps_its_place(client, service):
    """Sends of one key issued while the refusals and the layout arrive in every order: each
    key's messages, read parent then children, come in send order, none twice, none lost."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    keys = [f"key-{i}" for i in range(6)]
    for key in keys:
        await producer.send(b"-1", key=key)
    answers = HeldAnswers(segment_producer(producer, 0))
    split, publish = await hold_split(scalable, 0)
    tasks = []

    def issue(n: int) -> None:
        for _ in range(n):
            for key in keys:
                tasks.append(asyncio.create_task(producer.send(str(len(tasks)).encode(), key=key)))

    issue(3)                                      # refused, their refusals held
    await answers.wait_for(3 * len(keys))
    issue(2)                                      # refused too, not yet known
    publish.set()
    await split
    await wait_epoch(producer, 1)
    issue(2)                                      # after the new layout
    await asyncio.sleep(0.1)
    answers.release()
    issue(2)
    results = await asyncio.gather(*tasks)
    assert all(sid in (1, 2) for sid, _ in results)
    stored = await read_in_lineage_order(client, producer)
    for key in keys:
        datas = [int(data) for k, data in stored if k == key]
        assert datas == sorted(datas), f"{key} out of order: {datas}"
        assert len(datas) == len(set(datas)) == 1 + 9, f"{key}: lost or duplicated: {datas}"
    await producer.close()


async def test_a_send_refused_for_another_reason_is_not_resent(client, service):
    """A SEND_ERROR other than TopicTerminated fails the send: it is not re-routed."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"0", key="k")

    def not_allowed(handler, cmd):
        error = pb.CommandSendError(producer_id=cmd.producer_id, sequence_id=cmd.sequence_id,
                                    error=pb.NotAllowedError, message="refused by the test")
        return PartitionProducer.on_send_error, error

    answers = HeldAnswers(segment_producer(producer, 0), rewrite=not_allowed)
    split, publish = await hold_split(scalable, 0)
    refused = asyncio.create_task(producer.send(b"1", key="k"))    # TopicTerminated, seen as NotAllowed
    await answers.wait_for(1)
    answers.release()
    with pytest.raises(NotAllowedError):
        await refused
    publish.set()
    await split
    assert (await producer.send(b"2", key="k"))[0] == child_of("k")
    assert [data for key, data in await read_in_lineage_order(client, producer) if key == "k"] == ["0", "2"]
    await producer.close()


async def test_a_send_of_unknown_outcome_fails_rather_than_being_stored_twice(client, service):
    """The parent stored the send but its receipt was lost with the connection; the producer's
    reconnect then meets the terminated segment and fails what was pending with TopicTerminated.
    Re-sending it to the child would store it twice (de-duplication is per topic): it fails."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"0", key="k")
    part = segment_producer(producer, 0)
    answers = HeldAnswers(part)
    pending = asyncio.create_task(producer.send(b"1", key="k"))
    await answers.wait_for(1)                     # stored: its receipt is held here
    assert answers.errors == 0
    await scalable.split_segment(T, 0)
    await wait_epoch(producer, 1)
    part.connection.close()                       # the receipt is lost with the connection
    with pytest.raises(SendOutcomeUnknownError):
        await pending
    # the key goes on in the child, after the parent's messages
    assert (await producer.send(b"2", key="k"))[0] == child_of("k")
    assert [data for key, data in await read_in_lineage_order(client, producer) if key == "k"] == ["0", "1", "2"]
    await producer.close()


async def test_keys_stay_in_order_under_concurrent_sends_across_splits_and_merges(client, service):
    """Many keys sent concurrently (each key's sends issued in order, not awaited one by one)
    while segments are split and merged: read in lineage order, every key is in send order."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    producer = await client.create_producer(T)
    refused_by: list[int] = []                    # the sealed segments that refused a send
    terminated = producer._terminated
    producer._terminated = lambda sid: (refused_by.append(sid), terminated(sid))
    keys = [f"key-{i}" for i in range(12)]
    tasks: list[asyncio.Task] = []
    stop = asyncio.Event()
    # Paced, and at most this many sends unanswered: an unpaced producer's pile of sends grew
    # with the machine's slowness (to 200k), and the test measured the machine, not the order.
    room = asyncio.Semaphore(1200)

    async def produce():
        i = 0
        while not stop.is_set():
            for key in keys:
                await room.acquire()
                task = asyncio.create_task(producer.send(f"{i}".encode(), key=key))
                task.add_done_callback(lambda _: room.release())
                tasks.append(task)
            i += 1
            if i % 25 == 0:                       # in bursts: some are in flight at each seal
                await asyncio.sleep(0.03)

    async def sealed_a_while(step):               # sends meet each sealed parent before the layout
        if step == "terminate":
            await asyncio.sleep(0.05)
    (await scalable.leader(T)).fault = sealed_a_while
    producing = asyncio.create_task(produce())
    await asyncio.sleep(0.05)
    for operation in (lambda: scalable.split_segment(T, 0), lambda: scalable.split_segment(T, 1),
                      lambda: scalable.merge_segments(T, 3, 4), lambda: scalable.split_segment(T, 2)):
        await operation()
        await asyncio.sleep(0.05)
    stop.set()
    await producing
    await asyncio.gather(*tasks)
    await wait_epoch(producer, 4)
    stored = await read_in_lineage_order(client, producer)
    for key in keys:
        datas = [int(data) for k, data in stored if k == key]
        assert datas == list(range(len(datas))), f"{key}: {datas[:50]}"
    assert len(stored) == len(tasks)
    assert set(refused_by) == {0, 1, 2, 3, 4}, "every sealed parent refused sends in flight"
    await producer.close()


async def test_keyless_sends_refused_by_the_parent_go_to_the_children(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"0")
    split, publish = await hold_split(scalable, 0)
    sends = [asyncio.create_task(producer.send(str(i).encode())) for i in range(4)]
    await asyncio.sleep(0.2)
    publish.set()
    await split
    assert {sid for sid, _ in await asyncio.gather(*sends)} == {1, 2}
    await producer.close()


async def test_sends_waiting_for_a_layout_fail_when_the_producer_closes(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"0", key="k")
    split, publish = await hold_split(scalable, 0)
    sends = [asyncio.create_task(producer.send(b"1", key="k")), asyncio.create_task(producer.send(b"2", key="k"))]
    await asyncio.sleep(0.2)                      # refused, waiting for the layout
    await producer.close()
    for send in sends:
        with pytest.raises(AlreadyClosedError):
            await send
    publish.set()
    await split


async def test_a_cancelled_waiting_send_does_not_hold_its_key_back(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"0", key="k")
    split, publish = await hold_split(scalable, 0)
    first = asyncio.create_task(producer.send(b"1", key="k"))
    second = asyncio.create_task(producer.send(b"2", key="k"))
    await asyncio.sleep(0.2)                      # both refused, waiting for the layout
    first.cancel()
    publish.set()
    await split
    assert (await asyncio.wait_for(second, 5))[0] == child_of("k")
    assert [data for key, data in await read_in_lineage_order(client, producer) if key == "k"] == ["0", "2"]
    assert not producer._waiting
    await producer.close()


async def test_the_normal_path_creates_no_task_per_send(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    producer = await client.create_producer(T)
    for key in ("a", "b"):
        await producer.send(b"warm", key=key)             # the segments' producers are open
    loop = asyncio.get_running_loop()
    created = []
    factory = loop.get_task_factory()

    def counting(loop, coro, **kwargs):
        created.append(coro)
        return factory(loop, coro, **kwargs) if factory else asyncio.Task(coro, loop=loop, **kwargs)
    loop.set_task_factory(counting)
    try:
        for i in range(50):
            await producer.send(b"x", key="ab"[i % 2])
    finally:
        loop.set_task_factory(factory)
    assert created == []
    await producer.close()


async def test_the_producer_of_a_sealed_segment_with_nothing_in_flight_is_closed(client, service):
    """Only segments with sends in flight were drained and closed on a new layout: an idle
    parent's producer stayed attached to it for the producer's life (and reconnected to the
    sealed segment after every broker restart, a warning each time)."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"0", key="k")
    parent = service.topics[(await scalable.get_layout(T)).all_segments[0].topic_name(T)]
    assert len(parent.producers) == 1
    layout = await scalable.split_segment(T, 0)
    await producer.watch.wait_newer_than(layout.epoch - 1, 5)

    async def closed() -> None:
        while parent.producers or 0 in producer._producers:
            await asyncio.sleep(0.01)
    await asyncio.wait_for(closed(), 5)
    assert (await producer.send(b"1", key="k"))[0] in (1, 2)
    await producer.close()


async def test_a_send_to_a_segment_producer_that_failed_as_terminated_goes_to_the_children(client, service):
    """A segment producer whose reconnect (a broker restart) found its segment sealed fails
    for good; a send through it before the new layout arrived failed with NotAllowedError
    ("failed and cannot send") instead of going to the children. It is refused as terminated
    now, unsent (as the Java client's Terminated producer), and re-routed."""
    from pyengine.client.handler import FAILED
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"0", key="k")
    part = segment_producer(producer, 0)
    split, publish = await hold_split(scalable, 0)
    part.state, part.failure = FAILED, TopicTerminatedError("sealed while the broker was down")
    send = asyncio.create_task(producer.send(b"1", key="k"))
    await asyncio.sleep(0.2)
    assert not send.done()                      # refused unsent: waiting for the new layout
    publish.set()
    await split
    sid, _ = await send
    assert sid in (1, 2)
    await producer.close()
