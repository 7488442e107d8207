"""Review probes: compression with keys, properties and transactions; delayed sends on
partitioned producers in transactions; cancelled sends."""

import asyncio
import datetime
import os

import pytest

from pyengine.client import CompressionType

from .conftest import drain

NS = "persistent://public/default"


@pytest.mark.parametrize("codec", ["lz4", "zlib", "zstd", "snappy"])
async def test_a_compressed_batch_of_a_txn_keeps_keys_properties_and_event_times(client, codec):
    topic = f"{NS}/probe-batch-{codec}"
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    producer = await client.create_producer(topic, compression_type=codec, batching_enabled=True,
                                            batching_max_messages=10, batching_max_publish_delay_ms=100)
    txn = await client.new_transaction()
    bodies = [os.urandom(200) if i % 2 else b"text %d" % i * 20 for i in range(10)]
    await asyncio.gather(*(producer.send(b, key=f"k{i}", properties={"i": str(i)}, event_time=1000 + i, txn=txn)
                           for i, b in enumerate(bodies)))
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.3)
    await txn.commit()
    got = await drain(consumer)
    assert [m.data for m in got] == bodies
    assert [m.partition_key for m in got] == [f"k{i}" for i in range(10)]
    assert [m.properties for m in got] == [{"i": str(i)} for i in range(10)]
    assert [m.event_time for m in got] == [1000 + i for i in range(10)]
    assert {m.message_id.entry_id for m in got} == {got[0].message_id.entry_id}


async def test_lz4_of_incompressible_data_round_trips(client):
    topic = f"{NS}/probe-lz4-random"
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    for batching in (False, True):
        producer = await client.create_producer(topic, compression_type=CompressionType.LZ4,
                                                batching_enabled=batching)
        bodies = [os.urandom(n) for n in (1, 15, 16, 4096, 70_000)]
        await asyncio.gather(*(producer.send(b) for b in bodies))
        assert [m.data for m in await drain(consumer)] == bodies
        await producer.close()


async def test_delayed_sends_of_a_txn_on_a_partitioned_batching_producer(client, broker):
    topic = f"{NS}/probe-delayed-parts"
    await broker.service.policies.create_partitioned_topic(topic, 3)
    consumer = await client.subscribe(topic, "s", consumer_type="shared", initial_position="earliest")
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
    txn = await client.new_transaction()
    futures = [producer.send_async(b"%d" % i, txn=txn, key=f"k{i}",
                                   deliver_after=datetime.timedelta(milliseconds=600) if i % 2 else None)
               for i in range(6)]
    ids = await asyncio.gather(*futures)
    assert all(i.batch_index == -1 for i in ids[1::2])
    await txn.commit()
    first = await drain(consumer, timeout=0.3)
    assert sorted(m.data for m in first) == [b"0", b"2", b"4"]
    later = await drain(consumer, timeout=1.5)
    assert sorted(m.data for m in later) == [b"1", b"3", b"5"]


async def test_a_cancelled_send_does_not_break_the_producer(client):
    topic = f"{NS}/probe-cancel"
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=100)
    task = asyncio.ensure_future(producer.send(b"cancelled"))
    await asyncio.sleep(0)
    task.cancel()
    assert (await producer.send(b"after")).entry_id >= 0
    await producer.flush()
    data = [m.data for m in await drain(consumer)]
    assert data[-1] == b"after"
    assert producer._partitions[0]._pending_messages == 0
