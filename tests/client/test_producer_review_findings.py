"""Findings of a review of the network client's producer: each test failed on the code as
reviewed; the reference behaviour is the official clients' (pulsar-client-cpp, Java)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client
from pyengine.client.errors import MessageTooBigError
from pyengine.client.handler import FAILED, READY
from pyengine.errors import ProducerBusyError

from tests.waiting import eventually

from .conftest import NetworkBroker, drain
from .test_chunking import LIMIT, small_broker  # noqa: F401  (fixture)

NS = "persistent://public/default"


# --- 1. a producer created once is failed for good by a refusal on a reconnect ----------------


@pytest.fixture
async def one_producer_broker(tmp_path):
    async with NetworkBroker(tmp_path / "data", num_coordinators=1, max_producers_per_topic=1) as network_broker:
        yield network_broker


async def test_a_producer_refused_on_a_reconnect_keeps_retrying(one_producer_broker, monkeypatch):
    """pulsar-client-cpp ProducerImpl::handleCreateProducer: once the producer was created, a
    refused reconnect is retried whatever the error ("we need to retry connecting in any case"),
    except ProducerFenced and TopicTerminated. Here ProducerBusy (the topic's only producer slot
    taken meanwhile, by another client) fails the producer for good: its pending send fails and
    every later send raises, even once the slot is free again."""
    topic = f"{NS}/review-refused-on-reconnect"
    broker = one_producer_broker
    async with Client(broker.url, operation_timeout_seconds=10) as client, \
            Client(broker.url, operation_timeout_seconds=10) as other:
        producer = await client.create_producer(topic)
        await producer.send(b"first")
        part = producer._partitions[0]
        gate = asyncio.Event()
        connect_once = part._connect_once

        async def held() -> None:
            await gate.wait()                   # reconnects only once `other` holds the slot
            await connect_once()
        monkeypatch.setattr(part, "_connect_once", held)
        part.connection.close()                 # a network blip
        await eventually(lambda: part.state != READY)
        during = producer.send_async(b"during the outage")
        intruder = await other.create_producer(topic)      # takes the only producer slot
        gate.set()
        await eventually(lambda: part.state == FAILED or part._backoff._next > 0.2, timeout_s=5)
        await intruder.close()                  # the slot is free again
        # As the C++ client: it reconnects, the pending send goes out, later sends work.
        assert (await asyncio.wait_for(during, 10)).entry_id >= 0
        assert (await asyncio.wait_for(producer.send(b"after"), 10)).entry_id >= 0


# --- 2. an uncompressed batch over the broker's max_message_size is sent anyway ------------------


async def test_an_uncompressed_batch_over_the_size_limit_fails_locally(small_broker):  # noqa: F811
    """pulsar-client-cpp MessageAndCallbackBatch::createOpSendMsg (and Java's
    BatchMessageContainerImpl) fail a batch whose payload is over the broker's max message size
    with MessageTooBig, compressed or not. Here only a compressed batch is checked: an
    uncompressed one is written, and past the frame limit (max size + 10 KiB) the broker drops
    the connection; the producer reconnects and writes it again, for ever (its sends never
    settle, and every consumer sharing the connection is disconnected each time)."""
    topic = f"{NS}/review-uncompressed-batch-too-big"
    async with Client(small_broker.url, operation_timeout_seconds=10) as client:
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        producer = await client.create_producer(topic, batching_enabled=True, batching_max_messages=100,
                                                batching_max_allowed_size_in_bytes=1 << 20,
                                                batching_max_publish_delay_ms=50)
        body = b"x" * (LIMIT // 2)               # each one well under the limit
        sends = [producer.send_async(body) for _ in range(6)]  # one batch of 3 x LIMIT bytes
        results = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 5)
        assert all(isinstance(r, MessageTooBigError) for r in results), results
        assert (await producer.send(b"small")).entry_id >= 0
        assert [m.data for m in await drain(consumer, timeout=0.3)] == [b"small"]


# --- 3. a batch whose given sequence ids go down is never settled ------------------------------


async def test_a_batch_with_a_given_lower_sequence_id_is_settled_by_its_receipt(client):
    """The receipt of a batch carries its first sequence id. `on_send_receipt` takes one past
    the batch's *last* message's id for "the stream is not ours" and closes the connection; with
    sequence ids given by the caller, the last can be below the first (pulsar-client-cpp's
    ackReceived bounds the receipt by first + count - 1 instead). The producer then reconnects
    and resends the batch for ever: its sends never settle, the connection drops every ~100 ms."""
    topic = f"{NS}/review-batch-given-sequence-ids"
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=20)
    sends = [producer.send_async(b"a", sequence_id=10), producer.send_async(b"b", sequence_id=5)]
    ids = await asyncio.wait_for(asyncio.gather(*sends), 5)
    assert [i.batch_index for i in ids] == [0, 1]
    assert [m.data for m in await drain(consumer, timeout=0.3)] == [b"a", b"b"]


# --- 4. flush() waits for the batching delay when a send is held behind the open batch ----------


async def test_flush_sends_the_open_batch_even_with_a_send_held_behind_it(client):
    """`PartitionProducer.flush` waits for the held-send submitter *before* it sends the open
    batch. A transaction's send held because the queue is full (the open batch fills it) waits
    for room that only the open batch's receipt frees: flush() then sends nothing and returns
    only when the batching delay has passed (Java's and the C++ flush send the batch at once)."""
    topic = f"{NS}/review-flush-with-held"
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_messages=100,
                                            batching_max_publish_delay_ms=60_000, max_pending_messages=2)
    txn = await client.new_transaction()
    plain = [producer.send_async(b"p0"), producer.send_async(b"p1")]     # the open batch fills the queue
    held = producer.send_async(b"t", txn=txn)                              # held: the queue is full
    assert producer._partitions[0]._held
    try:
        await asyncio.wait_for(producer.flush(), 5)
    finally:
        producer._partitions[0]._flush_batch()      # (a failed run: no teardown wait for the delay)
    assert all(f.done() for f in plain) and held.done()
    await txn.commit()


# --- 5. an initial_sequence_id past the wire's range, and a batch that cannot be built -----------


async def test_an_initial_sequence_id_past_a_sends_range_is_refused(client):
    """`send(sequence_id=...)` is refused past 2**63 - 1 (Java's long); `initial_sequence_id`
    had no upper bound: 2**64 - 1 was accepted, the next sequence id (2**64) did not fit
    MessageMetadata.sequence_id (uint64), and the batched send never settled (below)."""
    topic = f"{NS}/review-initial-sequence-id-range"
    with pytest.raises(ValueError, match="initial_sequence_id"):
        await client.create_producer(topic, initial_sequence_id=2**64 - 1, batching_enabled=True)
    producer = await client.create_producer(topic, initial_sequence_id=2**63 - 2, batching_enabled=True)
    assert (await producer.send(b"x")).entry_id >= 0


async def test_a_batch_that_cannot_be_built_fails_its_sends(client, monkeypatch):
    """Building a batch raised in the batch timer's callback after the batch was taken off the
    producer: its futures were in no queue, so not even the send timeout settled them."""
    topic = f"{NS}/review-batch-build-failure"
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5,
                                            send_timeout_ms=500)
    part = producer._partitions[0]

    def broken(*args, **kwargs):
        raise ValueError("cannot build this batch")
    monkeypatch.setattr(part, "_batch_op", broken)
    sent = [producer.send_async(b"x"), producer.send_async(b"y")]
    done, _ = await asyncio.wait(sent, timeout=3)        # 6 x the send timeout
    assert len(done) == 2
    assert all(isinstance(f.exception(), ValueError) for f in sent)
    monkeypatch.undo()
    assert (await producer.send(b"z")).entry_id >= 0     # the producer goes on
