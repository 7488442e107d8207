"""Seek as pulsar-client does it (checked side by side in tests/interop/test_seek_side_by_side.py):
the broker moves the cursor to the id's entry and the client drops what comes before the id, and
the id itself unless start-inclusive (a reader's setting, never a consumer's); a durable consumer
keeps that filter across a reconnect. Bad arguments get clear errors, before anything moves."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.client import MessageId

from tests.broker.helpers import publish_batch

from .conftest import drain

NS = "persistent://public/default"
TOPIC = f"{NS}/seeking"


async def _fill(client, count, topic=TOPIC, **options):
    producer = await client.create_producer(topic, **options)
    ids = [await producer.send(b"%d" % i) for i in range(count)]
    await producer.close()
    return ids


def _numbers(messages) -> list[int]:
    return [int(m.data) for m in messages]


async def test_a_consumer_seek_to_an_id_gets_the_messages_after_it(client):
    ids = await _fill(client, 5)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    assert _numbers(await drain(consumer, 0.2)) == [0, 1, 2, 3, 4]
    await consumer.seek(ids[2])
    assert _numbers(await drain(consumer, 0.2)) == [3, 4]
    await consumer.seek(MessageId.earliest)                 # earliest / latest filter nothing
    assert _numbers(await drain(consumer, 0.2)) == [0, 1, 2, 3, 4]


async def test_a_consumer_seek_inside_a_batch_gets_the_rest_of_it(client):
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=4,
                                            batching_max_publish_delay_ms=60_000)
    sends = [producer.send_async(b"%d" % i) for i in range(8)]
    await producer.flush()
    ids = [await s for s in sends]
    assert ids[1].batch_size == 4 and ids[1].batch_index == 1
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    received = await drain(consumer, 0.2)
    await consumer.seek(received[1].message_id)
    assert _numbers(await drain(consumer, 0.2)) == [2, 3, 4, 5, 6, 7]


async def test_a_durable_consumer_keeps_its_seek_filter_across_a_reconnect(broker, client):
    """As the C++ client (startMessageId_ is kept for a durable subscription): after the broker
    comes back, the unacknowledged message after the id comes again, the id does not."""
    ids = await _fill(client, 4)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    await drain(consumer, 0.2)
    await consumer.seek(ids[1])
    assert (await consumer.receive(5)).data == b"2"                  # not acknowledged
    await broker.restart()
    # (3, queued before the restart, may come twice: after a reconnect delivery is at least once)
    first = await consumer.receive(10)
    await consumer.acknowledge(first)
    assert set(_numbers([first, *await drain(consumer, 0.3)])) == {2, 3}


@pytest.mark.parametrize("inclusive, expected", [(True, [2, 3]), (False, [3])])
async def test_a_reader_seek_follows_its_start_message_id_inclusive(client, inclusive, expected):
    ids = await _fill(client, 4)
    reader = await client.create_reader(TOPIC, MessageId.earliest, start_message_id_inclusive=inclusive)
    assert len([await reader.read_next(5) for _ in range(4)]) == 4
    await reader.seek(ids[2])
    assert _numbers([await reader.read_next(5) for _ in expected]) == expected
    assert not await reader.has_message_available()


async def test_a_partitioned_consumer_seek_moves_the_ids_partition_only(broker, client):
    topic = f"{NS}/seek-parted"
    await broker.service.policies.create_partitioned_topic(topic, 2)
    producer = await client.create_producer(topic)
    ids = [await producer.send(b"%d" % i, key="k") for i in range(3)]   # one partition
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    assert len(await drain(consumer, 0.2)) == 3
    await consumer.seek(ids[0])
    assert _numbers(await drain(consumer, 0.2)) == [1, 2]
    other = 1 - ids[0].partition
    with pytest.raises(ValueError, match="is of .*seeking-partition-0, not of"):
        await consumer.seek(MessageId(ids[0].ledger_id, 0, partition=other,
                                      topic_name=f"{TOPIC}-partition-0"))


@pytest.mark.parametrize("target, error, says", [
    ("0", TypeError, "seek takes a MessageId or a timestamp in ms, not str"),
    (1.5, TypeError, "not float"),
    (None, TypeError, "not NoneType"),
    (True, TypeError, "not bool"),
    (-1, ValueError, "ms since the epoch, >= 0 and < 2\\*\\*64, not -1"),
    (1 << 64, ValueError, "ms since the epoch"),
    (MessageId(1, 2, topic_name=f"{NS}/another"), ValueError, f"is of {NS}/another, not of {TOPIC}"),
])
async def test_bad_seek_arguments_get_clear_errors(client, target, error, says):
    consumer = await client.subscribe(TOPIC, "s")
    with pytest.raises(error, match=says):
        await consumer.seek(target)
    several = await client.subscribe([TOPIC, f"{NS}/seeking-too"], "several")
    with pytest.raises((TypeError, ValueError)):
        await several.seek(target)


async def test_a_topics_consumer_checks_a_time_before_moving_any_topic(client):
    several = await client.subscribe([TOPIC, f"{NS}/seeking-too"], "several")
    with pytest.raises(ValueError, match="ms since the epoch"):
        await several.seek(1 << 64)


# --- the embedded client: the same -------------------------------------------------------------

async def test_the_embedded_consumer_and_reader_seek_as_the_network_ones(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        for first in (0, 3):                                     # two batches of 3
            await publish_batch(broker, producer, [b"%d" % i for i in range(first, first + 3)])
        consumer = await broker.subscribe(TOPIC, "s", initial_position="earliest")
        ids = [m.message_id for m in await drain(consumer, 0.2)]
        assert len(ids) == 6 and ids[1].batch_index == 1
        await consumer.seek(ids[1])                              # inside the first batch
        assert _numbers(await drain(consumer, 0.2)) == [2, 3, 4, 5]
        await consumer.seek(ids[3])                              # the first of the second
        assert _numbers(await drain(consumer, 0.2)) == [4, 5]
        await consumer.seek(MessageId.earliest)
        assert len(await drain(consumer, 0.2)) == 6
        reader = await broker.create_reader(TOPIC, MessageId.earliest)           # not start-inclusive
        assert len([await reader.read_next(2) for _ in range(6)]) == 6
        await reader.seek(ids[4])
        assert _numbers(await drain(reader, 0.2)) == [5]
        inclusive = await broker.create_reader(TOPIC, MessageId.earliest, start_message_id_inclusive=True)
        assert len([await inclusive.read_next(2) for _ in range(6)]) == 6
        await inclusive.seek(ids[4])
        assert _numbers(await drain(inclusive, 0.2)) == [4, 5]
        # a reader that starts inside a batch: as the network one, after (or at) the id
        assert _numbers(await drain(await broker.create_reader(TOPIC, ids[1]), 0.2)) == [2, 3, 4, 5]
        assert _numbers(await drain(await broker.create_reader(TOPIC, ids[1], start_message_id_inclusive=True),
                                    0.2)) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("target, error, says", [
    (True, TypeError, "seek takes a MessageId or a timestamp in ms, not bool"),
    ("0", TypeError, "not str"),
    (-1, ValueError, "ms since the epoch"),
    (MessageId(1, 2, topic_name=f"{NS}/another"), ValueError, f"is of {NS}/another, not of {TOPIC}"),
])
async def test_the_embedded_consumer_refuses_bad_seek_arguments(tmp_path, target, error, says):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await broker.subscribe(TOPIC, "s")
        with pytest.raises(error, match=says):
            await consumer.seek(target)
