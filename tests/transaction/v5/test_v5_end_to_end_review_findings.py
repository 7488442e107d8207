"""End-to-end review of v5 (PIP-473) transactions on scalable topics through pyengine.client:
READ_COMMITTED visibility and exactly-once consume-transform-produce across splits, a broker
restart, a consumer reconnect, aborts and timeouts, as a user sees them."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.client import Client
from pyengine.errors import NotAllowedError, PulsarError
from pyengine.protocol.server import ProtocolServer

IN = "topic://public/default/in"
OUT = "topic://public/default/out"


class Broker:
    """An in-process broker on a fixed port and data dir that can be restarted."""

    def __init__(self, data_dir) -> None:
        self.data_dir = data_dir
        self.port = 0
        self.service: BrokerService | None = None
        self.server: ProtocolServer | None = None

    async def start(self) -> Broker:
        self.service = BrokerService(BrokerConfig(data_dir=self.data_dir, sync=False, num_coordinators=2,
                                                  txn_v5_sweep_interval_ms=100))
        await self.service.start()
        self.server = ProtocolServer(self.service, "127.0.0.1", self.port, liveness_timeout=0.5)
        await self.server.start()
        self.port = self.server.port
        self.service.service_url = f"pulsar://127.0.0.1:{self.port}"
        return self

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()
        if self.service is not None:
            await self.service.close()
        self.server = self.service = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"


@pytest.fixture
async def broker(tmp_path):
    broker = await Broker(tmp_path / "data").start()
    yield broker
    await broker.stop()


@pytest.fixture
async def client(broker):
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        yield client


async def drain(consumer, wait: float = 0.5) -> list:
    got = []
    while True:
        try:
            got.append(await consumer.receive(timeout=wait))
        except (TimeoutError, asyncio.TimeoutError):
            return got


async def ack_all(consumer, messages) -> None:
    for message in messages:
        await consumer.acknowledge(message)


async def transform(client, source, sink, count: int, *, ack_in_txn: bool = True, during=None):
    """One consume-transform-produce txn of `count` messages; `during()` runs halfway."""
    txn = await client.new_transaction(scalable=True)
    taken = []
    for i in range(count):
        message = await source.receive(timeout=5)
        taken.append(message)
        await sink.send(b"out-" + message.data, key=message.key, txn=txn)
        await source.acknowledge(message, txn=txn)
        if i == count // 2 and during is not None:
            await during()
    return txn, taken


async def test_v4_txn_on_a_segment_and_v5_txn_on_persistent_are_refused(client, broker):
    """A clear refusal, naming the design the topic takes; the refused txn does not commit."""
    scalable = await broker.service.scalable_topics()
    await scalable.create_topic(IN, 1)
    producer = await client.create_producer(IN)
    await producer.send(b"plain", key="k")
    queue = await client.subscribe_queue(IN, "q")
    plain_message = await queue.receive(timeout=5)
    v4 = await client.new_transaction()
    with pytest.raises(NotAllowedError, match="v5 .*transactions only.*v4 transaction"):
        await producer.send(b"x", key="k", txn=v4)
    with pytest.raises(NotAllowedError, match="v4 transaction"):
        await queue.acknowledge(plain_message, txn=v4)
    with pytest.raises(NotAllowedError):
        await v4.commit()
    plain = await client.create_producer("persistent://public/default/p")
    v5 = await client.new_transaction(scalable=True)
    with pytest.raises(NotAllowedError, match="v4 transactions only.*v5"):
        await plain.send(b"x", txn=v5)
    with pytest.raises(NotAllowedError):
        await v5.commit()
    assert [m.data for m in await drain(queue, 0.3)] == []


async def test_consume_transform_produce_across_splits_of_both_topics(client, broker):
    """Input split and output split mid-txn; a committed txn's outputs appear once, an aborted
    one's never, its input acks released, and the input is drained at the end. Went wrong: a
    QueueConsumer had no redeliver_unacknowledged_messages, so the messages an abort released
    never came again to the consumer that held them (only a close gave them back); redelivering
    on its segments' consumers instead sent twice the messages queued in the QueueConsumer."""
    scalable = await broker.service.scalable_topics()
    await scalable.create_topic(IN, 2)
    await scalable.create_topic(OUT, 2)
    feed = await client.create_producer(IN)
    keys = [f"k{i}" for i in range(40)]
    for key in keys:
        await feed.send(key.encode(), key=key)
    source = await client.subscribe_queue(IN, "work")
    sink = await client.create_producer(OUT)
    audit = await client.subscribe_queue(OUT, "audit")

    async def split_both():
        await scalable.split_segment(IN, 0)
        await scalable.split_segment(OUT, 1)

    txn, first = await transform(client, source, sink, 20, during=split_both)
    assert await drain(audit, 0.3) == []                       # nothing before the commit
    await txn.commit()
    # an aborted one: outputs never show, its inputs come again (the same consumer asks)
    txn2, second = await transform(client, source, sink, 10)
    await txn2.abort()
    assert await drain(audit, 0.5) != []                       # the committed ones
    await source.redeliver_unacknowledged_messages()
    rest = await drain(source, 1.0)
    assert Counter(m.data for m in rest) == Counter(k.encode() for k in keys) - Counter(m.data for m in first)
    txn3 = await client.new_transaction(scalable=True)
    for message in rest:
        await sink.send(b"out-" + message.data, key=message.key, txn=txn3)
        await source.acknowledge(message, txn=txn3)
    await txn3.commit()
    outputs = Counter(m.data for m in await drain(audit, 1.0))
    checker = await client.subscribe_queue(OUT, "check")
    everything = Counter(m.data for m in await drain(checker, 1.0))
    assert everything == Counter(b"out-" + k.encode() for k in keys), everything
    assert set(outputs) <= set(everything)
    await source.close()
    again = await client.subscribe_queue(IN, "work")
    assert await drain(again, 1.0) == []                      # every input acked exactly once


async def test_consume_transform_produce_across_a_broker_restart(client, broker):
    """A txn open across a broker restart: its sends and acks before and after commit together."""
    scalable = await broker.service.scalable_topics()
    await scalable.create_topic(IN, 2)
    await scalable.create_topic(OUT, 2)
    feed = await client.create_producer(IN)
    keys = [f"k{i}" for i in range(20)]
    for key in keys:
        await feed.send(key.encode(), key=key)
    source = await client.subscribe_queue(IN, "work")
    sink = await client.create_producer(OUT)
    audit = await client.subscribe_queue(OUT, "audit")
    txn, taken = await transform(client, source, sink, 20, during=broker.restart)
    assert await drain(audit, 0.3) == []
    await txn.commit()
    got = Counter(m.data for m in await drain(audit, 2.0))
    assert got == Counter(b"out-" + k.encode() for k in keys), got
    await source.close()
    again = await client.subscribe_queue(IN, "work")
    assert await drain(again, 1.0) == []


async def test_abort_gives_the_acked_messages_to_another_consumer(client, broker):
    """Acks of an aborted txn are released: after the first consumer goes, another gets them."""
    scalable = await broker.service.scalable_topics()
    await scalable.create_topic(IN, 2)
    feed = await client.create_producer(IN)
    for i in range(10):
        await feed.send(b"m%d" % i, key=f"k{i}")
    first = await client.subscribe_queue(IN, "work")
    got = await drain(first, 0.5)
    assert len(got) == 10
    txn = await client.new_transaction(scalable=True)
    for message in got:
        await first.acknowledge(message, txn=txn)
    await scalable.split_segment(IN, 0)                       # seals a segment acked on
    await txn.abort()
    second = await client.subscribe_queue(IN, "work")
    await first.close()                                       # a consumer reconnect: all come again
    again = await drain(second, 1.0)
    assert Counter(m.data for m in again) == Counter(m.data for m in got)


async def test_timeout_while_a_split_is_under_way(client, broker):
    """A txn timing out around a split: none of its messages ever show, its acks are released."""
    scalable = await broker.service.scalable_topics()
    await scalable.create_topic(IN, 2)
    feed = await client.create_producer(IN)
    for i in range(6):
        await feed.send(b"plain%d" % i, key=f"k{i}")
    reader = await client.subscribe_queue(IN, "r")
    plain = await drain(reader, 0.5)
    txn = await client.new_transaction(timeout_ms=600, scalable=True)
    for i in range(6):
        await feed.send(b"t%d" % i, key=f"k{i}", txn=txn)
    for message in plain:
        await reader.acknowledge(message, txn=txn)
    split = asyncio.ensure_future(scalable.split_segment(IN, 0))
    await asyncio.sleep(1.0)
    await split
    with pytest.raises(PulsarError):
        await feed.send(b"late", key="k0", txn=txn)
    watcher = await client.subscribe_queue(IN, "w")
    seen = [m.data for m in await drain(watcher, 1.0)]
    assert not [d for d in seen if d.startswith(b"t")], seen
    await reader.close()
    reader = await client.subscribe_queue(IN, "r")
    assert Counter(m.data for m in await drain(reader, 1.0)) == Counter(m.data for m in plain)


async def test_stream_consumer_gets_the_messages_of_an_aborted_ack_again(client, broker):
    """A StreamConsumer whose txn acks were aborted gets those messages again, in key order,
    once, without closing. Went wrong: it had no redeliver_unacknowledged_messages at all."""
    scalable = await broker.service.scalable_topics()
    await scalable.create_topic(IN, 1)
    feed = await client.create_producer(IN)
    for i in range(10):
        await feed.send(b"m%d" % i, key="k")
    stream = await client.subscribe_stream(IN, "ordered", "c1")
    first = [await stream.receive(timeout=5) for _ in range(4)]
    txn = await client.new_transaction(scalable=True)
    for message in first:
        await stream.acknowledge(message, txn=txn)
    await txn.abort()
    await stream.redeliver_unacknowledged_messages()
    again = [m.data for m in await drain(stream, 1.0)]
    assert again == [b"m%d" % i for i in range(10)], again


async def test_consumer_reconnect_mid_transaction_is_exactly_once(client, broker):
    """The input consumer goes away mid-txn: what the open txn acked is not given to the next
    consumer (pending acks), the rest is; commit of both txns gives every output exactly once."""
    scalable = await broker.service.scalable_topics()
    await scalable.create_topic(IN, 2)
    await scalable.create_topic(OUT, 1)
    feed = await client.create_producer(IN)
    keys = [f"k{i}" for i in range(20)]
    for key in keys:
        await feed.send(key.encode(), key=key)
    source = await client.subscribe_queue(IN, "work", receiver_queue_size=5)
    sink = await client.create_producer(OUT)
    txn, taken = await transform(client, source, sink, 8)
    await source.close()
    await scalable.split_segment(OUT, 0)                       # the output splits meanwhile
    source = await client.subscribe_queue(IN, "work")
    rest = await drain(source, 1.0)
    assert Counter(m.data for m in rest) == Counter(k.encode() for k in keys) - Counter(m.data for m in taken)
    txn2 = await client.new_transaction(scalable=True)
    for message in rest:
        await sink.send(b"out-" + message.data, key=message.key, txn=txn2)
        await source.acknowledge(message, txn=txn2)
    await txn2.commit()
    await txn.commit()
    checker = await client.subscribe_queue(OUT, "check")
    assert Counter(m.data for m in await drain(checker, 1.0)) == Counter(b"out-" + k.encode() for k in keys)
    await source.close()
    source = await client.subscribe_queue(IN, "work")
    assert await drain(source, 1.0) == []


async def test_stream_consumer_ctp_with_a_split_of_the_input_and_an_abort(client, broker):
    """An ordered consumer's txn acks on a parent sealed mid-txn: aborted, the parent's messages
    come again (and its children wait); committed, the children follow, each key in order."""
    scalable = await broker.service.scalable_topics()
    await scalable.create_topic(IN, 1)
    await scalable.create_topic(OUT, 1)
    feed = await client.create_producer(IN)
    keys = [f"k{i}" for i in range(6)]
    for round_ in range(2):
        for key in keys:
            await feed.send(b"%s-%d" % (key.encode(), round_), key=key)
    stream = await client.subscribe_stream(IN, "ordered", "c1")
    sink = await client.create_producer(OUT)
    txn = await client.new_transaction(scalable=True)
    first = [await stream.receive(timeout=5) for _ in range(12)]
    for message in first[:6]:
        await sink.send(b"out-" + message.data, key=message.key, txn=txn)
        await stream.acknowledge(message, txn=txn)
    await scalable.split_segment(IN, 0)
    await feed.watch.wait_newer_than(0, 5)
    for key in keys:
        await feed.send(b"%s-2" % key.encode(), key=key)
    for message in first[6:]:
        await sink.send(b"out-" + message.data, key=message.key, txn=txn)
        await stream.acknowledge(message, txn=txn)
    await txn.abort()
    await stream.redeliver_unacknowledged_messages()
    again = [m for m in await drain(stream, 1.0)]
    assert [m.data for m in again] == [m.data for m in first]
    txn = await client.new_transaction(scalable=True)
    for message in again:
        await sink.send(b"out-" + message.data, key=message.key, txn=txn)
        await stream.acknowledge(message, txn=txn)
    await txn.commit()
    later = []
    while True:
        try:
            message = await stream.receive(timeout=3)
        except (TimeoutError, asyncio.TimeoutError):
            break
        later.append(message)
        await stream.acknowledge(message)
    assert Counter(m.data for m in later) == Counter(b"%s-2" % k.encode() for k in keys)
    checker = await client.subscribe_queue(OUT, "check")
    outputs = [m.data for m in await drain(checker, 1.0)]
    assert Counter(outputs) == Counter(b"out-" + m.data for m in first), outputs
