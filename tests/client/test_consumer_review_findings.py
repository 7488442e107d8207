"""Findings of a review of the asyncio consumer (pyengine/client/consumer.py): each test fails
on the code as it was reviewed."""

from __future__ import annotations

import asyncio

from pyengine.client import Client
from pyengine.storage.managed_ledger import ManagedLedgerConfig

from .conftest import NetworkBroker

T = "persistent://public/default/consumer-review"


async def _batch(client, topic: str, count: int) -> list:
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
    ids = await asyncio.gather(*(producer.send(b"%d" % i) for i in range(count)))
    assert len({(m.ledger_id, m.entry_id) for m in ids}) == 1            # one batch entry
    await producer.close()
    return ids


async def _received_again(client, topic: str, **options) -> list[bytes]:
    """What a new consumer of the subscription is given (acknowledging none of it)."""
    consumer = await client.subscribe(topic, "s", initial_position="earliest", **options)
    got = []
    try:
        while True:
            got.append((await consumer.receive(timeout=0.5)).data)
    except TimeoutError:
        return got
    finally:
        await consumer.close()


async def test_without_batch_index_acks_a_cumulative_then_individual_ack_completes_the_batch(client):
    """batch_index_ack_enabled=False: a cumulative ack of index 1 of a batch of 3, then an
    individual ack of index 2, acknowledge every message of the batch (the C++ client's
    BatchMessageAcker counts the cumulative ack's indexes, and acks the entry once complete).
    Here the cumulative ack is not counted: the entry is never acknowledged and all three
    messages come back, though the application acknowledged each of them."""
    topic = T + "-cum-then-ind"
    consumer = await client.subscribe(topic, "s", initial_position="earliest", batch_index_ack_enabled=False)
    await _batch(client, topic, 3)
    got = [await consumer.receive(timeout=5) for _ in range(3)]
    await consumer.acknowledge_cumulative(got[1])
    await consumer.acknowledge(got[2])
    await consumer.close()
    assert await _received_again(client, topic) == []


async def test_without_batch_index_acks_an_individual_then_cumulative_ack_completes_the_batch(client):
    """The same the other way round: index 2 acknowledged individually, then index 1
    cumulatively (the C++ acker's ackCumulative finds the batch complete and acknowledges the
    entry)."""
    topic = T + "-ind-then-cum"
    consumer = await client.subscribe(topic, "s", initial_position="earliest", batch_index_ack_enabled=False)
    await _batch(client, topic, 3)
    got = [await consumer.receive(timeout=5) for _ in range(3)]
    await consumer.acknowledge(got[2])
    await consumer.acknowledge_cumulative(got[1])
    await consumer.close()
    assert await _received_again(client, topic) == []


async def test_without_batch_index_acks_a_cumulative_ack_in_a_ledgers_first_entry_acks_what_came_before(tmp_path):
    """batch_index_ack_enabled=False: a cumulative ack of a message inside a batch that is the
    first entry (entry 0) of a ledger must acknowledge everything before the batch, i.e. the
    previous ledgers' messages (the C++ and Java clients send the entry before, (ledger, -1):
    "everything before this ledger"). `_cumulative_target` returns None there and nothing is
    sent: every message of the earlier ledgers comes back, though acknowledged cumulatively.
    A new ledger starts with every broker restart or ledger roll-over, so the batch at entry
    0 is common."""
    topic = T + "-first-entry-of-ledger"
    async with NetworkBroker(tmp_path / "data", ledger=ManagedLedgerConfig(max_entries_per_ledger=2)) as broker:
        async with Client(broker.url, operation_timeout_seconds=10) as client:
            consumer = await client.subscribe(topic, "s", initial_position="earliest", batch_index_ack_enabled=False)
            producer = await client.create_producer(topic, batching_enabled=False)
            first = [await producer.send(b"a"), await producer.send(b"b")]      # ledger L, entries 0 and 1
            ids = await _batch(client, topic, 3)
            assert ids[0].ledger_id > first[0].ledger_id and ids[0].entry_id == 0    # the next ledger's entry 0
            got = [await consumer.receive(timeout=5) for _ in range(5)]
            await consumer.acknowledge_cumulative(got[3])                   # index 1 of the batch
            await consumer.close()
            # As without batch-index acks: the batch comes back whole; "a" and "b" must not.
            assert await _received_again(client, topic) == [b"0", b"1", b"2"]
