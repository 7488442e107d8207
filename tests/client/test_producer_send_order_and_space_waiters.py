"""A producer's sends keep their order whatever the mix: a plain send made after a transactional
send held by the producer (behind a full queue, or its partition's registration with the
transaction) waits behind it; sends blocked on a full queue take the slots that free in their
send order, one wake-up per slot."""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace

import pytest

from pyengine.client.errors import MessageTooBigError, ProducerQueueIsFullError
from pyengine.client.handler import READY
from pyengine.client.producer import PartitionProducer, Producer, ProducerOptions
from pyengine.protocol import pulsar_api_pb2 as pb
from .conftest import answer_registrations_when_set, drain

NS = "persistent://public/default"


async def test_a_plain_send_waits_behind_a_txn_send_held_by_a_full_queue(client):
    topic = f"{NS}/order-held-by-full-queue"
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    producer = await client.create_producer(topic, max_pending_messages=1, block_if_queue_full=True)
    txn = await client.new_transaction()
    first = producer.send_async(b"p0")                      # the queue is full now
    held = producer.send_async(b"t", txn=txn)               # held: the queue is full
    assert producer._partitions[0]._held
    after = asyncio.ensure_future(producer.send(b"p1"))     # made after the txn send
    await asyncio.gather(first, held, after)
    await txn.commit()
    received = await drain(consumer, timeout=0.5)
    assert [m.data for m in received] == [b"p0", b"t", b"p1"]
    sequence_ids = [m.sequence_id for m in received]
    assert sequence_ids == sorted(sequence_ids) and len(set(sequence_ids)) == 3


async def test_a_plain_send_async_waits_behind_a_txn_send_held_for_its_registration(client, monkeypatch):
    topic = f"{NS}/order-held-by-registration"
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    producer = await client.create_producer(topic, max_pending_messages=1, block_if_queue_full=True)
    txn = await client.new_transaction()
    registered = answer_registrations_when_set(client, monkeypatch)
    await producer.send(b"p0")
    blocker = producer.send_async(b"p1")                    # the queue is full now
    held = producer.send_async(b"t", txn=txn)               # held: the queue is full
    await blocker                                           # room again; `t` still waits for its registration
    assert producer._partitions[0]._held
    after = producer.send_async(b"p2")                      # made after the txn send: queued behind it
    registered.set()
    await asyncio.gather(held, after)
    await txn.commit()
    received = await drain(consumer, timeout=0.5)
    assert [m.data for m in received] == [b"p0", b"p1", b"t", b"p2"]
    sequence_ids = [m.sequence_id for m in received]
    assert sequence_ids == sorted(sequence_ids) and len(set(sequence_ids)) == 4


# --- full queue, on a producer whose connection is a stub ---------------------------------------


class StubConnection:
    max_message_size = 5 * 1024 * 1024

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def write(self, frame: bytes) -> None:
        self.frames.append(frame)


class RecordingWaiters(deque):
    """The producer's space waiters, remembering every one it made (to count the wake-ups)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[asyncio.Future[None]] = []

    def append(self, waiter: asyncio.Future[None]) -> None:
        self.made.append(waiter)
        super().append(waiter)

    def appendleft(self, waiter: asyncio.Future[None]) -> None:
        self.made.append(waiter)
        super().appendleft(waiter)

    @property
    def woken(self) -> int:
        return sum(1 for waiter in self.made if waiter.done() and not waiter.cancelled())


def stub_producer(max_pending: int) -> tuple[Producer, PartitionProducer, StubConnection, RecordingWaiters]:
    core = SimpleNamespace(config=SimpleNamespace(initial_backoff=0.1, max_backoff=1.0), new_producer_id=lambda: 1)
    options = ProducerOptions(max_pending_messages=max_pending, block_if_queue_full=True, send_timeout_ms=0)
    part = PartitionProducer(core, f"{NS}/stub", -1, options)
    connection = StubConnection()
    part.connection, part.state, part.producer_name = connection, READY, "stub"
    waiters = part._space_waiters = RecordingWaiters()
    return Producer(core, f"{NS}/stub", [part], options, partitioned=False), part, connection, waiters


def receipt_for_head(part: PartitionProducer) -> None:
    sequence_id = part._pending[0].sequence_id
    part.on_send_receipt(pb.CommandSendReceipt(producer_id=part.producer_id, sequence_id=sequence_id,
                                               message_id=pb.MessageIdData(ledgerId=1, entryId=sequence_id)))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_blocked_sends_take_freed_slots_in_send_order_one_wake_up_each():
    producer, part, connection, waiters = stub_producer(max_pending=1)
    producer.send_async(b"m0")                              # the queue is full now
    sends = [asyncio.ensure_future(producer.send(b"m%d" % i)) for i in range(1, 6)]
    await settle()
    assert len(waiters) == 5
    completed: list[int] = []
    for index, send in enumerate(sends):
        send.add_done_callback(lambda _, index=index: completed.append(index))
    for freed in range(1, 6):
        receipt_for_head(part)                              # one slot frees
        await settle()
        assert waiters.woken == freed                       # one wake-up for one slot
        assert len(connection.frames) == freed + 1
    receipt_for_head(part)
    await settle()
    assert completed == [0, 1, 2, 3, 4]
    assert [frame[-2:] for frame in connection.frames] == [b"m%d" % i for i in range(6)]
    assert len(waiters.made) == 5                           # nobody went back to sleep


async def test_a_freed_slot_goes_to_the_blocked_send_not_to_a_later_one():
    producer, part, connection, waiters = stub_producer(max_pending=1)
    producer.send_async(b"m0")
    blocked = asyncio.ensure_future(producer.send(b"m1"))
    await settle()
    receipt_for_head(part)                                  # the slot is the blocked send's
    with pytest.raises(ProducerQueueIsFullError):
        producer.send_async(b"m2")                          # made later: it does not take it
    await settle()
    assert [frame[-2:] for frame in connection.frames] == [b"m0", b"m1"]
    receipt_for_head(part)
    await blocked


async def test_a_cancelled_blocked_send_passes_its_slot_on():
    producer, part, connection, waiters = stub_producer(max_pending=1)
    producer.send_async(b"m0")
    first = asyncio.ensure_future(producer.send(b"m1"))
    second = asyncio.ensure_future(producer.send(b"m2"))
    await settle()
    receipt_for_head(part)                                  # the slot is `first`'s ...
    first.cancel()                                          # ... which leaves before taking it
    await settle()
    assert first.cancelled()
    assert [frame[-2:] for frame in connection.frames] == [b"m0", b"m2"]
    receipt_for_head(part)
    await second
    assert part._pending_messages == 0 and not part._space_waiters


async def test_a_plain_send_given_up_while_held_is_not_sent():
    producer, part, connection, waiters = stub_producer(max_pending=1)
    txn = SimpleNamespace(txn_id=SimpleNamespace(most_bits=1, least_bits=2))
    registration = asyncio.get_running_loop().create_future()
    producer.send_async(b"m0")
    held = part.submit_in_txn(registration, b"t1", None, {}, None, None, txn)  # held: the queue is full
    given_up = asyncio.ensure_future(producer.send(b"m2"))                    # held behind it
    await settle()
    assert len(part._held) == 2
    given_up.cancel()
    registration.set_result(None)
    receipt_for_head(part)
    await settle()
    assert given_up.cancelled()
    assert [frame[-2:] for frame in connection.frames] == [b"m0", b"t1"]
    receipt_for_head(part)
    await held
    assert not part._held and part._pending_messages == 0


async def test_a_woken_send_that_fails_passes_its_slot_on():
    producer, part, connection, waiters = stub_producer(max_pending=1)
    producer.send_async(b"m0")
    too_big = asyncio.ensure_future(producer.send(b"x" * (StubConnection.max_message_size + 1)))
    second = asyncio.ensure_future(producer.send(b"m2"))
    await settle()
    receipt_for_head(part)                  # the slot is `too_big`'s, refused once woken: nothing is pending
    await settle()
    assert isinstance(too_big.exception(), MessageTooBigError)
    assert [frame[-2:] for frame in connection.frames] == [b"m0", b"m2"]
    receipt_for_head(part)
    await second
