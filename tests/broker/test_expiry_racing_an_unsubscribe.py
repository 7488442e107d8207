"""An expiry over a topic's subscriptions (a backlog eviction by age, the message TTL) goes
over them one after the other, with a snapshot taken at its start: a subscription deleted while
an earlier one is being expired was still expired afterwards, and that move of its cursor wrote
the deleted cursor's record again - the unsubscribed subscription came back at the next
restart. A deleted (closed) subscription's cursor must not move any more."""

from __future__ import annotations

import asyncio

from pyengine.broker import Broker
from pyengine.broker.backlog_quota import evict_for_age
from pyengine.broker.policies import BacklogQuota

T = "persistent://public/default/expiry-racing-an-unsubscribe"


async def test_an_expiry_under_way_does_not_bring_an_unsubscribed_subscription_back(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        for i in range(3):
            await producer.send(b"m%d" % i)
        topic = broker.service.topics[T]
        first = await topic.open_subscription("s1", "earliest")
        await topic.open_subscription("s2", "earliest")
        entered, go_on = asyncio.Event(), asyncio.Event()
        expire_first = first.expire_messages

        async def held_expiry(*args):
            entered.set()
            await go_on.wait()                          # s2 is deleted meanwhile
            return await expire_first(*args)
        first.expire_messages = held_expiry
        now = broker.service.config.clock() + 60_000
        evicting = asyncio.ensure_future(evict_for_age(topic, BacklogQuota(limit_time=10), now))
        await entered.wait()
        await topic.unsubscribe("s2")
        go_on.set()
        await evicting
        assert first.backlog() == 0                     # s1 was expired
        assert set(topic.subscriptions) == {"s1"}
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic = await broker.service.get_topic(T)
        assert set(topic.subscriptions) == {"s1"}
