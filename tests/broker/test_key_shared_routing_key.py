"""The key a Key_Shared subscription routes an entry by is Pulsar's Commands.peekStickyKey's
(found by an audit): the ordering key, else the partition key, base64-decoded when
`partition_key_b64_encoded` (the Java client's keyBytes()), else the bytes "NONE_KEY". The
dispatcher hashed the base64 text itself and routed keyless entries by b"", so Sticky consumers
got other messages than on Pulsar, and the hashes in the stats differed."""

from __future__ import annotations

import base64
import time

import pytest

from pyengine.broker import Broker
from pyengine.broker.dispatcher import NONE_KEY, entry_key
from pyengine.broker.hash_ring import sticky_key_hash
from pyengine.client.consumer import ConsumerKeySharedPolicy, KeySharedMode
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import Entry, encode_entry, headers_and_payload
from pyengine_kernels import Position

from .helpers import drain

T = "persistent://public/default/key-shared-routing-key"


def _entry(**fields) -> Entry:
    metadata = message_metadata("p", 0, 1, **fields).SerializeToString()
    return Entry.decode(Position(1, 0), encode_entry(headers_and_payload(metadata, b"x")))


@pytest.mark.parametrize("fields, key", [
    ({"ordering_key": b"\x00ord", "partition_key": "k"}, b"\x00ord"),
    ({"partition_key": "k"}, b"k"),
    ({"partition_key": base64.b64encode(b"\xffbytes").decode(), "partition_key_b64_encoded": True}, b"\xffbytes"),
    ({"partition_key": "not base64!", "partition_key_b64_encoded": True}, NONE_KEY),
    ({}, NONE_KEY),
])
def test_the_routing_key_of_an_entry(fields, key):
    assert entry_key(_entry(**fields)) == key


def _half(key: bytes) -> str:
    return "low" if sticky_key_hash(key) <= 32767 else "high"


async def test_sticky_consumers_get_the_messages_of_their_decoded_keys(tmp_path):
    # a key whose base64 text hashes into the other half of the range
    key = next(k for k in (b"k%d" % i for i in range(1000)) if _half(k) != _half(base64.b64encode(k)))
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumers = {name: await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name=name,
                                                  key_shared_policy=ConsumerKeySharedPolicy(KeySharedMode.Sticky,
                                                                                           sticky_ranges=[span]))
                     for name, span in (("low", (0, 32767)), ("high", (32768, 65535)))}
        topic = broker.service.topics[T]
        metadata = message_metadata(producer.producer_name, 0, int(time.time() * 1000),
                                    partition_key=base64.b64encode(key).decode(), partition_key_b64_encoded=True)
        await topic.publish(producer._producer, headers_and_payload(metadata.SerializeToString(), b"payload"),
                            sequence_id=0)
        await producer.send(b"no key", sequence_id=1)
        got = {name: [m.data for m in await drain(consumer)] for name, consumer in consumers.items()}
        expected = {"low": [], "high": []}
        expected[_half(key)].append(b"payload")
        expected[_half(NONE_KEY)].append(b"no key")
        assert got == expected
