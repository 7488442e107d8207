"""Seek in `pyengine.client` and in the official `pulsar-client` (3.13, the C++ client), side by
side on the same topics of one `pyengine serve`: after each kind of seek both receive the same
messages. The broker moves the cursor to the id's entry (Pulsar's resetCursor) and the client
drops what comes before the id, and the id itself unless start-inclusive (a reader's setting;
never for a consumer): so after a seek to a message a consumer gets the ones after it."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import pulsar
import pytest

from pyengine.client import Client, MessageId
from pyengine.client.chunks import ChunkMessageId
from pyengine.testing import ServeProcess

NS = "persistent://public/default"
QUIET_MS = 300                      # no message within this: nothing more comes

# What to seek to: ("id", i) the i-th received message's id, ("time", i) its publish time,
# ("earliest",) / ("latest",).
Target = tuple[str] | tuple[str, int]


def produce(official: pulsar.Client, topic: str, count: int, *, batch: int = 0, prefix: bytes = b"") -> None:
    """`count` messages b"0", b"1", ... (after `prefix`); in batches of `batch` messages if
    given. Publish times differ (a seek by time finds the first message at or after one)."""
    if not batch:
        producer = official.create_producer(topic, batching_enabled=False)
        for i in range(count):
            producer.send(prefix + b"%d" % i)
            time.sleep(0.002)
    else:
        producer = official.create_producer(topic, batching_enabled=True, batching_max_messages=batch,
                                            batching_max_publish_delay_ms=60_000)
        for i in range(count):
            producer.send_async(prefix + b"%d" % i, None)
            if (i + 1) % batch == 0:
                producer.flush()
                time.sleep(0.002)
        producer.flush()
    producer.close()


def theirs(official: pulsar.Client, topic: str | list[str], count: int, target: Target, *,
           reader_inclusive: bool | None = None, name: str = "theirs") -> tuple[bytes, list[bytes]]:
    """The official client: receive `count` messages, seek to `target`; the target message's
    data (a time's or an id's) and what comes then."""
    if reader_inclusive is None:
        consumer = official.subscribe(topic, name, initial_position=pulsar.InitialPosition.Earliest)
        take: Callable[[int], pulsar.Message] = lambda ms: consumer.receive(timeout_millis=ms)
    else:
        consumer = official.create_reader(topic, pulsar.MessageId.earliest,
                                          start_message_id_inclusive=reader_inclusive)
        take = lambda ms: consumer.read_next(timeout_millis=ms)
    received = [take(5000) for _ in range(count)]
    if reader_inclusive is None:
        for message in received:
            consumer.acknowledge(message)
    kind = target[0]
    seeked = received[target[1]].data() if kind in ("id", "time") else b""
    consumer.seek(received[target[1]].message_id() if kind == "id"
                  else received[target[1]].publish_timestamp() if kind == "time"
                  else pulsar.MessageId.earliest if kind == "earliest" else pulsar.MessageId.latest)
    after = []
    while True:
        try:
            after.append(take(QUIET_MS).data())
        except pulsar.Timeout:
            consumer.close()
            return seeked, after


async def _ours(url: str, topic: str | list[str], count: int, target: Target,
                reader_inclusive: bool | None, name: str) -> tuple[bytes, list[bytes]]:
    async with Client(url, operation_timeout_seconds=10) as client:
        if reader_inclusive is None:
            consumer = await client.subscribe(topic, name, initial_position="earliest")
        else:
            consumer = await client.create_reader(topic, MessageId.earliest,
                                                  start_message_id_inclusive=reader_inclusive)
        received = [await consumer.receive(5) for _ in range(count)]
        if reader_inclusive is None:
            for message in received:
                await consumer.acknowledge(message)
        kind = target[0]
        seeked = received[target[1]].data if kind in ("id", "time") else b""
        await consumer.seek(received[target[1]].message_id if kind == "id"
                            else received[target[1]].publish_time if kind == "time"
                            else MessageId.earliest if kind == "earliest" else MessageId.latest)
        after = []
        while True:
            try:
                after.append((await consumer.receive(QUIET_MS / 1000)).data)
            except TimeoutError:
                return seeked, after


def ours(broker: ServeProcess, topic: str | list[str], count: int, target: Target, *,
         reader_inclusive: bool | None = None, name: str = "ours") -> tuple[bytes, list[bytes]]:
    return asyncio.run(_ours(broker.url, topic, count, target, reader_inclusive, name))


def numbers(data: list[bytes]) -> list[int]:
    return [int(d) for d in data]


@pytest.mark.parametrize("batch, target, expected", [
    (0, ("id", 3), [4, 5, 6, 7, 8, 9]),              # the id's own message does not come again
    (0, ("id", 9), []),
    (0, ("id", 0), list(range(1, 10))),
    (5, ("id", 2), [3, 4, 5, 6, 7, 8, 9]),           # inside a batch: the rest of it, then on
    (5, ("id", 4), [5, 6, 7, 8, 9]),                 # the last of a batch
    (5, ("id", 5), [6, 7, 8, 9]),                    # the first of a batch
    (0, ("earliest",), list(range(10))),
    (5, ("earliest",), list(range(10))),
    (0, ("latest",), []),
    (0, ("time", 3), [3, 4, 5, 6, 7, 8, 9]),         # a time: from the first message at or after it
    (5, ("time", 7), [5, 6, 7, 8, 9]),               # a time inside a batch: its whole entry
])
def test_a_consumer_gets_the_same_messages_after_a_seek(broker, official, batch, target, expected):
    topic = f"{NS}/seek-consumer-{batch}-{'-'.join(map(str, target))}"
    produce(official, topic, 10, batch=batch)
    assert numbers(theirs(official, topic, 10, target)[1]) == expected
    assert numbers(ours(broker, topic, 10, target)[1]) == expected


@pytest.mark.parametrize("inclusive", [False, True])
@pytest.mark.parametrize("batch, target, exclusive_expected", [
    (0, ("id", 3), [4, 5]),
    (3, ("id", 1), [2, 3, 4, 5]),                    # inside a batch
    (0, ("earliest",), [0, 1, 2, 3, 4, 5]),
    (0, ("time", 2), [2, 3, 4, 5]),
])
def test_a_reader_seek_follows_its_start_message_id_inclusive(broker, official, inclusive, batch, target,
                                                              exclusive_expected):
    topic = f"{NS}/seek-reader-{inclusive}-{batch}-{'-'.join(map(str, target))}"
    produce(official, topic, 6, batch=batch)
    expected = ([target[1]] + exclusive_expected if inclusive and target[0] == "id" else exclusive_expected)
    assert numbers(theirs(official, topic, 6, target, reader_inclusive=inclusive)[1]) == expected
    assert numbers(ours(broker, topic, 6, target, reader_inclusive=inclusive)[1]) == expected


def test_a_seek_to_an_id_moves_only_its_partition(broker, official):
    broker.admin("PUT", "/admin/v2/persistent/public/default/seek-parted/partitions", 2)
    topic = f"{NS}/seek-parted"
    producer = official.create_producer(topic, batching_enabled=False,
                                        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(8):
        producer.send(b"%d" % i)
    # round robin: i and i + 2 are on one partition; the seek's message comes again on neither
    for after_seek in (theirs(official, topic, 8, ("id", 2)), ours(broker, topic, 8, ("id", 2))):
        seeked, after = int(after_seek[0]), numbers(after_seek[1])
        assert sorted(after) == list(range(seeked + 2, 8, 2))
    for what, expected in ((("earliest",), list(range(8))), (("latest",), [])):    # every partition
        assert sorted(numbers(theirs(official, topic, 8, what, name=f"t-{what[0]}")[1])) == expected
        assert sorted(numbers(ours(broker, topic, 8, what, name=f"o-{what[0]}")[1])) == expected


def test_a_consumer_of_several_topics_moves_the_ids_topic_only(broker, official):
    topics = [f"{NS}/seek-multi-a", f"{NS}/seek-multi-b"]
    for topic, prefix in zip(topics, (b"a", b"b")):
        produce(official, topic, 3, prefix=prefix)
    for after_seek in (theirs(official, topics, 6, ("id", 3)), ours(broker, topics, 6, ("id", 3))):
        seeked, after = after_seek
        assert after == [seeked[:1] + b"%d" % i for i in range(int(seeked[1:]) + 1, 3)]
    everything = sorted(p + b"%d" % i for p in (b"a", b"b") for i in range(3))
    assert sorted(theirs(official, topics, 6, ("earliest",), name="t2")[1]) == everything
    assert sorted(ours(broker, topics, 6, ("earliest",), name="o2")[1]) == everything
    assert theirs(official, topics, 6, ("latest",), name="t3")[1] == ours(broker, topics, 6, ("latest",),
                                                                            name="o3")[1] == []


async def _seek_chunked(url: str, topic: str) -> tuple[ChunkMessageId, list[bytes]]:
    async with Client(url, operation_timeout_seconds=10) as client:
        producer = await client.create_producer(topic, chunking_enabled=True)
        await producer.send(b"before")
        sent = await producer.send(os.urandom(6 * 1024 * 1024))       # two chunks of at most 5 MiB
        await producer.send(b"after")
        consumer = await client.subscribe(topic, "ours", initial_position="earliest")
        assert (await consumer.receive(5)).data == b"before"
        assert (await consumer.receive(5)).message_id == sent
        await consumer.seek(sent)
        return sent, [(await consumer.receive(5)).data[:16]]          # the chunked message: cut short


def test_a_seek_to_a_chunked_message_gets_the_ones_after_it(broker, official):
    topic = f"{NS}/seek-chunked"
    consumer = official.subscribe(topic, "theirs", initial_position=pulsar.InitialPosition.Earliest)
    sent, ours_after = asyncio.run(_seek_chunked(broker.url, topic))
    assert isinstance(sent, ChunkMessageId) and len(sent.chunk_ids) == 2
    assert ours_after == [b"after"]
    received = [consumer.receive(timeout_millis=5000) for _ in range(3)]
    consumer.seek(received[1].message_id())
    assert consumer.receive(timeout_millis=5000).data()[:16] == b"after"
