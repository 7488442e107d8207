"""pyengine.client: aborting a scalable (v5) transaction that acknowledged cumulatively on a
`segment://` topic rewinds the Exclusive/Failover consumer in order, as a v4 abort does: the
broker applies the abort on the segment's subscription before the rewind the client asks for,
even when the header watch has not told the subscription yet (PIP-473: the abort is one CAS
that the subscription learns later). Before, the client did not rewind on v5 (its queued later
messages came first) and the broker's rewind gave back only what the consumer held."""

from __future__ import annotations

import pytest

from tests.broker.helpers import drain
from tests.client.conftest import broker, client  # noqa: F401  (fixtures)

SEGMENT = "segment://public/default/rewind/0000-ffff-0"


@pytest.fixture(autouse=True)
async def segment(broker):
    """SEGMENT, created as segments are: by its scalable topic (the wire creates none)."""
    await (await broker.service.scalable_topics()).create_topic("topic://public/default/rewind", 1)
    return SEGMENT


async def _received(consumer, timeout: float = 0.3) -> list[bytes]:
    return [message.data for message in await drain(consumer, timeout)]


@pytest.mark.parametrize("consumer_type", ["exclusive", "failover"])
async def test_an_aborted_cumulative_ack_rewinds_in_order_before_the_header_watch(client, broker, consumer_type):
    producer = await client.create_producer(SEGMENT)
    for i in range(10):
        await producer.send(b"m%d" % i)
    consumer = await client.subscribe(SEGMENT, "s", consumer_type=consumer_type, initial_position="earliest")
    received = [await consumer.receive(timeout=5) for _ in range(5)]
    assert [m.data for m in received] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    txn = await client.new_transaction(scalable=True)
    await consumer.acknowledge_cumulative(received[4], txn=txn)
    # The broker's header watch holds its notifications: the subscription hears of the abort
    # only from the rewind.
    headers = broker.service.v5.headers
    held: list = []
    headers._on_notification = held.append
    await txn.abort()
    assert await _received(consumer) == [b"m%d" % i for i in range(10)]
    del headers._on_notification
    for notification in held:
        headers._on_notification(notification)
    subscription = broker.service.topics[SEGMENT].subscriptions["s"]
    await subscription.pending_ack.wait_materialised()
    assert await _received(consumer, 0.2) == []          # nothing comes twice
