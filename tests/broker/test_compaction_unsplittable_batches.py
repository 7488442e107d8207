"""Batches compaction cannot split (found by an audit): an encrypted batch (ciphertext: the
official client batches encrypted messages by default) failed the whole compaction, and since
its horizon never moved every later run failed on the same entry while the compaction cursor
kept every ledger after it from being trimmed. As Pulsar's TwoPhaseCompactor (an unreadable
batch, RawBatchConverter.isReadableBatch, is one message by its MessageMetadata key), it is
kept whole under the key of its metadata, or left out without one; a batch whose bytes do not
decode is left out."""

from __future__ import annotations

import os

from pyengine.broker import Broker
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import headers_and_payload

from .test_compaction import attach, compact, values
from .helpers import drain

TOPIC = "persistent://public/default/unsplittable"


async def publish_raw(broker, producer, count: int, payload: bytes, **fields):
    topic = broker.service.topics[producer.topic]
    md = message_metadata(producer.producer_name, producer._next_sequence, 1, num_messages_in_batch=count, **fields)
    producer._next_sequence += count
    return await topic.publish(producer._producer, headers_and_payload(md.SerializeToString(), payload),
                               sequence_id=md.sequence_id, num_messages=count)


def encrypted(**fields) -> dict:
    return dict(encryption_keys=[pb.EncryptionKeys(key="k", value=b"v")], encryption_algo="RSA",
                encryption_param=os.urandom(12), **fields)


async def test_an_encrypted_batch_is_one_message_by_its_metadata_key(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"a1", key="a")
        ciphertext = os.urandom(64)
        kept = await publish_raw(broker, producer, 2, ciphertext, **encrypted(partition_key="b"))
        await publish_raw(broker, producer, 3, os.urandom(64), **encrypted())         # no key: left out
        await producer.send(b"a2", key="a")
        topic = await compact(broker, TOPIC)
        view = topic.compaction.view
        stored = view.read_entry(kept)
        assert stored is not None and stored.data.endswith(ciphertext) and stored.num_messages == 2
        assert [e.position for e in view.iter_entries()] == [kept, topic.ledger.lac]
        await producer.send(b"a3", key="a")
        await compact(broker, TOPIC)                                               # and again
        assert view.read_entry(kept) is not None


async def test_a_batch_that_does_not_decode_is_left_out(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"a1", key="a")
        await publish_raw(broker, producer, 4, b"\x00\x00\x00\x05\xff\xff")             # a cut batch
        await publish_raw(broker, producer, 2, b"\x00\x00\x00\x02\xff\xff")             # not protobuf
        await publish_raw(broker, producer, 2, os.urandom(40), compression=pb.LZ4, uncompressed_size=80)
        await producer.send(b"b1", key="b")
        await compact(broker, TOPIC)
        consumer = await attach(broker, TOPIC)
        assert values(await drain(consumer)) == [("a", b"a1"), ("b", b"b1")]
