"""lastExpireTimestamp as Pulsar records it: PersistentSubscription.expireMessages(Position) sets
it before asking its expiry monitor, so also for a position beyond the topic's last entry (the
monitor declines it, nothing is expired); expireMessages(ttl) sets it once the expiry is issued,
whether or not anything turns out expired, and not when it is not issued."""

from __future__ import annotations

import time

from pyengine.broker import Broker
from pyengine_kernels import Position

T = "persistent://public/default/expiry-timestamp"


async def subscribed_with_backlog(broker, count: int = 3):
    producer = await broker.create_producer(T)
    consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
    await consumer.close()                   # the subscription stays, with no consumer
    ids = [await producer.send(b"m%d" % i) for i in range(count)]
    return broker.service.topics[T].subscriptions["s"], ids


async def test_expire_up_to_beyond_the_last_entry_records_the_expiry(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        sub, ids = await subscribed_with_backlog(broker)
        before = int(time.time() * 1000)
        beyond = Position(ids[-1].ledger_id, ids[-1].entry_id + 100)
        assert await sub.expire_up_to(beyond) is False
        assert sub.backlog() == 3 and sub.total_msg_expired == 0
        assert sub.last_expire_timestamp >= before


async def test_expire_up_to_before_the_mark_delete_records_the_expiry(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        sub, _ = await subscribed_with_backlog(broker)
        assert await sub.expire_up_to(sub.cursor.mark_delete) is True
        assert sub.backlog() == 3 and sub.last_expire_timestamp > 0


async def test_expire_by_ttl_records_an_issued_expiry_only(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        sub, _ = await subscribed_with_backlog(broker)
        now = int(time.time() * 1000)
        # Issued (no consumer connected: the backlog is searched), nothing old enough.
        assert await sub.expire_messages(3600, now) is True
        assert sub.backlog() == 3 and sub.last_expire_timestamp > 0
        sub.last_expire_timestamp = 0
        # A connected consumer, a short backlog and nothing expired: not issued, not recorded.
        await broker.subscribe(T, "s", consumer_type="shared")
        assert await sub.expire_messages(3600, now) is False
        assert sub.last_expire_timestamp == 0
