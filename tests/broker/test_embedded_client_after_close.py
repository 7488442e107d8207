"""The embedded client once closed (its `Broker.embedded` block ended, normally or by an
exception): it makes nothing more and says so with AlreadyClosedError, as pyengine.client does,
rather than that a topic or the coordinator is closed; what is made while it closes is closed too."""

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.client import MessageId
from pyengine.client.errors import AlreadyClosedError

TOPIC = "persistent://public/default/t"


async def test_a_closed_client_refuses_everything_with_already_closed(tmp_path):
    async with Broker.embedded(tmp_path) as client:
        producer = await client.create_producer(TOPIC)
        txn = await client.new_transaction()
        await producer.send(b"m", txn=txn)
    with pytest.raises(AlreadyClosedError, match="client is closed"):
        await client.create_producer(TOPIC)
    with pytest.raises(AlreadyClosedError, match="client is closed"):
        await client.subscribe(TOPIC, "s")
    with pytest.raises(AlreadyClosedError, match="client is closed"):
        await client.create_reader(TOPIC, MessageId.earliest)
    with pytest.raises(AlreadyClosedError, match="client is closed"):
        await client.new_transaction()
    for end in (txn.commit, txn.abort):
        with pytest.raises(AlreadyClosedError, match="client is closed"):
            await end()
    assert txn.state == "open"      # neither end was asked: it times out at the coordinator


async def test_a_block_that_raised_closes_what_its_client_made(tmp_path):
    with pytest.raises(RuntimeError, match="the application failed"):
        async with Broker.embedded(tmp_path) as client:
            producer = await client.create_producer(TOPIC)
            consumer = await client.subscribe(TOPIC, "s")
            raise RuntimeError("the application failed")
    with pytest.raises(AlreadyClosedError, match="producer is closed"):
        await producer.send(b"m")
    with pytest.raises(AlreadyClosedError, match="consumer is closed"):
        await consumer.receive()


@pytest.mark.parametrize("make", ["producer", "consumer", "reader"])
async def test_what_is_made_while_the_client_closes_is_closed(tmp_path, make):
    async with Broker.embedded(tmp_path) as client:
        creations = {"producer": lambda: client.create_producer(TOPIC),
                     "consumer": lambda: client.subscribe(TOPIC, "s"),
                     "reader": lambda: client.create_reader(TOPIC, MessageId.earliest)}
        creation = asyncio.ensure_future(creations[make]())
        await asyncio.sleep(0)              # under way: its topic is being loaded
        assert not creation.done()
        await client.close()
        with pytest.raises(AlreadyClosedError, match="closed while the producer or consumer was being created"):
            await creation
        topic = client.service.topics[TOPIC]
        assert not topic.producers
        assert all(not subscription.consumers for subscription in topic.subscriptions.values())


@pytest.mark.parametrize("version", [4.0, "5", None])
async def test_a_version_that_is_not_an_int_is_refused(tmp_path, version):
    async with Broker.embedded(tmp_path) as client:
        with pytest.raises(TypeError, match="version must be an int"):
            await client.new_transaction(version=version)
