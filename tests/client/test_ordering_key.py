"""`Producer.send` / `send_async(ordering_key=...)`, as pulsar-client's (a str): the message's
ordering key, by which a Key_Shared subscription gives it to a consumer instead of its
partition key (the broker's dispatcher reads the ordering key first); KeyBased batching groups
by it first."""

from __future__ import annotations

import asyncio

import pytest

NS = "persistent://public/default"
PARTITION_KEYS = [f"pk-{i}" for i in range(20)]


async def _receive_all(consumer, into: list) -> None:
    while True:
        try:
            message = await consumer.receive(timeout=0.3)
        except TimeoutError:
            return
        into.append(message)
        await consumer.acknowledge(message)


async def _split(client, topic: str, subscription: str, send) -> list[list]:
    consumers = [await client.subscribe(topic, subscription, consumer_type="key_shared",
                                        initial_position="earliest", consumer_name=f"c{i}") for i in range(2)]
    await send()
    received: list[list] = [[], []]
    await asyncio.gather(*(_receive_all(c, into) for c, into in zip(consumers, received)))
    return received


async def test_key_shared_routes_by_the_ordering_key_over_the_partition_key(client):
    plain = await client.create_producer(f"{NS}/partition-keys-only")

    async def by_partition_key() -> None:
        for key in PARTITION_KEYS:
            await plain.send(key.encode(), key=key)

    spread = await _split(client, f"{NS}/partition-keys-only", "s", by_partition_key)
    assert all(spread), "without an ordering key the partition keys spread over both consumers"

    ordered = await client.create_producer(f"{NS}/ordering-keys")

    async def by_ordering_key() -> None:
        for key in PARTITION_KEYS:
            await ordered.send(key.encode(), key=key, ordering_key="one-order")
        ordered.send_async(b"last", key="pk-last", ordering_key="one-order")
        await ordered.flush()

    together = await _split(client, f"{NS}/ordering-keys", "s", by_ordering_key)
    assert sorted(len(got) for got in together) == [0, len(PARTITION_KEYS) + 1]
    messages = together[0] or together[1]
    assert [m.data for m in messages] == [k.encode() for k in PARTITION_KEYS] + [b"last"]
    assert all(m.ordering_key == b"one-order" for m in messages)
    assert [m.partition_key for m in messages] == PARTITION_KEYS + ["pk-last"]


async def test_key_based_batching_groups_by_the_ordering_key(client):
    topic = f"{NS}/ordering-key-batches"
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1000,
                                            batching_type="key_based")
    sends = [producer.send_async(b"%d" % i, key=PARTITION_KEYS[i], ordering_key=f"order-{i % 2}")
             for i in range(10)]
    await producer.flush()
    ids = await asyncio.gather(*sends)
    entries = {(m.ledger_id, m.entry_id) for m in ids}
    assert len(entries) == 2                      # one batch per ordering key, whatever the partition keys
    received = [await consumer.receive(timeout=3) for _ in range(10)]
    assert {int(m.data): m.ordering_key for m in received} == {i: b"order-%d" % (i % 2) for i in range(10)}


async def test_the_ordering_key_goes_with_a_transaction_and_an_empty_one_sets_nothing(client):
    topic = f"{NS}/ordering-key-txn"
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    producer = await client.create_producer(topic)
    txn = await client.new_transaction()
    await producer.send(b"in-txn", ordering_key="t", txn=txn)
    await producer.send_async(b"async-txn", ordering_key="u", txn=txn)
    await txn.commit()
    await producer.send(b"empty", ordering_key="")
    received = {m.data: m.ordering_key for m in [await consumer.receive(timeout=3) for _ in range(3)]}
    assert received == {b"in-txn": b"t", b"async-txn": b"u", b"empty": None}


@pytest.mark.parametrize("bad", [b"bytes", 5, ["k"]])
async def test_an_ordering_key_that_is_not_a_string_is_refused(client, bad):
    producer = await client.create_producer(f"{NS}/ordering-key-bad")
    with pytest.raises(TypeError, match="ordering_key must be a string"):
        await producer.send(b"x", ordering_key=bad)
    with pytest.raises(TypeError, match="ordering_key must be a string"):
        producer.send_async(b"x", ordering_key=bad)
