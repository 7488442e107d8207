"""Review probes of key-based batching: a key batch is of one transaction; a byte limit that
splits one key's messages keeps them in order; compressed key batches decode; close() sends
every key batch."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from pyengine.protocol import pulsar_api_pb2 as pb

from .test_key_based_batching import sent  # noqa: F401  (fixture)

NS = "persistent://public/default"


async def _drain(consumer) -> list:
    got = []
    while True:
        try:
            message = await consumer.receive(timeout=0.5)
        except TimeoutError:
            return got
        got.append(message)
        await consumer.acknowledge(message)


async def test_key_batches_are_of_one_transaction_each(client, sent):
    topic = f"{NS}/probe-kb-txn"
    consumer = await client.subscribe(topic, "sub")
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=60_000,
                                            batching_type="key_based")
    committed, aborted = await client.new_transaction(), await client.new_transaction()
    sends = [producer.send_async(b"c-a1", key="a", txn=committed), producer.send_async(b"c-b1", key="b", txn=committed),
             producer.send_async(b"x-a", key="a", txn=aborted), producer.send_async(b"c-a2", key="a", txn=committed)]
    await producer.flush()
    await asyncio.gather(*sends)
    txns = {(md.txnid_most_bits, md.txnid_least_bits) for md in sent}
    assert len(txns) == 2 and len(sent) == 4        # a txn change sends every open key batch
    await committed.commit()
    await aborted.abort()
    assert sorted(m.data for m in await _drain(consumer)) == [b"c-a1", b"c-a2", b"c-b1"]


async def test_a_byte_limit_splitting_a_key_keeps_its_order(client, sent):
    topic = f"{NS}/probe-kb-bytes"
    consumer = await client.subscribe(topic, "sub", consumer_type="key_shared")
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=60_000,
                                            batching_max_allowed_size_in_bytes=250, batching_type="key_based")
    sends = [producer.send_async(b"%s%02d" % (key.encode(), i) + b"." * 97, key=key)
             for i in range(6) for key in ("a", "b")]
    await producer.flush()
    await asyncio.gather(*sends)
    assert all(md.num_messages_in_batch <= 2 for md in sent)
    by_key = defaultdict(list)
    for message in await _drain(consumer):
        by_key[message.partition_key].append(message.data[:3])
    assert by_key == {key: [b"%s%02d" % (key.encode(), i) for i in range(6)] for key in ("a", "b")}


@pytest.mark.parametrize("codec", ["lz4", "zlib"])
async def test_compressed_key_batches_decode(client, sent, codec):
    topic = f"{NS}/probe-kb-{codec}"
    consumer = await client.subscribe(topic, "sub")
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=60_000,
                                            batching_type="key_based", compression_type=codec)
    sends = [producer.send_async(b"%d" % i * 50, key=f"k{i % 3}") for i in range(9)]
    await producer.flush()
    await asyncio.gather(*sends)
    assert len(sent) == 3 and all(md.compression != pb.NONE for md in sent)
    got = await _drain(consumer)
    assert sorted((m.partition_key, m.data) for m in got) == sorted((f"k{i % 3}", b"%d" % i * 50) for i in range(9))


async def test_close_sends_every_key_batch(client):
    topic = f"{NS}/probe-kb-close"
    consumer = await client.subscribe(topic, "sub")
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=60_000,
                                            batching_type="key_based")
    sends = [producer.send_async(b"%d" % i, key=f"k{i % 4}") for i in range(8)]
    await producer.close()
    ids = await asyncio.wait_for(asyncio.gather(*sends), 5)
    assert len({(i.ledger_id, i.entry_id) for i in ids}) == 4
    assert sorted(m.data for m in await _drain(consumer)) == sorted(b"%d" % i for i in range(8))
