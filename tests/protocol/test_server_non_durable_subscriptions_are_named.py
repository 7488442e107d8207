"""Non-durable subscriptions have names, as in Pulsar (found by an audit): every non-durable
SUBSCRIBE got an anonymous cursor of its own, so two Shared non-durable consumers of one name
each received every message, and a non-durable SUBSCRIBE took the name of a durable
subscription. Pulsar's PersistentTopic.getNonDurableSubscription looks the name up: a second
consumer joins the subscription, a durable one of that name is NotAllowed ("Durable
subscription with the same name already exists."), and getDurableSubscription refuses a name a
non-durable subscription holds ("NonDurable subscription with the same name already exists.").
The official Python client's readers name theirs at random: nothing changes for them."""

from __future__ import annotations

import asyncio

from pyengine.protocol import pulsar_api_pb2 as pb
from tests.protocol.wire_driver import BaseCommand

TOPIC = "persistent://public/default/non-durable-names"
SHARED = pb.CommandSubscribe.Shared


async def _count_messages(client, seconds=0.8) -> int:
    got = 0
    try:
        while True:
            if (await client.receive(seconds)).type == BaseCommand.MESSAGE:
                got += 1
    except TimeoutError:
        return got


async def test_non_durable_consumers_of_one_name_share_its_subscription(server, client, connect):
    await client.create_producer(TOPIC)
    for i in range(10):
        assert (await client.publish(0, i, b"m%d" % i)).type == BaseCommand.SEND_RECEIPT
    a, b = await connect(server.port), await connect(server.port)
    assert isinstance(await a.subscribe(TOPIC, "nd", sub_type=SHARED, durable=False, permits=100), pb.CommandSuccess)
    assert isinstance(await b.subscribe(TOPIC, "nd", sub_type=SHARED, durable=False, permits=100), pb.CommandSuccess)
    got_a, got_b = await asyncio.gather(_count_messages(a), _count_messages(b))
    assert got_a + got_b == 10


async def test_a_name_is_durable_or_not(server, client, connect):
    await client.subscribe(TOPIC, "durable", consumer_id=0, sub_type=SHARED)
    other = await connect(server.port)
    reply = await other.subscribe(TOPIC, "durable", sub_type=SHARED, durable=False)
    assert isinstance(reply, pb.CommandError) and reply.error == pb.NotAllowedError
    assert reply.message == "Durable subscription with the same name already exists."
    reader = await connect(server.port)
    assert isinstance(await reader.subscribe(TOPIC, "reader", sub_type=SHARED, durable=False), pb.CommandSuccess)
    reply = await other.subscribe(TOPIC, "reader", consumer_id=1, request_id=1, sub_type=SHARED)
    assert isinstance(reply, pb.CommandError) and reply.error == pb.NotAllowedError
    assert reply.message == "NonDurable subscription with the same name already exists."
    await reader.close()                            # the non-durable subscription goes with its consumer
    await asyncio.sleep(0.2)
    reply = await other.subscribe(TOPIC, "reader", consumer_id=2, request_id=2, sub_type=SHARED)
    assert isinstance(reply, pb.CommandSuccess)
