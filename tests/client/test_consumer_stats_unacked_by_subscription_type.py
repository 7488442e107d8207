"""CONSUMER_STATS' unackedMessages as Apache Pulsar answers it: counted only on Shared and
Key_Shared subscriptions (individual-ack mode); an Exclusive or Failover consumer holding
delivered, unacknowledged messages is answered 0."""

from __future__ import annotations

import pytest

from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command

TOPIC = "persistent://public/default/stats-unacked-by-type"


async def _consumer_stats(consumer) -> pb.CommandConsumerStatsResponse:
    (handler,) = consumer._handlers.values()
    connection = await handler._connected()
    cmd = base_command(pb.BaseCommand.CONSUMER_STATS, consumer_id=handler.consumer_id,
                       request_id=connection.new_request_id())
    return await connection.request(cmd, 5)


@pytest.mark.parametrize("consumer_type, shown", [("exclusive", 0), ("failover", 0), ("shared", 3),
                                                  ("key_shared", 3)])
async def test_consumer_stats_show_unacked_messages_for_shared_and_key_shared_only(client, consumer_type, shown):
    consumer = await client.subscribe(TOPIC, "s", consumer_type=consumer_type)
    producer = await client.create_producer(TOPIC, batching_enabled=False)
    for i in range(3):
        await producer.send(b"m%d" % i, key="k")
    received = [await consumer.receive(5) for _ in range(3)]   # delivered, none acknowledged
    stats = await _consumer_stats(consumer)
    assert (stats.unackedMessages, stats.msgBacklog) == (shown, 3)
    for message in received:
        await consumer.acknowledge(message)
    await consumer.close()
