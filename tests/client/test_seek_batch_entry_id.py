"""A MessageId(ledger, entry) without a batch index that names a batch entry: the official
client (3.13, the C++ client) delivers that whole batch after a consumer's seek to it and for a
reader started there, inclusive or not (it compares batch indexes with the start's -1); checked
side by side against `pyengine serve`. A non-batch message at such an id is still left out
unless start-inclusive."""

from __future__ import annotations

from pyengine.client import MessageId

from .conftest import drain

TOPIC = "persistent://public/default/seek-batch-entry"


async def _fill_batches(client, batches: int, size: int) -> list[MessageId]:
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=size,
                                            batching_max_publish_delay_ms=60_000)
    ids = []
    for batch in range(batches):
        sends = [producer.send_async(b"%d" % (batch * size + i)) for i in range(size)]
        await producer.flush()
        ids += [await send for send in sends]
    await producer.close()
    return ids


def _entry_of(message_id: MessageId) -> MessageId:
    return MessageId(message_id.ledger_id, message_id.entry_id)


def _numbers(messages) -> list[int]:
    return [int(m.data) for m in messages]


async def test_a_consumer_seek_to_a_batch_entry_id_gets_the_whole_batch(client):
    ids = await _fill_batches(client, 3, 4)
    assert ids[4].batch_index == 0 and ids[4].entry_id != ids[0].entry_id
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    assert len(await drain(consumer, 0.2)) == 12
    await consumer.seek(_entry_of(ids[4]))
    assert _numbers(await drain(consumer, 0.2)) == list(range(4, 12))


async def test_a_reader_started_at_a_batch_entry_id_gets_the_whole_batch_inclusive_or_not(client):
    ids = await _fill_batches(client, 3, 4)
    for inclusive in (False, True):
        reader = await client.create_reader(TOPIC, _entry_of(ids[4]), start_message_id_inclusive=inclusive)
        assert _numbers(await drain(reader, 0.2)) == list(range(4, 12)), inclusive
        await reader.close()


async def test_a_non_batch_message_at_the_start_id_is_left_out_unless_inclusive(client):
    producer = await client.create_producer(TOPIC, batching_enabled=False)
    ids = [await producer.send(b"%d" % i) for i in range(3)]
    for inclusive, expected in ((False, [2]), (True, [1, 2])):
        reader = await client.create_reader(TOPIC, ids[1], start_message_id_inclusive=inclusive)
        assert _numbers(await drain(reader, 0.2)) == expected, inclusive
        await reader.close()
