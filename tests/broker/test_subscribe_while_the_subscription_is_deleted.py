"""A subscribe to a subscription whose unsubscribe is under way must wait for the deletion and
make the subscription afresh. Before, it took the cursor being deleted: the subscription lived
on in memory with a cursor the ledger no longer knew (not holding back the trimming of its
backlog, its record deleted), instead of a new one at its initial position."""

from __future__ import annotations

import asyncio

from pyengine.broker import Broker
from pyengine.broker.consumer import Consumer

from .test_subscribe_while_the_topic_closes import Sink

T = "persistent://public/default/subscribe-while-the-subscription-is-deleted"


async def test_a_subscribe_during_an_unsubscribe_makes_a_new_subscription(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"m0")
        topic = broker.service.topics[T]
        await topic.open_subscription("s", "latest")                # after m0
        unsubscribing = asyncio.ensure_future(topic.unsubscribe("s"))
        await asyncio.sleep(0)                                      # the deletion is under way
        consumer = Consumer(Sink())
        subscription = await topic.subscribe("s", consumer, sub_type="shared", initial_position="earliest")
        await unsubscribing
        assert topic.subscriptions["s"] is subscription
        assert subscription.cursor is topic.ledger.cursors["s"]     # known to the ledger (trimming)
        assert subscription.backlog() == 1                          # new, at the earliest: m0
        await subscription.cursor.flush()
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic = await broker.service.get_topic(T)
        assert topic.subscriptions["s"].backlog() == 1              # stored
