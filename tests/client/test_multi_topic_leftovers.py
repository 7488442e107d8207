"""Leftovers of multi-topic consumers, against the C++ MultiTopicsConsumerImpl (and the Java
client): a list cannot hold a partitioned topic and one of its partitions; unsubscribe tries
every topic and, when one fails, stays open on what is left; a topic whose consumer is refused
on a reconnect (ConsumerBusy, retried) does not take the other topics down, and comes back."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client
from pyengine.errors import MetadataError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command

NS = "persistent://public/default"


async def _send(client, topic: str, data: bytes) -> None:
    producer = await client.create_producer(topic, batching_enabled=False)
    await producer.send(data)
    await producer.close()


async def test_a_list_with_a_partitioned_topic_and_its_partition_is_refused(client):
    topic = f"{NS}/leftover-parted"
    with pytest.raises(ValueError, match="both .*leftover-parted and its partition .*leftover-parted-partition-1"):
        await client.subscribe([topic, f"{topic}-partition-1"], "s")
    with pytest.raises(ValueError, match="its partition"):             # in either order
        await client.subscribe([f"{topic}-partition-0", f"{NS}/other", topic], "s")
    consumer = await client.subscribe([f"{topic}-partition-0", f"{topic}-partition-1"], "s")   # partitions only
    await consumer.close()


async def test_an_unsubscribe_failing_on_one_topic_keeps_the_consumer_open_on_it(client):
    topics = [f"{NS}/leftover-unsub-a", f"{NS}/leftover-unsub-b"]
    consumer = await client.subscribe(topics, "s", consumer_type="shared")
    other = await client.subscribe(topics[1], "s", consumer_type="shared")    # b cannot be unsubscribed now
    with pytest.raises(MetadataError, match="shared consumer attempting to unsubscribe"):
        await consumer.unsubscribe()
    assert consumer.topics == [topics[1]]          # a is unsubscribed (and dropped), b is still on
    await other.close()
    await _send(client, topics[1], b"b")
    assert (await consumer.receive(5)).data == b"b"
    await consumer.unsubscribe()                   # now it goes through, and closes
    assert consumer.topics == []


async def _until(condition, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "not within the timeout"
        await asyncio.sleep(0.01)


async def _close_on_the_broker(consumer):
    """The broker forgets `consumer`'s registration (as when it closes a consumer)."""
    [handler] = consumer._handlers.values()
    connection = handler.connection
    await connection.request(base_command(pb.BaseCommand.CLOSE_CONSUMER, consumer_id=handler.consumer_id,
                                          request_id=connection.new_request_id()), 5)
    return handler


async def test_a_topic_refused_on_reconnect_leaves_the_others_going_and_comes_back(broker, client):
    topics = [f"{NS}/leftover-busy-a", f"{NS}/leftover-busy-b"]
    consumer = await client.subscribe(topics, "s", consumer_type="exclusive")
    topic_consumer = consumer._consumers[topics[0]]
    handler = await _close_on_the_broker(topic_consumer)
    async with Client(broker.url, operation_timeout_seconds=5) as intruder:
        taker = await intruder.subscribe(topics[0], "s", consumer_type="exclusive")   # takes a's subscription
        handler.on_closed_by_broker()              # a reconnects: ConsumerBusy, retried (Java, C++)
        await _until(lambda: handler._backoff._next > 0.2)      # refused more than once meanwhile
        assert topic_consumer._failure is None and handler.state == "connecting"
        await _send(client, topics[1], b"b")
        assert (await consumer.receive(5)).data == b"b"      # b goes on
        await taker.close()
    await _send(client, topics[0], b"a")
    message = await consumer.receive(5)                      # a is subscribed again
    assert message.data == b"a"
    await consumer.acknowledge(message)
    assert consumer.topics == sorted(topics)
    await consumer.close()
