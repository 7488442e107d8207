"""REDELIVER_UNACKNOWLEDGED_MESSAGES with message ids (negative acks on Shared subscriptions)
concerns the asking consumer's own unacknowledged messages only, as in Pulsar (its
Consumer.redeliverUnacknowledgedMessages looks each id up in the consumer's pending acks):
a stale request for a message that is now out at another consumer must not deliver it twice."""

from pyengine.broker import Broker
from tests.broker.helpers import drain

T = "persistent://public/default/shared-redelivery-scope"


async def test_a_negative_ack_of_a_message_now_at_another_consumer_is_ignored(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        for i in range(2):
            await producer.send(b"m%d" % i)
        a = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                   consumer_name="a", negative_ack_redelivery_delay_ms=0)
        first = await drain(a)
        assert [m.data for m in first] == [b"m0", b"m1"]
        b = await broker.subscribe(T, "s", consumer_type="shared", consumer_name="b")
        await a.redeliver_unacknowledged_messages()           # m0, m1 go round robin to a and b
        at_a, at_b = await drain(a), await drain(b)
        assert sorted(m.data for m in at_a + at_b) == [b"m0", b"m1"] and at_b
        moved = at_b[0]
        await a.negative_acknowledge(moved)                   # a does not hold it any more
        assert await drain(a) == [] and await drain(b) == []
        await b.acknowledge(moved)
        for message in at_a:
            await a.acknowledge(message)
        assert broker.service.topics[T].subscriptions["s"].backlog() == 0
