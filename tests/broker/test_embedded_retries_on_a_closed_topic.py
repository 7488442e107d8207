"""The embedding API retries what a closed topic refuses, as pyengine.client does: a topic being
deleted is closed (TopicFencedError, ServiceNotReady on the wire), and the network client retries
the creation of a producer or consumer on it, at its back-off within its timeout, until the
deletion is over and the topic is created again; a producer whose topic was deleted under it
sends to the topic created again (the broker's SEND_ERROR makes the network client reconnect).
The embedded API raised TopicFencedError at once, and its producer held the deleted topic for
good: every later send failed."""

from __future__ import annotations

import asyncio

import pytest

import pyengine.broker.embedded as embedded
from pyengine.broker import Broker
from pyengine.broker.topic import Topic
from pyengine.client.message import MessageId
from pyengine.errors import TopicFencedError, TopicNotFoundError

T = "persistent://public/default/closed-topic"


def note_retries(monkeypatch) -> asyncio.Event:
    """Set when the embedded API is about to retry (it took a back-off delay)."""
    retried = asyncio.Event()

    class NotedBackoff(embedded.Backoff):
        def next(self) -> float:
            retried.set()
            return super().next()

    monkeypatch.setattr(embedded, "Backoff", NotedBackoff)
    return retried


def hold_deletion(monkeypatch) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold a topic's deletion once it is closed (loaded, refusing everything) until `release`."""
    closed, release = asyncio.Event(), asyncio.Event()
    delete = Topic.delete

    async def held(self, also=()):
        await self.close()
        closed.set()
        await release.wait()
        await delete(self, also)

    monkeypatch.setattr(Topic, "delete", held)
    return closed, release


async def refused_once(making: asyncio.Future, retried: asyncio.Event) -> None:
    """Wait until `making` was refused and is retried (failing now if it ended instead)."""
    waiting = asyncio.ensure_future(retried.wait())
    await asyncio.wait([making, waiting], return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if making.done():
        making.result()                         # raises what it failed with
        pytest.fail("made on the closed topic")


@pytest.mark.parametrize("make", ["producer", "consumer", "reader"])
async def test_a_creation_during_the_topics_deletion_is_retried(tmp_path, monkeypatch, make):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"old")
        await producer.close()
        retried = note_retries(monkeypatch)
        closed, release = hold_deletion(monkeypatch)
        deleting = asyncio.ensure_future(broker.service.delete_topic(T))
        await closed.wait()
        if make == "producer":
            making = asyncio.ensure_future(broker.create_producer(T))
        elif make == "consumer":
            making = asyncio.ensure_future(broker.subscribe(T, "s", initial_position="earliest"))
        else:
            making = asyncio.ensure_future(broker.create_reader(T, MessageId.earliest))
        await refused_once(making, retried)
        release.set()
        await deleting
        made = await asyncio.wait_for(making, 5)
        if make == "producer":
            await made.send(b"new")
            consumer = await broker.subscribe(T, "check", initial_position="earliest")
        else:
            await (await broker.create_producer(T)).send(b"new")
            consumer = made
        # On the topic created again: the old message went with the deleted one.
        assert (await consumer.receive(timeout=5)).data == b"new"


@pytest.mark.parametrize("make", ["producer", "consumer", "send"])
async def test_on_a_topic_that_stays_closed_the_refusal_is_raised_at_the_timeout(tmp_path, monkeypatch, make):
    """A creation within pyengine.client's operation timeout (cut short here), a send within the
    producer's send timeout."""
    monkeypatch.setattr(embedded, "_OPERATION_TIMEOUT_MS", 300, raising=False)
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T, send_timeout_ms=300)
        closed, release = hold_deletion(monkeypatch)
        deleting = asyncio.ensure_future(broker.service.delete_topic(T))
        await closed.wait()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TopicFencedError):
            if make == "producer":
                await asyncio.wait_for(broker.create_producer(T), 5)
            elif make == "consumer":
                await asyncio.wait_for(broker.subscribe(T, "s"), 5)
            else:
                await asyncio.wait_for(producer.send(b"x"), 5)
        assert loop.time() - started >= 0.25            # retried until then, not refused at once
        release.set()
        await deleting


async def test_a_producer_sends_to_its_topic_created_again_after_its_deletion(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        await producer.send(b"old")
        await broker.service.delete_topic(T)                # forced: the producer was attached
        sent = await asyncio.wait_for(producer.send(b"new"), 5)
        topic = broker.service.topics[T]
        assert topic.producers["p"] is producer._producer   # attached to the new topic, by its name
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        received = await consumer.receive(timeout=5)
        assert (received.data, received.message_id) == (b"new", sent)
        await producer.close()
        assert not topic.producers


async def test_a_send_during_the_topics_deletion_waits_for_the_topic_created_again(tmp_path, monkeypatch):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"old")
        retried = note_retries(monkeypatch)
        closed, release = hold_deletion(monkeypatch)
        deleting = asyncio.ensure_future(broker.service.delete_topic(T))
        await closed.wait()
        sends = [asyncio.ensure_future(producer.send(data)) for data in (b"a", b"b", b"c")]
        await refused_once(sends[0], retried)
        release.set()
        await deleting
        ids = [await asyncio.wait_for(send, 5) for send in sends]
        assert ids == sorted(ids)                           # stored in send order
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        assert [(await consumer.receive(timeout=5)).data for _ in range(3)] == [b"a", b"b", b"c"]


SEGMENT = "segment://public/default/scalable/0000-ffff-0"


async def test_a_deleted_segment_is_not_made_again_by_its_producer(tmp_path):
    """As on the wire, where only existing segments are attached to: the producer of a deleted
    segment fails (TopicNotFoundError) rather than storing its sends in a segment made again,
    which no scalable topic routes to (a first use of a segment makes it, not a retry)."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(SEGMENT)
        await producer.send(b"old")
        await broker.service.delete_topic(SEGMENT)
        with pytest.raises(TopicNotFoundError):
            await asyncio.wait_for(producer.send(b"new"), 5)
        assert not broker.service.topic_exists(SEGMENT)


async def test_a_creation_retried_on_a_segment_being_deleted_does_not_make_it_again(tmp_path, monkeypatch):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await (await broker.create_producer(SEGMENT)).close()
        retried = note_retries(monkeypatch)
        closed, release = hold_deletion(monkeypatch)
        deleting = asyncio.ensure_future(broker.service.delete_topic(SEGMENT))
        await closed.wait()
        making = asyncio.ensure_future(broker.subscribe(SEGMENT, "s"))
        await refused_once(making, retried)
        release.set()
        await deleting
        with pytest.raises(TopicNotFoundError):
            await asyncio.wait_for(making, 5)
        assert not broker.service.topic_exists(SEGMENT)
