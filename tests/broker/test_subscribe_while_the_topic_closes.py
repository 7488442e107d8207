"""A subscribe whose subscription is still being created (its cursor's write under way) when
the topic closes (unloaded, deleted) must fail, not attach its consumer to the closed topic:
before, it attached it to a subscription the topic's close never saw, of a ledger closed under
it - the consumer was never given a message nor told it was closed (it hung for good), and the
subscription's pending-ack handle stayed open."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.broker.consumer import Consumer
from pyengine.errors import TopicFencedError
from tests.broker.helpers import GatedWriter

T = "persistent://public/default/subscribe-while-the-topic-closes"


class Sink:
    def __init__(self) -> None:
        self.closed = False

    def deliver(self, deliveries) -> None:
        pass

    def active_changed(self, active: bool) -> None:
        pass

    def reset(self) -> None:
        pass

    def closed_by_broker(self) -> None:
        self.closed = True


@pytest.mark.parametrize("second", [False, True])
async def test_a_subscribe_under_way_when_the_topic_closes_fails(tmp_path, second):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"m0")
        topic = broker.service.topics[T]
        gate = GatedWriter(broker.service.env)
        try:
            first = asyncio.ensure_future(topic.subscribe("s", Consumer(Sink()), sub_type="shared"))
            await gate.next_commit()                    # the new cursor's write is held
            # `second`: another consumer joins the subscription being created meanwhile.
            joining = asyncio.ensure_future(topic.subscribe("s", Consumer(Sink()), sub_type="shared")) \
                if second else None
            await asyncio.sleep(0)
            closing = asyncio.ensure_future(topic.close())
            await asyncio.sleep(0)
        finally:
            gate.open()
        await closing
        for subscribing in [first, joining] if second else [first]:
            with pytest.raises(TopicFencedError):
                await subscribing
        assert all(not s.consumers for s in topic.subscriptions.values())
        assert all(s.dispatcher._closed for s in topic.subscriptions.values())
