"""pyengine.client on scalable topics: key routing, re-routing across splits and merges, the
QueueConsumer, and split/merge under continuous produce and consume (no loss, no duplicate)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from pyengine.errors import NotAllowedError, TopicNotFoundError
from pyengine.naming import TopicName
from pyengine.scalable import key_hash

T = "topic://public/default/orders"


async def test_producer_routes_keys_and_follows_a_split(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    producer = await client.create_producer(T)
    for key in ("a", "b", "c", "d"):
        segment_id, _ = await producer.send(key.encode(), key=key)
        assert segment_id == (0 if key_hash(key) <= 0x7FFF else 1)
    await scalable.split_segment(T, 0)
    await producer.watch.wait_newer_than(0, 5)
    low_keys = [k for k in map(str, range(200)) if key_hash(k) <= 0x7FFF]
    for key in low_keys[:20]:
        segment_id, _ = await producer.send(b"x", key=key)
        assert segment_id == (2 if key_hash(key) <= 0x3FFF else 3)
    keyless = {(await producer.send(b"k"))[0] for _ in range(6)}
    assert keyless == {1, 2, 3}                                   # round robin over the active ones


async def test_a_send_to_a_terminated_parent_is_rerouted(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"first", key="k")
    # the split happens while the producer still believes in segment 0
    controller = await scalable.leader(T)
    held = asyncio.Event()

    async def hold_before_cas(step):
        if step == "terminate":
            held.set()
            await asyncio.sleep(0.3)       # the parent is sealed, the layout not yet published
    controller.fault = hold_before_cas
    split = asyncio.create_task(controller.split_segment(0))
    await held.wait()
    segment_id, _ = await producer.send(b"second", key="k")     # TopicTerminated, wait, re-route
    await split
    assert segment_id == (1 if key_hash("k") <= 0x7FFF else 2)


async def test_a_segment_terminated_by_hand_takes_sends_again_once_split(client, service):
    """The Segments API's terminate seals a segment that is still active in the layout (as the
    spec says: producers get TopicTerminated). A send hashing there waits until a split (or
    merge) seals the segment in the layout too, then goes to the child (README)."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"first", key="k")
    await scalable.segments.terminate("segment://public/default/orders/0000-ffff-0")
    send = asyncio.ensure_future(producer.send(b"second", key="k"))
    done, _ = await asyncio.wait([send], timeout=0.5)
    assert not done                                  # no active segment takes it yet
    await scalable.split_segment(T, 0)
    segment_id, _ = await asyncio.wait_for(send, 10)
    assert segment_id == (1 if key_hash("k") <= 0x7FFF else 2)


async def test_watch_and_queue_consumer_refusals(client, service):
    with pytest.raises(TopicNotFoundError):
        await client.create_producer("topic://public/default/missing")
    with pytest.raises(TopicNotFoundError):
        await client.subscribe_queue("topic://public/default/missing", "s")
    with pytest.raises(ValueError):
        await client.watch_scalable_topic("persistent://public/default/x")
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    with pytest.raises((TypeError, ValueError)):
        await client.subscribe_queue(T, "")
    consumer = await client.subscribe_queue(T, "s")
    with pytest.raises(ValueError):
        await consumer.acknowledge(object())


async def test_split_and_merge_under_continuous_produce_and_consume(client, service):
    """No message lost, none delivered twice (acked), per-key order within each segment."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    consumer = await client.subscribe_queue(T, "q")
    producer = await client.create_producer(T)
    keys = [f"key-{i}" for i in range(16)]
    sent: list[str] = []
    stop = asyncio.Event()

    async def produce():
        i = 0
        while not stop.is_set() or i < 50:
            key = keys[i % len(keys)]
            payload = f"{key}:{i}"
            await producer.send(payload.encode(), key=key)
            sent.append(payload)
            i += 1
            if i % 10 == 0:
                await asyncio.sleep(0)

    received: list[tuple[str, str]] = []

    async def consume():
        while True:
            message = await consumer.receive()
            received.append((message.topic, message.data.decode()))
            await consumer.acknowledge(message)

    producing = asyncio.create_task(produce())
    consuming = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    for operation in (lambda: scalable.split_segment(T, 0), lambda: scalable.split_segment(T, 1),
                      lambda: scalable.merge_segments(T, 3, 4), lambda: scalable.split_segment(T, 2)):
        await operation()
        await asyncio.sleep(0.1)
    stop.set()
    await producing
    for _ in range(200):
        if len(received) >= len(sent):
            break
        await asyncio.sleep(0.02)
    consuming.cancel()
    layout = await scalable.get_layout(T)
    assert layout.epoch == 4 and len(layout.active_segments) == 4
    counts = Counter(data for _, data in received)
    assert set(counts) == set(sent), "lost messages"
    assert max(counts.values()) == 1, "duplicates"
    # every segment the consumer read kept its keys in send order
    for segment in {topic for topic, _ in received}:
        per_key: dict[str, list[int]] = {}
        for topic, data in received:
            if topic == segment:
                key, index = data.split(":")
                per_key.setdefault(key, []).append(int(index))
        assert all(v == sorted(v) for v in per_key.values())
    assert len({topic for topic, _ in received}) >= 5            # parents and children all served
    # everything acknowledged: the sealed segments are drained and let go (PIP-468)
    active = sorted(s.segment_id for s in layout.active_segments)
    for _ in range(250):
        if consumer.segments == active:
            break
        await asyncio.sleep(0.02)
    assert consumer.segments == active
    assert all(TopicName.parse(t).is_segment for t, _ in received)


async def test_stream_consumers_keep_each_keys_order_across_splits_and_merges(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    one = await client.subscribe_stream(T, "ordered", "c1")
    two = await client.subscribe_stream(T, "ordered", "c2")
    assert sorted(one.assigned + two.assigned) == [0, 1]
    producer = await client.create_producer(T)
    keys = [f"key-{i}" for i in range(24)]
    sent: list[str] = []
    received: list[str] = []
    stop = asyncio.Event()

    async def produce():
        i = 0
        while not stop.is_set() or i < 60:
            await producer.send(f"{keys[i % len(keys)]}:{i}".encode(), key=keys[i % len(keys)])
            sent.append(f"{keys[i % len(keys)]}:{i}")
            i += 1
            await asyncio.sleep(0)

    async def consume(consumer):
        while True:
            message = await consumer.receive()
            received.append(message.data.decode())
            await consumer.acknowledge(message)

    tasks = [asyncio.create_task(consume(one)), asyncio.create_task(consume(two))]
    producing = asyncio.create_task(produce())
    await asyncio.sleep(0.1)
    await scalable.split_segment(T, 0)
    await asyncio.sleep(0.2)
    await scalable.split_segment(T, 1)
    await asyncio.sleep(0.2)
    await scalable.merge_segments(T, 3, 4)
    await asyncio.sleep(0.2)
    stop.set()
    await producing
    for _ in range(300):
        if len(received) >= len(sent):
            break
        await asyncio.sleep(0.02)
    for task in tasks:
        task.cancel()
    assert sorted(received) == sorted(sent)                        # none lost, none twice
    order: dict[str, list[int]] = {}
    for item in received:
        key, index = item.split(":")
        order.setdefault(key, []).append(int(index))
    assert all(indexes == sorted(indexes) for indexes in order.values()), "a key's order was broken"
    layout = await scalable.get_layout(T)
    assert sorted(one.assigned + two.assigned) == sorted(s.segment_id for s in layout.active_segments)


async def test_stream_consumer_refusals(client, service):
    with pytest.raises(TopicNotFoundError):
        await client.subscribe_stream("topic://public/default/missing", "s", "c")
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    for bad in ("", None):
        with pytest.raises((TypeError, ValueError)):
            await client.subscribe_stream(T, "s", bad)
    consumer = await client.subscribe_stream(T, "s", "c")
    with pytest.raises(ValueError):
        await consumer.acknowledge(object())


async def test_checkpoint_consumer_orders_keys_across_splits_and_resumes_from_its_checkpoint(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    keys = [f"key-{i}" for i in range(12)]
    sent = []
    for i in range(40):
        await producer.send(f"{keys[i % 12]}:{i}".encode(), key=keys[i % 12])
        sent.append(f"{keys[i % 12]}:{i}")
    await scalable.split_segment(T, 0)                 # 40 messages stay in the sealed parent
    await producer.watch.wait_newer_than(0, 5)
    for i in range(40, 80):
        await producer.send(f"{keys[i % 12]}:{i}".encode(), key=keys[i % 12])
        sent.append(f"{keys[i % 12]}:{i}")
    one = await client.subscribe_checkpoint(T, "cp", "a")
    two = await client.subscribe_checkpoint(T, "cp", "b")
    # Both hear the controller's new assignment before reading: a checkpoint consumer has no
    # acknowledgements, so what the first hands out under the assignment it is about to lose
    # is read again by the second (on a loaded machine the update can come after a receive).
    for _ in range(250):
        if one.assigned and two.assigned and not set(one.assigned) & set(two.assigned):
            break
        await asyncio.sleep(0.02)
    received: list[str] = []

    async def take(consumer, count):
        while len(received) < count:
            try:
                received.append((await consumer.receive(0.2)).data.decode())
            except TimeoutError:
                if len(received) >= count:
                    return
    await asyncio.wait_for(asyncio.gather(take(one, 80), take(two, 80)), 10)
    assert sorted(received) == sorted(sent)
    order: dict[str, list[int]] = {}
    for item in received:
        key, index = item.split(":")
        order.setdefault(key, []).append(int(index))
    assert all(v == sorted(v) for v in order.values())
    with pytest.raises(NotAllowedError):
        await one.acknowledge(object())
    # resume: a consumer started from the checkpoints gets only what came after
    saved = {**one.checkpoint(), **two.checkpoint()}
    assert set(saved) >= {1, 2}
    await one.close()
    await two.close()
    await producer.send(b"late", key="key-0")
    resumed = await client.subscribe_checkpoint(T, "cp2", "c", checkpoint=saved)
    assert (await resumed.receive(5)).data == b"late"
    with pytest.raises(TimeoutError):
        await resumed.receive(0.3)
    with pytest.raises(TypeError):
        await client.subscribe_checkpoint(T, "cp3", "d", checkpoint=[1, 2])


async def test_watch_and_stream_consumer_come_back_after_the_connection_drops(client, service, server):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    watch = await client.watch_scalable_topic(T)
    stream = await client.subscribe_stream(T, "s", "c1")
    before = list(stream.assigned)
    for connection in list(server.connections):           # the broker drops every client connection
        connection.close()
    await scalable.split_segment(T, 0)
    layout = await watch.wait_newer_than(0, 10)           # a new session got the change
    assert layout.epoch == 1
    controller = await scalable.leader(T)
    for _ in range(200):                                   # the consumer re-registered under its name
        consumers = (await controller.stats())["subscriptions"]["s"]["consumers"]
        if consumers and consumers[0]["connected"]:
            break
        await asyncio.sleep(0.02)
    assert [c["consumerName"] for c in consumers] == ["c1"] and consumers[0]["connected"]
    assert before == [0, 1]
    await watch.close()


async def test_a_checkpoint_is_behind_every_message_not_yet_received(client, service):
    """The consumer reads ahead into its queue; a checkpoint taken then names the last message
    received, not the last one read, so a consumer resumed from it loses nothing."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    for i in range(10):
        await producer.send(b"m%d" % i, key="k")
    consumer = await client.subscribe_checkpoint(T, "cp", "a")
    first = [(await consumer.receive(5)).data for _ in range(3)]
    for _ in range(100):                        # the rest read into the queue, not received
        if consumer._queue.qsize() == 7:
            break
        await asyncio.sleep(0.02)
    assert first == [b"m0", b"m1", b"m2"] and consumer._queue.qsize() == 7
    saved = consumer.checkpoint()
    await consumer.close()
    resumed = await client.subscribe_checkpoint(T, "cp2", "b", checkpoint=saved)
    rest = [await resumed.receive(5) for _ in range(7)]
    assert [m.data for m in rest] == [b"m%d" % i for i in range(3, 10)]
    with pytest.raises(TimeoutError):
        await resumed.receive(0.3)
    assert list(resumed.checkpoint().values()) == [rest[-1].message_id]   # nothing waits any more


async def test_a_stream_consumer_drops_what_it_read_of_a_segment_it_lost(client, service):
    """Messages read ahead from a segment that is then given to another consumer are not
    handed out (they could not be acknowledged, and the new owner delivers them)."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    one = await client.subscribe_stream(T, "ordered", "c1")
    assert sorted(one.assigned) == [0, 1]
    producer = await client.create_producer(T)
    sent = [f"k{i}" for i in range(40)]
    for key in sent:
        await producer.send(key.encode(), key=key)
    for _ in range(100):                        # all read ahead into one's queue
        if one._queue.qsize() == len(sent):
            break
        await asyncio.sleep(0.02)
    assert one._queue.qsize() == len(sent)
    two = await client.subscribe_stream(T, "ordered", "c2")
    for _ in range(100):
        if len(one.assigned) == 1 and len(two.assigned) == 1:
            break
        await asyncio.sleep(0.02)
    received = {"c1": [], "c2": []}
    for name, consumer in (("c1", one), ("c2", two)):
        while True:
            try:
                message = await consumer.receive(0.5)
            except TimeoutError:
                break
            await consumer.acknowledge(message)          # each one is still this consumer's
            received[name].append(message.data.decode())
    assert sorted(received["c1"] + received["c2"]) == sorted(sent)
    assert received["c1"] and received["c2"]
