"""An embedded consumer (or reader) whose subscription the broker closes attaches again, as the
network client's consumer reconnects: to its topic loaded again after an unload, or created
again after its deletion (topics are created on use), to its subscription made again after a
forced deletion. It was closed for good instead: every later call raised ClosedError, while a
network consumer went on. What was queued is dropped and delivered again; its operations wait
for the attachment. It is closed for good when the broker closes (ClosedError), or when
attaching fails in a way retrying cannot fix (a deleted segment is not made again): then its
operations raise that failure, as the network client's."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.broker.embedded import ClosedError
from pyengine.client.message import MessageId
from pyengine.errors import TopicNotFoundError
from tests.broker.test_embedded_retries_on_a_closed_topic import hold_deletion

T = "persistent://public/default/attached-again"
SEGMENT = "segment://public/default/scalable/0000-ffff-0"


async def reload(broker, topic: str = T) -> None:
    """Unload the topic: its next use loads it again, subscriptions and all."""
    assert await broker.service.unload_topic(topic)


async def test_a_consumer_receives_from_its_topic_created_again_after_its_deletion(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        await producer.send(b"old")
        assert (await consumer.receive(timeout=5)).data == b"old"
        waiting = asyncio.ensure_future(consumer.receive(timeout=5))    # across the deletion
        await broker.service.delete_topic(T)
        await producer.send(b"new")                                     # (it creates the topic again)
        assert (await waiting).data == b"new"
        subscription = broker.service.topics[T].subscriptions["s"]
        assert [c.sink for c in subscription.consumers] == [consumer]
        await consumer.acknowledge(await waiting)
        assert subscription.backlog() == 0


async def test_a_consumer_gets_its_unacknowledged_messages_again_after_its_topic_is_loaded_again(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        for i in range(3):
            await producer.send(b"m%d" % i)
        first = await consumer.receive(timeout=5)
        await consumer.acknowledge(first)
        await consumer.receive(timeout=5)                   # m1 received, not acknowledged
        await reload(broker)
        again = [(await consumer.receive(timeout=5)).data for _ in range(2)]
        assert again == [b"m1", b"m2"]                      # the queue was dropped, m1 comes again
        with pytest.raises(TimeoutError):
            await consumer.receive(timeout=0.2)


async def test_a_reader_resumes_after_the_last_message_it_handed_out(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        for i in range(4):
            await producer.send(b"m%d" % i)
        reader = await broker.create_reader(T, MessageId.earliest, receiver_queue_size=10)
        assert [(await reader.read_next(timeout=5)).data for _ in range(2)] == [b"m0", b"m1"]
        await reload(broker)
        assert [(await reader.read_next(timeout=5)).data for _ in range(2)] == [b"m2", b"m3"]
        assert not await reader.has_message_available()
        topic = broker.service.topics[T]
        await reader.close()
        assert not topic._readers                          # detached from the loaded topic


async def test_a_subscription_deleted_under_its_consumer_is_made_again_at_its_initial_position(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="latest")
        await producer.send(b"before")
        assert (await consumer.receive(timeout=5)).data == b"before"
        topic = broker.service.topics[T]
        await topic.unsubscribe("s", force=True)
        for _ in range(100):
            if "s" in topic.subscriptions and topic.subscriptions["s"].consumers:
                break
            await asyncio.sleep(0.01)
        await producer.send(b"after")
        assert (await consumer.receive(timeout=5)).data == b"after"


async def test_an_ack_while_attaching_again_waits_for_the_attachment(tmp_path, monkeypatch):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await producer.send(b"m0")
        message = await consumer.receive(timeout=5)
        closed, release = hold_deletion(monkeypatch)
        deleting = asyncio.ensure_future(broker.service.delete_topic(T))
        await closed.wait()
        acking = asyncio.ensure_future(consumer.acknowledge(message))
        await asyncio.sleep(0.05)
        assert not acking.done()                           # waits for the topic created again
        release.set()
        await deleting
        await asyncio.wait_for(acking, 5)       # (the topic created again has no such message)
        subscription = broker.service.topics[T].subscriptions["s"]
        assert [c.sink for c in subscription.consumers] == [consumer]
        await producer.send(b"m1")
        assert (await consumer.receive(timeout=5)).data == b"m1"


async def test_closing_while_attaching_again_leaves_nothing_attached(tmp_path, monkeypatch):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s")
        closed, release = hold_deletion(monkeypatch)
        deleting = asyncio.ensure_future(broker.service.delete_topic(T))
        await closed.wait()
        assert consumer._attaching is not None
        await consumer.close()
        release.set()
        await deleting
        await asyncio.sleep(0.2)                            # past the first retry's back-off
        assert consumer._attaching is None
        assert T not in broker.service.topics               # not created again for nobody
        with pytest.raises(ClosedError):
            await consumer.receive(timeout=0.1)


async def test_a_consumer_whose_segment_was_deleted_is_closed_with_the_cause(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await broker.subscribe(SEGMENT, "s")
        waiting = asyncio.ensure_future(consumer.receive(timeout=5))
        await broker.service.delete_topic(SEGMENT)
        with pytest.raises(TopicNotFoundError):         # the failure itself, as the network client's
            await waiting
        assert not broker.service.topic_exists(SEGMENT)     # a deleted segment is not made again
        with pytest.raises(TopicNotFoundError):
            await consumer.acknowledge(MessageId(1, 0))


async def test_consumers_are_closed_for_good_when_the_broker_closes(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await broker.subscribe(T, "s")
        waiting = asyncio.ensure_future(consumer.receive())
        await asyncio.sleep(0)
    with pytest.raises(ClosedError):
        await asyncio.wait_for(waiting, 5)
    assert consumer._attaching is None


async def test_a_rewind_while_attaching_again_is_left_to_the_new_subscription(tmp_path, monkeypatch):
    """An abort rewinds the consumers that acked cumulatively in its transaction (and a nack
    asks for messages again): while one attaches again its old subscription is closed, and the
    new one delivers everything unacknowledged anyway. Nothing is asked of the old one."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="failover", initial_position="earliest",
                                          negative_ack_redelivery_delay_ms=0)
        await producer.send(b"m0")
        message = await consumer.receive(timeout=5)
        closed, release = hold_deletion(monkeypatch)
        deleting = asyncio.ensure_future(broker.service.delete_topic(T))
        await closed.wait()
        old = consumer._subscription
        monkeypatch.setattr(old, "redeliver_unacknowledged", lambda *a, **k: pytest.fail("asked of the old one"))
        assert consumer._redeliver_all() is None            # (an abort's rewind)
        consumer._redeliver(consumer, [message.message_id])  # (a nack's)
        rewinding = asyncio.ensure_future(consumer.redeliver_unacknowledged_messages())
        await asyncio.sleep(0.05)
        assert not rewinding.done()                          # waits for the attachment
        release.set()
        await deleting
        await asyncio.wait_for(rewinding, 5)
        assert consumer._subscription is not old
        await producer.send(b"new")
        assert (await consumer.receive(timeout=5)).data == b"new"
