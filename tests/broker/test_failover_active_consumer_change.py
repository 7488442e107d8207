"""Failover: when another consumer becomes the active one, Pulsar rewinds the cursor, so what
the previous active consumer has not acknowledged is delivered to the new one, in order. The
broker waits before that (activeConsumerFailoverDelayTimeMillis): not here, where the handover
itself is under test (the delay: test_failover_handover_delay.py)."""

from pyengine.broker import Broker
from tests.broker.helpers import drain

T = "persistent://public/default/failover-active-change"


async def test_a_consumer_that_becomes_active_gets_the_previous_ones_unacked_messages(tmp_path):
    async with Broker.embedded(tmp_path, active_consumer_failover_delay_time_ms=0) as broker:
        producer = await broker.create_producer(T)
        for i in range(5):
            await producer.send(b"m%d" % i)
        old = await broker.subscribe(T, "s", consumer_type="failover", initial_position="earliest",
                                     consumer_name="b")
        received = await drain(old)
        assert [m.data for m in received] == [b"m%d" % i for i in range(5)]
        await old.acknowledge(received[0])
        await old.acknowledge(received[2])
        new = await broker.subscribe(T, "s", consumer_type="failover", consumer_name="a")   # sorts first
        assert new.active and not old.active
        await producer.send(b"m5")
        rewound = await drain(new)
        assert [m.data for m in rewound] == [b"m1", b"m3", b"m4", b"m5"]
        assert all(m.redelivery_count == 0 for m in rewound)
        for message in rewound:
            await new.acknowledge(message)
        assert broker.service.topics[T].subscriptions["s"].backlog() == 0


async def test_a_higher_priority_consumer_takes_over_the_unacked_messages(tmp_path):
    async with Broker.embedded(tmp_path, active_consumer_failover_delay_time_ms=0) as broker:
        producer = await broker.create_producer(T)
        low = await broker.subscribe(T, "s", consumer_type="failover", initial_position="earliest",
                                     consumer_name="a", priority=5)
        for i in range(3):
            await producer.send(b"m%d" % i)
        assert len(await drain(low)) == 3
        high = await broker.subscribe(T, "s", consumer_type="failover", consumer_name="z", priority=0)
        assert high.active and not low.active
        assert [m.data for m in await drain(high)] == [b"m0", b"m1", b"m2"]
        assert await drain(low) == []
