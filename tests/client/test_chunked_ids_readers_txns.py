"""Chunked message ids beyond one consumer: their wire form (serialize / deserialize keep the
first chunk, as pulsar-client-cpp's MessageId::deserialize), readers and seeks that start at a
chunked message (from its first chunk, as the C++ client's getStartMessageId for an inclusive
start), chunked messages in transactions, and a chunking producer on a partitioned topic."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client.chunks import ChunkMessageId
from pyengine.client.message import MessageId
from pyengine.protocol.pulsar_api_pb2 import MessageIdData

from .test_chunking import LIMIT, _payload, small_broker, small_client  # noqa: F401  (fixtures)

TOPIC = "persistent://public/default/chunked-ids"


# --- serialize / deserialize --------------------------------------------------------------

def test_a_chunked_id_round_trips_with_its_first_chunk():
    chunked = ChunkMessageId.of([MessageId(3, 10, -1, 1), MessageId(3, 11, -1, 1), MessageId(4, 2, -1, 1)])
    data = chunked.serialize()
    assert MessageIdData.FromString(data).HasField("first_chunk_message_id")
    back = MessageId.deserialize(data)
    assert isinstance(back, ChunkMessageId)
    assert back == chunked and (back.ledger_id, back.entry_id, back.partition) == (4, 2, 1)
    assert back.first_chunk_id == MessageId(3, 10, -1, 1)
    # as the C++ client: the first and the last chunk (the middle ones are not in the wire form)
    assert back.chunk_ids == (MessageId(3, 10, -1, 1), MessageId(4, 2, -1, 1))
    assert back.serialize() == data
    assert ChunkMessageId.deserialize(data) == chunked


def test_a_plain_id_still_deserializes_as_a_plain_id():
    for plain in (MessageId(1, 2), MessageId(1, 2, 3, 0, 5), MessageId.earliest, MessageId.latest):
        back = MessageId.deserialize(plain.serialize())
        assert type(back) is MessageId and back == plain and back.batch_size == plain.batch_size


def test_a_deserialized_chunked_id_from_another_client():
    # as pulsar-client-cpp writes one: no partition on the first chunk of a non-partitioned topic
    data = MessageIdData(ledgerId=7, entryId=9, first_chunk_message_id=MessageIdData(ledgerId=7, entryId=5))
    back = MessageId.deserialize(data.SerializeToString())
    assert isinstance(back, ChunkMessageId)
    assert back.first_chunk_id == MessageId(7, 5) and (back.ledger_id, back.entry_id) == (7, 9)


# --- readers and seek at a chunked message -------------------------------------------------

async def _chunked_between(client, topic=TOPIC):
    producer = await client.create_producer(topic, chunking_enabled=True)
    await producer.send(b"before")
    payload = _payload(LIMIT * 3 + 5)
    sent = await producer.send(payload)
    assert isinstance(sent, ChunkMessageId) and len(sent.chunk_ids) >= 3
    await producer.send(b"after")
    return payload, sent


@pytest.mark.parametrize("wire", [False, True])
async def test_an_inclusive_reader_at_a_chunked_message_reads_it_whole(small_client, wire):
    payload, sent = await _chunked_between(small_client)
    start = MessageId.deserialize(sent.serialize()) if wire else sent
    reader = await small_client.create_reader(TOPIC, start, start_message_id_inclusive=True)
    first = await reader.read_next(5)
    assert first.data == payload and first.message_id == sent
    assert (await reader.read_next(5)).data == b"after"
    assert not await reader.has_message_available()


async def test_an_exclusive_reader_at_a_chunked_message_starts_after_it(small_client):
    _, sent = await _chunked_between(small_client)
    reader = await small_client.create_reader(TOPIC, sent)          # not inclusive by default
    assert (await reader.read_next(5)).data == b"after"


async def test_seek_to_a_chunked_message_resumes_after_it(small_client):
    """As the official consumer (a seek is exclusive for consumers): the broker goes back to the
    first chunk, and the client drops the message at the id, whole."""
    _, sent = await _chunked_between(small_client)
    consumer = await small_client.subscribe(TOPIC, "sub", initial_position="earliest")
    assert [(await consumer.receive(5)).data for _ in range(3)][2] == b"after"
    for target in (sent, MessageId.deserialize(sent.serialize())):
        await consumer.seek(target)
        assert (await consumer.receive(5)).data == b"after"


# --- transactions ---------------------------------------------------------------------------

async def test_a_chunked_message_in_a_transaction_is_seen_whole_after_commit_only(small_client):
    consumer = await small_client.subscribe(TOPIC, "sub")
    producer = await small_client.create_producer(TOPIC, chunking_enabled=True)
    payload = _payload(LIMIT * 4)
    txn = await small_client.new_transaction()
    sent = await producer.send(payload, txn=txn)
    assert isinstance(sent, ChunkMessageId)
    with pytest.raises(TimeoutError):
        await consumer.receive(0.3)
    await txn.commit()
    message = await consumer.receive(5)
    assert message.data == payload and message.message_id == sent
    await consumer.acknowledge(message)


async def test_an_aborted_chunked_message_is_never_seen(small_client):
    consumer = await small_client.subscribe(TOPIC, "sub")
    producer = await small_client.create_producer(TOPIC, chunking_enabled=True)
    txn = await small_client.new_transaction()
    await producer.send(_payload(LIMIT * 4), txn=txn)
    with pytest.raises(TimeoutError):
        await consumer.receive(0.3)
    await txn.abort()
    await producer.send(b"next")
    assert (await consumer.receive(5)).data == b"next"
    with pytest.raises(TimeoutError):
        await consumer.receive(0.3)


# --- partitioned topics ----------------------------------------------------------------------

async def test_a_chunking_producer_on_a_partitioned_topic(small_broker, small_client):
    topic = "persistent://public/default/chunked-parts"
    await small_broker.service.policies.create_partitioned_topic(topic, 2)
    consumer = await small_client.subscribe(topic, "sub", initial_position="earliest")
    producer = await small_client.create_producer(topic, chunking_enabled=True)
    payloads = {f"m{i}": _payload(LIMIT * 2 + i) for i in range(6)}
    sent = await asyncio.gather(*(producer.send(p, properties={"n": n}) for n, p in payloads.items()))
    assert {m.partition for m in sent} == {0, 1}
    assert all(isinstance(m, ChunkMessageId) for m in sent)
    got = {}
    for _ in payloads:
        message = await consumer.receive(5)
        got[message.properties["n"]] = message.data
        assert message.message_id.partition in (0, 1)
        await consumer.acknowledge(message)
    assert got == payloads
    with pytest.raises(TimeoutError):
        await consumer.receive(0.3)
