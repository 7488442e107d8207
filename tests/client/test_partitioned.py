"""Partitioned topics: routing by key hash and round robin, consumers and readers on all partitions."""

import asyncio
from collections import Counter

import pytest

from pyengine.client import MessageId
from pyengine.client.router import key_partition

TOPIC = "persistent://public/default/parted"


@pytest.fixture
async def partitioned(broker):
    await broker.service.policies.create_partitioned_topic(TOPIC, 3)
    return TOPIC


async def test_partitions_are_listed(client, partitioned):
    assert await client.get_topic_partitions(partitioned) == [f"{TOPIC}-partition-{i}" for i in range(3)]
    assert await client.get_topic_partitions("plain") == ["persistent://public/default/plain"]


async def test_keys_follow_murmur3_and_keyless_messages_go_round_robin(client, partitioned):
    producer = await client.create_producer(partitioned)
    for key in ("alpha", "beta", "gamma", "delta"):
        message_id = await producer.send(b"k", key=key)
        assert message_id.partition == key_partition(key, 3)
    keyless = Counter([(await producer.send(b"r")).partition for _ in range(9)])
    assert keyless == {0: 3, 1: 3, 2: 3}


async def test_the_hashing_scheme_picks_the_partition(client, partitioned):
    # As the Java client at its default (JavaStringHash): "alpha" (hashCode 92909918) goes to
    # partition 92909918 % 3 = 2, where Murmur3_32Hash sends it to 1.
    java = await client.create_producer(partitioned, hashing_scheme="JavaStringHash")
    murmur = await client.create_producer(partitioned)
    assert (await java.send(b"j", key="alpha")).partition == 92909918 % 3 == 2
    assert (await murmur.send(b"m", key="alpha")).partition == key_partition("alpha", 3) == 1
    for bad in ("BoostHash", 7):
        with pytest.raises(ValueError, match="hashing_scheme"):
            await client.create_producer(partitioned, hashing_scheme=bad)
    with pytest.raises(ValueError, match="hashing_scheme"):
        await client.create_producer("topic://public/default/scaled", hashing_scheme="java_string")


async def test_a_consumer_reads_every_partition_and_acks_by_partition(client, partitioned):
    producer = await client.create_producer(partitioned, batching_enabled=True, batching_max_publish_delay_ms=5)
    consumer = await client.subscribe(partitioned, "all", initial_position="earliest")
    sent = await asyncio.gather(*(producer.send(b"%d" % i, key=f"k{i}") for i in range(30)))
    assert {m.partition for m in sent} == {0, 1, 2}
    received = [await consumer.receive(timeout=5) for _ in range(30)]
    assert sorted(int(m.data) for m in received) == list(range(30))
    assert all(m.topic == f"{TOPIC}-partition-{m.message_id.partition}" for m in received)
    for message in received[:10]:
        await consumer.acknowledge(message)
    await asyncio.sleep(0.05)
    await consumer.close()
    again = await client.subscribe(partitioned, "all")
    rest = [await again.receive(timeout=5) for _ in range(20)]
    assert sorted(int(m.data) for m in rest) == sorted(int(m.data) for m in received[10:])
    lasts = await again.get_last_message_ids()         # one per partition (no one id is the last)
    for partition, last in enumerate(lasts):
        assert last == max(MessageId(m.ledger_id, m.entry_id, m.batch_index, m.partition)
                           for m in sent if m.partition == partition)


async def test_transactions_span_partitions(client, partitioned):
    producer = await client.create_producer(partitioned)
    watcher = await client.subscribe(partitioned, "watch", initial_position="earliest")
    txn = await client.new_transaction()
    sent = [await producer.send(b"%d" % i, txn=txn) for i in range(6)]
    assert {m.partition for m in sent} == {0, 1, 2}
    assert sorted(txn._partitions) == [f"{TOPIC}-partition-{i}" for i in range(3)]
    with pytest.raises(TimeoutError):
        await watcher.receive(timeout=0.3)
    await txn.commit()
    assert sorted([int((await watcher.receive(timeout=5)).data) for _ in range(6)]) == list(range(6))


async def test_a_reader_of_a_partitioned_topic(client, partitioned):
    producer = await client.create_producer(partitioned)
    for i in range(6):
        await producer.send(b"%d" % i)
    reader = await client.create_reader(partitioned, MessageId.earliest)
    assert sorted([int((await reader.read_next(timeout=5)).data) for _ in range(6)]) == list(range(6))
    assert not await reader.has_message_available()
    with pytest.raises(ValueError):
        await client.create_reader(partitioned, MessageId(1, 1, partition=0))
