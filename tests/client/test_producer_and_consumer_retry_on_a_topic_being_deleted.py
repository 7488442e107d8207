"""A producer or consumer made while its topic is being deleted (or unloaded) is retried, as
Pulsar's clients retry it: the closed topic answers ServiceNotReady (Pulsar's
TopicFencedException), not NotAllowed, which failed the creation for good; once the deletion
is over, the retry finds the topic created again."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client

T = "persistent://public/default/being-deleted"


@pytest.mark.parametrize("make", ["producer", "consumer"])
async def test_a_creation_during_the_topics_deletion_is_retried(broker, make):
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        producer = await client.create_producer(T)
        await producer.send(b"old")
        await producer.close()
        topic = broker.service.topics[T]
        deleting_started, go = asyncio.Event(), asyncio.Event()
        delete = topic.delete

        async def held(*args, **kwargs):
            deleting_started.set()
            await go.wait()
            return await delete(*args, **kwargs)
        topic.delete = held
        deleting = asyncio.ensure_future(broker.service.delete_topic(T))
        await asyncio.wait_for(deleting_started.wait(), 5)
        if make == "producer":
            creating = asyncio.ensure_future(client.create_producer(T))
        else:
            creating = asyncio.ensure_future(client.subscribe(T, "s", initial_position="earliest"))
        await asyncio.sleep(0.3)                # refused at least once meanwhile
        assert not creating.done(), creating
        go.set()
        await asyncio.wait_for(deleting, 5)
        made = await asyncio.wait_for(creating, 8)
        if make == "producer":
            await made.send(b"new")
        else:
            reader = await client.create_producer(T)
            await reader.send(b"new")
            assert (await made.receive(timeout=5)).data == b"new"     # the old message went with the topic
        await made.close()
