"""A cumulative ack of a message inside a batch, with batch-index acks (the default): as the C++
client, it names the batch's entry with an ack set that acknowledges the indexes up to the
message, and the broker keeps the later ones. Found by an audit: it acknowledged only up to the
entry before the batch, so after a restart the whole batch came back.

Without batch-index acks it acknowledges the entry before the batch (the broker would take an
ack set as the whole entry's ack), and counts the batch's indexes up to the message, so that the
batch's entry is acknowledged once the rest is (tests at the end, from a review)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client
from pyengine.storage.managed_ledger import ManagedLedgerConfig
from pyengine_kernels import Position

from .conftest import NetworkBroker

T = "persistent://public/default/cumulative-in-batch"


async def _batch(client, count: int, topic: str = T) -> list:
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
    ids = await asyncio.gather(*(producer.send(b"%d" % i) for i in range(count)))
    assert len({(m.ledger_id, m.entry_id) for m in ids}) == 1            # one batch entry
    await producer.close()
    return ids


async def _received_again(client, topic: str = T) -> list[bytes]:
    """What a new consumer of the subscription is given (acknowledging none of it)."""
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    got = []
    try:
        while True:
            got.append((await consumer.receive(timeout=0.5)).data)
    except TimeoutError:
        return got
    finally:
        await consumer.close()


async def test_only_the_later_messages_of_the_batch_come_back(client, broker):
    consumer = await client.subscribe(T, "s", initial_position="earliest")
    plain = await client.create_producer(T)
    await plain.send(b"before")
    await _batch(client, 10)
    got = [await consumer.receive(timeout=5) for _ in range(11)]
    await consumer.acknowledge_cumulative(got[5])                   # index 4 of the batch
    await asyncio.sleep(0.2)
    cursor = broker.service.topics[T].subscriptions["s"].cursor
    batch = Position(got[5].message_id.ledger_id, got[5].message_id.entry_id)
    assert cursor.mark_delete < batch and cursor.is_acked(got[0].message_id.position)
    assert cursor.batch_ack_set(batch) is not None                  # the later indexes stay
    await consumer.close()
    assert await _received_again(client) == [b"%d" % i for i in range(5, 10)]


async def test_a_later_cumulative_ack_in_the_same_batch_reaches_further(client):
    consumer = await client.subscribe(T, "s", initial_position="earliest")
    await _batch(client, 6)
    got = [await consumer.receive(timeout=5) for _ in range(6)]
    for message in (got[1], got[3], got[2]):                        # sent as one ack: the furthest
        await consumer.acknowledge_cumulative(message)
    await asyncio.sleep(0.2)
    await consumer.close()
    assert await _received_again(client) == [b"4", b"5"]
    consumer = await client.subscribe(T, "s", initial_position="earliest")
    again = [await consumer.receive(timeout=5) for _ in range(2)]
    await consumer.acknowledge_cumulative(again[1])                 # the batch's last: the whole entry
    await asyncio.sleep(0.2)
    await consumer.close()
    assert await _received_again(client) == []


async def test_without_batch_index_acks_the_batch_comes_back_whole(client):
    consumer = await client.subscribe(T, "s", initial_position="earliest", batch_index_ack_enabled=False)
    await _batch(client, 4)
    got = [await consumer.receive(timeout=5) for _ in range(4)]
    await consumer.acknowledge_cumulative(got[1])                   # as the C++ client: the entry before
    await asyncio.sleep(0.2)
    await consumer.close()
    assert await _received_again(client) == [b"0", b"1", b"2", b"3"]


async def test_a_txn_ack_of_messages_received_before_a_reconnect_is_refused(client, broker):
    """Found by the soak's cumulative exactly-once pipeline: messages handed out before the
    consumer reconnected come again on the new connection (the broker redelivers everything
    unacknowledged). A transaction that acked the old copies cumulatively committed them, and
    the next one took the new copies and committed them again (the indexes acked meanwhile
    were left out of its request without a conflict): outputs committed twice. The client
    refuses a transactional cumulative ack covering messages received before a reconnect."""
    from pyengine.client.handler import READY
    from pyengine.errors import TransactionConflictError

    consumer = await client.subscribe(T, "s", consumer_type="failover", initial_position="earliest")
    await _batch(client, 5)
    handler = consumer._handlers[-1]
    stale = [await consumer.receive(timeout=5) for _ in range(3)]
    generation = handler.generation
    await broker.restart()
    for _ in range(200):                      # subscribed again: the batch is sent again
        if handler.state == READY and handler.generation > generation and handler.queued == 5:
            break
        await asyncio.sleep(0.05)
    assert handler.generation > generation and handler.queued == 5
    committed: list[bytes] = []
    first = await client.new_transaction()
    try:
        await consumer.acknowledge_cumulative(stale[-1], txn=first)
        await first.commit()
        committed += [m.data for m in stale]
    except TransactionConflictError:
        await first.abort()
    second = await client.new_transaction()
    taken = [await consumer.receive(timeout=5) for _ in range(5)]
    await consumer.acknowledge_cumulative(taken[-1], txn=second)
    await second.commit()
    committed += [m.data for m in taken]
    assert sorted(committed) == [b"%d" % i for i in range(5)]       # each once
    await consumer.close()
    assert await _received_again(client) == []


@pytest.mark.parametrize("cumulative_first", [True, False], ids=["cumulative-then-individual",
                                                                 "individual-then-cumulative"])
async def test_without_batch_index_acks_a_cumulative_and_an_individual_ack_complete_the_batch(client, cumulative_first):
    """batch_index_ack_enabled=False: a cumulative ack of index 1 of a batch of 3 and an
    individual ack of index 2, in either order, acknowledge every message of the batch (the C++
    client's BatchMessageAcker counts the cumulative ack's indexes, and acknowledges the entry
    once none is left). The cumulative ack's indexes were not counted: the entry was never
    acknowledged and all three came back, though each was acknowledged."""
    topic = f"{T}-no-index-{cumulative_first}"
    consumer = await client.subscribe(topic, "s", initial_position="earliest", batch_index_ack_enabled=False)
    await _batch(client, 3, topic)
    got = [await consumer.receive(timeout=5) for _ in range(3)]
    if cumulative_first:
        await consumer.acknowledge_cumulative(got[1])
        await consumer.acknowledge(got[2])
    else:
        await consumer.acknowledge(got[2])
        await consumer.acknowledge_cumulative(got[1])
    await consumer.close()
    assert await _received_again(client, topic) == []


async def test_without_batch_index_acks_a_cumulative_ack_in_a_ledgers_first_entry_acks_what_came_before(tmp_path):
    """batch_index_ack_enabled=False: a cumulative ack of a message inside a batch that is the
    first entry (entry 0) of a ledger must acknowledge everything before the batch, i.e. the
    previous ledgers' messages (the C++ and Java clients send the entry before, (ledger, -1):
    "everything before this ledger"). `_cumulative_target` returned None there and nothing was
    sent: every message of the earlier ledgers came back, though acknowledged cumulatively.
    A new ledger starts with every broker restart or ledger roll-over, so the batch at entry
    0 is common."""
    topic = T + "-no-index-first-entry-of-ledger"
    async with NetworkBroker(tmp_path / "data", ledger=ManagedLedgerConfig(max_entries_per_ledger=2)) as broker:
        async with Client(broker.url, operation_timeout_seconds=10) as client:
            consumer = await client.subscribe(topic, "s", initial_position="earliest", batch_index_ack_enabled=False)
            producer = await client.create_producer(topic, batching_enabled=False)
            first = [await producer.send(b"a"), await producer.send(b"b")]      # ledger L, entries 0 and 1
            ids = await _batch(client, 3, topic)
            assert ids[0].ledger_id > first[0].ledger_id and ids[0].entry_id == 0    # the next ledger's entry 0
            got = [await consumer.receive(timeout=5) for _ in range(5)]
            await consumer.acknowledge_cumulative(got[3])                   # index 1 of the batch
            await consumer.close()
            # As without batch-index acks: the batch comes back whole; "a" and "b" must not.
            assert await _received_again(client, topic) == [b"0", b"1", b"2"]
