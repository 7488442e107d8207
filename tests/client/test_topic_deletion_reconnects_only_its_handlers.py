"""A topic deleted (force) under a pyengine.client client: the broker closes the topic's producer
and consumer (CLOSE_PRODUCER, CLOSE_CONSUMER), which reconnect alone - retried while the
deletion goes on (ServiceNotReady), then on the topic created again - while the other topic's
producer and consumer on the same connection go on undisturbed. Found by an audit: the deleted
topic's producer was not told, its next send got SEND_ERROR ServiceNotReady, and the client
dropped the whole connection (every producer and consumer on it reconnected, and the other
topic's consumer was sent its unacknowledged message again)."""

from __future__ import annotations

import asyncio

from pyengine.client import Client
from tests.client.conftest import drain

DELETED = "persistent://public/default/deleted-under-a-client"
OTHER = "persistent://public/default/beside-the-deleted-topic"


async def test_deleting_a_topic_reconnects_its_producer_and_consumer_only(broker, monkeypatch):
    service = broker.service
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        producer = await client.create_producer(DELETED, batching_enabled=False)
        consumer = await client.subscribe(DELETED, "s", consumer_type="shared", initial_position="earliest")
        other_producer = await client.create_producer(OTHER, batching_enabled=False)
        other_consumer = await client.subscribe(OTHER, "s", consumer_type="shared")
        connection = other_producer._partitions[0].connection
        handlers = [producer._partitions[0], *consumer._handlers.values(), *other_consumer._handlers.values()]
        assert all(h.connection is connection for h in handlers)     # one connection for all four

        await producer.send(b"gone")
        await consumer.acknowledge(await consumer.receive(timeout=5))
        await other_producer.send(b"kept")
        unacked = await other_consumer.receive(timeout=5)    # a new connection would deliver it again
        assert unacked.data == b"kept"

        # The deletion stops once the topic is closed, until `go_on`.
        topic = service.topics[DELETED]
        closed, go_on = asyncio.Event(), asyncio.Event()
        delete = topic.delete

        async def held(*args, **kwargs):
            await topic.close()
            closed.set()
            await go_on.wait()
            return await delete(*args, **kwargs)

        monkeypatch.setattr(topic, "delete", held)
        # Sends in flight as the deletion begins: each is either stored in the old topic and
        # answered (gone with it) or sent again to the new topic; none fails, none is doubled.
        in_flight = [producer.send_async(b"in-flight-%d" % i) for i in range(5)]
        deleting = asyncio.ensure_future(service.delete_topic(DELETED))
        await asyncio.wait_for(closed.wait(), 5)
        after = [producer.send_async(b"after-%d" % i) for i in range(5)]
        # The other topic goes on meanwhile, on the same connection.
        for i in range(5):
            await asyncio.wait_for(other_producer.send(b"other-%d" % i), 5)
        await asyncio.sleep(0.3)                # the deleted topic's producer retries meanwhile
        assert not any(f.done() for f in after)

        go_on.set()
        await asyncio.wait_for(deleting, 5)
        await asyncio.wait_for(asyncio.gather(*in_flight, *after), 10)
        got = [m.data for m in await drain(consumer)]
        assert got[-5:] == [b"after-%d" % i for i in range(5)], got
        resent = got[:-5]
        assert resent == sorted(resent) and set(resent) <= {b"in-flight-%d" % i for i in range(5)}, got
        # The other topic's consumer got each message once: not its unacknowledged one again.
        assert [m.data for m in await drain(other_consumer)] == [b"other-%d" % i for i in range(5)]
        assert all(h.connection is connection for h in [*other_consumer._handlers.values(),
                                                          other_producer._partitions[0]])
        assert not connection.closed.done()
        # The reconnected producer and consumer are on that same connection too (one broker URL).
        assert producer._partitions[0].connection is connection
        assert service.topics[DELETED] is not topic
        await producer.send(b"later")
        assert (await consumer.receive(timeout=5)).data == b"later"
