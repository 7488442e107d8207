"""Key-based batching (`create_producer(batching_type="key_based")`, pulsar-client's
BatchingType.KeyBased): one batch per key (ordering key first, then partition key), each sent
as an entry whose metadata carries that key, so Key_Shared consumers get each key whole and in
order; messages without a key form their own batch. Default batching is unchanged."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from pyengine.client import BatchingType
from pyengine.client import producer as producer_module
from pyengine.client.key_batching import batch_key, check_batching_type
from pyengine.protocol import pulsar_api_pb2 as pb

NS = "persistent://public/default"
KEYS = [f"key-{i}" for i in range(8)]


@pytest.fixture
def sent(monkeypatch) -> list[pb.MessageMetadata]:
    """The entry metadata of every SEND the producers build."""
    frames: list[pb.MessageMetadata] = []
    encode = producer_module.encode_payload_frame

    def recording(command: bytes, metadata: bytes, payload: bytes) -> bytes:
        frames.append(pb.MessageMetadata.FromString(metadata))
        return encode(command, metadata, payload)
    monkeypatch.setattr(producer_module, "encode_payload_frame", recording)
    return frames


async def _receive_all(consumer, into: list) -> None:
    while True:
        try:
            message = await consumer.receive(timeout=0.5)
        except TimeoutError:
            return
        into.append(message)
        await consumer.acknowledge(message)


async def test_key_shared_consumers_get_each_key_whole_and_in_order(client, sent):
    topic = f"{NS}/key-based"
    consumers = [await client.subscribe(topic, "ks", consumer_type="key_shared", initial_position="earliest",
                                        consumer_name=f"c{i}") for i in range(2)]
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_messages=1000,
                                            batching_max_publish_delay_ms=1000, batching_type="key_based")
    sends = [producer.send_async(b"%s:%d" % (KEYS[i % len(KEYS)].encode(), i), key=KEYS[i % len(KEYS)])
             for i in range(80)]
    await producer.flush()
    ids = await asyncio.gather(*sends)
    # one entry per key, all sent together, each carrying its key in the entry's metadata
    assert len({(i.ledger_id, i.entry_id) for i in ids}) == len(KEYS)
    assert sorted(md.partition_key for md in sent) == sorted(KEYS)
    assert all(md.num_messages_in_batch == 10 for md in sent)
    received: list[list] = [[], []]
    await asyncio.gather(*(_receive_all(c, into) for c, into in zip(consumers, received)))
    assert sum(map(len, received)) == 80
    owner: dict[str, int] = {}
    for index, messages in enumerate(received):
        by_key: dict[str, list[int]] = defaultdict(list)
        for message in messages:
            key, number = message.data.decode().split(":")
            assert message.partition_key == key
            assert owner.setdefault(key, index) == index        # every key at one consumer only
            by_key[key].append(int(number))
        assert all(numbers == sorted(numbers) for numbers in by_key.values())
    assert set(owner.values()) == {0, 1}                        # the keys are spread over both


async def test_messages_without_key_form_their_own_batch(client, sent):
    producer = await client.create_producer(f"{NS}/key-based-nokey", batching_enabled=True,
                                            batching_max_publish_delay_ms=1000,
                                            batching_type=BatchingType.KeyBased)
    sends = [producer.send_async(b"a", key="a"), producer.send_async(b"none-1"),
             producer.send_async(b"b", key="b"), producer.send_async(b"none-2")]
    await producer.flush()
    ids = await asyncio.gather(*sends)
    # sent in the order of their first sequence ids: a (0), no key (1, 3), b (2)
    assert [(md.sequence_id, md.highest_sequence_id, md.num_messages_in_batch) for md in sent] == \
        [(0, 0, 1), (1, 3, 2), (2, 2, 1)]
    assert [md.partition_key if md.HasField("partition_key") else None for md in sent] == ["a", None, "b"]
    assert ids[1].entry_id == ids[3].entry_id and [ids[1].batch_index, ids[3].batch_index] == [0, 1]
    assert len({(i.ledger_id, i.entry_id) for i in ids}) == 3


async def test_the_limits_count_all_key_batches_together(client, sent):
    producer = await client.create_producer(f"{NS}/key-based-full", batching_enabled=True,
                                            batching_max_messages=4, batching_max_publish_delay_ms=60_000,
                                            batching_type="KeyBased")
    ids = await asyncio.wait_for(asyncio.gather(*(producer.send(b"%d" % i, key=f"k{i % 2}") for i in range(4))), 5)
    assert [(md.partition_key, md.num_messages_in_batch) for md in sent] == [("k0", 2), ("k1", 2)]
    assert [i.batch_index for i in ids] == [0, 0, 1, 1]


async def test_the_ordering_key_comes_before_the_partition_key(client, sent):
    producer = await client.create_producer(f"{NS}/key-based-ordering", batching_enabled=True,
                                            batching_max_publish_delay_ms=1000, batching_type="key_based")
    # the dead letter path sends ordering keys (Producer.send has none)
    sends = [producer._send_copy(b"1", "p1", b"order", {}), producer._send_copy(b"2", "p2", b"order", {}),
             producer._send_copy(b"3", "p1", None, {})]
    tasks = [asyncio.ensure_future(s) for s in sends]
    await asyncio.sleep(0)
    await producer.flush()
    await asyncio.gather(*tasks)
    assert [(md.ordering_key if md.HasField("ordering_key") else None, md.partition_key, md.num_messages_in_batch)
            for md in sent] == [(b"order", "p1", 2), (None, "p1", 1)]
    assert batch_key("p", b"o") == b"o" and batch_key("p", None) == b"p" and batch_key(None, None) is None


async def test_default_batching_keeps_one_batch_of_all_keys(client, sent):
    producer = await client.create_producer(f"{NS}/default-batching", batching_enabled=True,
                                            batching_max_publish_delay_ms=1000)
    sends = [producer.send_async(b"%d" % i, key=f"k{i}") for i in range(4)]
    await producer.flush()
    ids = await asyncio.gather(*sends)
    assert len(sent) == 1 and sent[0].num_messages_in_batch == 4 and not sent[0].HasField("partition_key")
    assert [i.batch_index for i in ids] == [0, 1, 2, 3]


async def test_batching_type_names_and_pulsar_enum_are_accepted():
    assert check_batching_type("default") is BatchingType.Default
    assert check_batching_type("KEY_BASED") is BatchingType.KeyBased
    assert check_batching_type(BatchingType.KeyBased) is BatchingType.KeyBased
    pulsar = pytest.importorskip("pulsar")
    assert check_batching_type(pulsar.BatchingType.KeyBased) is BatchingType.KeyBased
    assert check_batching_type(pulsar.BatchingType.Default) is BatchingType.Default


@pytest.mark.parametrize("bad, error", [("by_key", ValueError), ("", ValueError), (1, TypeError), (None, TypeError)])
async def test_a_bad_batching_type_is_refused(client, bad, error):
    with pytest.raises(error, match="batching_type"):
        await client.create_producer(f"{NS}/bad-batching", batching_enabled=True, batching_type=bad)
