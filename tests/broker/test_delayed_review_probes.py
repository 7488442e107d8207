"""Review probes: delayed delivery with expiry/skip/clear-backlog, Key_Shared joins and leaves,
transactional acks of held messages, the tracker's clock going back, the dispatcher's delay
search limited to entries that may carry a deliver_at_time, expire-by-id beyond the last entry
and the expired count with acks racing the search.

Their brokers skip fsync (sync=False): due times of a few hundred milliseconds were outlasted
by the fsyncs of a set-up on a loaded CI machine, and durability is not what they check."""

import asyncio

from pyengine.broker import Broker
from pyengine.broker.delayed import DelayedDeliveryTracker
from pyengine_kernels import Position
from tests.broker.helpers import drain
from tests.clocks import PausedWallClock
from tests.broker.test_delayed_delivery import T, now_ms, send, subscription


async def test_skip_and_clear_backlog_drop_held(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        due = now_ms() + 500
        for i in range(3):
            await send(broker, producer, b"held%d" % i, deliver_at=due)
        await producer.send(b"plain")
        got = await drain(consumer, 0.2)
        assert [m.data for m in got] == [b"plain"]
        sub = subscription(broker)
        assert sub.stats()["msgDelayed"] == 3
        await sub.skip_messages(2)
        assert sub.stats()["msgDelayed"] == 1
        assert sub.backlog() == 2
        await sub.expire_messages(0, now_ms() + 10)
        assert sub.stats()["msgDelayed"] == 0, sub.stats()
        assert await drain(consumer, 0.8) == []


async def test_expire_with_held_messages(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        for i in range(3):
            await send(broker, producer, b"held%d" % i, deliver_at=now_ms() + 500)
        assert await drain(consumer, 0.2) == []
        sub = subscription(broker)
        assert await sub.expire_messages(1, now_ms() + 5000)
        assert sub.stats()["msgDelayed"] == 0 and sub.backlog() == 0
        assert sub.stats()["totalMsgExpired"] == 3
        assert await drain(consumer, 0.8) == []


async def test_key_shared_join_while_held(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        a = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest",
                                   consumer_name="a")
        await send(broker, producer, b"held", key="k0", deliver_at=now_ms() + 800)
        assert await drain(a, 0.2) == []
        b = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="b")
        for i in range(40):
            await send(broker, producer, b"m%d" % i, key="k%d" % i)
        got_a = await drain(a, 0.3)
        got_b = await drain(b, 0.3)
        for m in got_a:
            await a.acknowledge(m)
        for m in got_b:
            await b.acknowledge(m)
        await asyncio.sleep(0.8)
        more_a = await drain(a, 0.3)
        for m in more_a:
            await a.acknowledge(m)
        more_b = await drain(b, 0.5)
        for m in more_b:
            await b.acknowledge(m)
        more_b += await drain(b, 0.5)
        total = len(got_a) + len(got_b) + len(more_a) + len(more_b)
        assert total == 41



def test_tracker_clock_going_backwards_does_not_stall():
    async def main():
        clock = [1_000_000_000]
        fired = []
        tracker = DelayedDeliveryTracker(lambda: fired.append(1), tick_time_ms=1000, clock=lambda: clock[0])
        tracker.add(Position(1, 0), clock[0] + 10)
        clock[0] += 20
        tracker._fire()                                   # a timed release
        assert tracker.pop_due() == [Position(1, 0)]
        clock[0] -= 3_600_000                             # the wall clock goes back an hour
        tracker.add(Position(1, 1), clock[0] + 50)
        handle = tracker._timer
        assert handle is not None
        delay = handle.when() - asyncio.get_running_loop().time()
        assert delay < 5, delay
        tracker.close()
    asyncio.run(main())


async def test_plain_entries_published_since_the_load_are_not_searched_for_a_delay(tmp_path, monkeypatch):
    import pyengine.broker.dispatcher as dispatcher_module
    calls = []
    real = dispatcher_module.deliver_at_time
    monkeypatch.setattr(dispatcher_module, "deliver_at_time", lambda data: calls.append(1) or real(data))
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        for i in range(5):
            await producer.send(b"p%d" % i)
        assert len(await drain(consumer, 0.2)) == 5
        assert calls == []                               # nothing delayed was ever published
        await send(broker, producer, b"held", deliver_at=now_ms() + 60_000)
        await producer.send(b"after")
        assert [m.data for m in await drain(consumer, 0.2)] == [b"after"]
        assert subscription(broker).stats()["msgDelayed"] == 1


async def test_entries_stored_before_a_load_are_searched_then_new_plain_ones_not(tmp_path, monkeypatch):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await producer.send(b"old-plain")
        await send(broker, producer, b"old-held", deliver_at=now_ms() + 60_000)
    import pyengine.broker.dispatcher as dispatcher_module
    calls = []
    real = dispatcher_module.deliver_at_time
    monkeypatch.setattr(dispatcher_module, "deliver_at_time", lambda data: calls.append(1) or real(data))
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared")
        assert [m.data for m in await drain(consumer, 0.2)] == [b"old-plain"]
        assert subscription(broker).stats()["msgDelayed"] == 1
        assert len(calls) == 2
        for i in range(3):
            await producer.send(b"new%d" % i)
        assert len(await drain(consumer, 0.2)) == 3
        assert len(calls) == 2
        await send(broker, producer, b"new-held", deliver_at=now_ms() + 60_000)
        assert await drain(consumer, 0.2) == []
        assert subscription(broker).stats()["msgDelayed"] == 2


async def test_expire_up_to_a_position_beyond_the_last_entry_does_nothing(tmp_path):
    # Pulsar's PersistentMessageExpiryMonitor.expireMessages(Position): "If it's beyond last
    # position of this topic, do nothing" (not issued).
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        ids = [await producer.send(b"m%d" % i) for i in range(3)]
        sub = subscription(broker)
        beyond = Position(ids[-1].ledger_id, ids[-1].entry_id + 100)
        assert await sub.expire_up_to(beyond) is False
        assert sub.backlog() == 3
        assert await sub.expire_up_to(ids[0].position) is True
        assert sub.backlog() == 2
        assert await sub.expire_up_to(sub.topic.ledger.lac) is True
        assert sub.backlog() == 0


async def test_expired_count_leaves_out_acks_racing_the_scan(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        for i in range(2500):
            await producer.send(b"m%d" % i)
        got = await drain(consumer, 0.3)
        sub = subscription(broker)
        task = asyncio.ensure_future(sub.expire_messages(0, now_ms() + 10))
        await asyncio.sleep(0)                       # the scan has started
        from pyengine.transaction.pendingack import IndividualAck
        sub.ack_individual(None, [IndividualAck(m.message_id.position, 1, None) for m in got[-50:]])
        assert not task.done()                       # acked while it runs
        await task
        assert sub.backlog() == 0
        assert sub.stats()["totalMsgExpired"] == 2450, sub.stats()["totalMsgExpired"]


async def test_held_acked_by_id_then_others_redelivered_and_released(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                          negative_ack_redelivery_delay_ms=0)
        due = now_ms() + 600                      # one time: one timed release (a tick apart else)
        held = [await send(broker, producer, b"h%d" % i, deliver_at=due) for i in range(3)]
        plain = [await producer.send(b"p%d" % i) for i in range(2)]
        got = await drain(consumer, 0.2)
        assert [m.data for m in got] == [b"p0", b"p1"]
        await consumer.acknowledge(held[1])
        sub = subscription(broker)
        assert sub.stats()["msgDelayed"] == 2
        for m in got:
            await consumer.negative_acknowledge(m)
        again = await drain(consumer, 0.2)
        assert sorted(m.data for m in again) == [b"p0", b"p1"]
        for m in again:
            await consumer.acknowledge(m)
        late = await drain(consumer, 1.0)
        assert [m.data for m in late] == [b"h0", b"h2"]
        for m in late:
            await consumer.acknowledge(m)
        assert sub.backlog() == 0 and sub.stats()["msgDelayed"] == 0


async def test_clear_backlog_with_held_and_unacked_at_a_consumer(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        await producer.send(b"p0")
        await send(broker, producer, b"h", deliver_at=now_ms() + 400)
        assert [m.data for m in await drain(consumer, 0.2)] == [b"p0"]
        sub = subscription(broker)
        await sub.clear_backlog()
        stats = sub.stats()
        assert stats["msgDelayed"] == 0 and stats["msgBacklog"] == 0
        assert stats["consumers"][0]["unackedMessages"] == 0
        assert await drain(consumer, 0.6) == []
        await producer.send(b"next")
        assert [m.data for m in await drain(consumer, 0.2)] == [b"next"]


async def test_key_shared_consumer_leaves_while_held(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        a = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest",
                                   consumer_name="a")
        b = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="b")
        due = now_ms() + 500
        for i in range(20):
            await send(broker, producer, b"h%d" % i, key="k%d" % i, deliver_at=due)
        for i in range(20):
            await send(broker, producer, b"p%d" % i, key="k%d" % i)
        got_a = await drain(a, 0.2)
        await a.close()                                   # leaves with its messages unacked
        got_b = await drain(b, 1.2)
        datas = [m.data for m in got_b]
        # What a had unacked comes to b, and so does everything held, once due.
        assert {m.data for m in got_a} <= set(datas)
        assert set(datas) == {b"h%d" % i for i in range(20)} | {b"p%d" % i for i in range(20)}, datas
        assert subscription(broker).stats()["msgDelayed"] == 0


async def test_held_message_acked_in_a_transaction_then_aborted_or_committed(tmp_path):
    clock = PausedWallClock()           # the due time counts from after the set-up's writes
    async with Broker.embedded(tmp_path, clock=clock) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest")
        due = clock() + 700
        a = await send(broker, producer, b"a", deliver_at=due)
        b = await send(broker, producer, b"b", deliver_at=due)
        assert await drain(consumer, 0.1) == []
        sub = subscription(broker)
        aborted = await broker.new_transaction()
        await consumer.acknowledge(a, txn=aborted)
        committed = await broker.new_transaction()
        await consumer.acknowledge(b, txn=committed)
        await aborted.abort()                            # before its time: held again, not at once
        await committed.commit()
        clock.resume()
        assert await drain(consumer, 0.2) == []
        assert sub.stats()["msgDelayed"] == 1
        late = await drain(consumer, 1.0)
        assert [m.data for m in late] == [b"a"]
        await consumer.acknowledge(late[0])
        assert sub.backlog() == 0
