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
from pyengine.client.message import decode_entry
from pyengine.client.producer import PartitionProducer, Producer, ProducerOptions
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine_kernels import Position
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


def stub_producer(max_pending: int, **options: object) -> tuple[Producer, PartitionProducer, StubConnection,
                                                                RecordingWaiters]:
    core = SimpleNamespace(config=SimpleNamespace(initial_backoff=0.1, max_backoff=1.0), new_producer_id=lambda: 1)
    options = ProducerOptions(**{"max_pending_messages": max_pending, "block_if_queue_full": True,
                                 "send_timeout_ms": 0, **options})
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


# --- sends given up while held: never written ---------------------------------------------------
# As Pulsar's Java and C++ producers, which fail a timed-out message and never send it if it
# was not sent yet: a send cancelled or timed out while the producer holds it (behind a full
# queue, or its transaction's unanswered ADD_PARTITION_TO_TXN) is not written.

STUB_TXN = SimpleNamespace(txn_id=SimpleNamespace(most_bits=1, least_bits=2))


def sent_payloads(connection: StubConnection) -> list[bytes]:
    """The data of each SEND written, in order (a batch's as its messages' joined by "+")."""
    payloads = []
    for frame in connection.frames:
        command_size = int.from_bytes(frame[4:8], "big")
        messages = decode_entry(f"{NS}/stub", Position(0, 0), frame[8 + command_size:])
        payloads.append(b"+".join(m.data for m in messages))
    return payloads


async def test_a_txn_send_cancelled_while_held_by_a_full_queue_is_not_sent():
    producer, part, connection, _ = stub_producer(max_pending=1)
    registration = asyncio.get_running_loop().create_future()
    registration.set_result(None)
    producer.send_async(b"m0")                                              # the queue is full now
    given_up = part.submit_in_txn(registration, b"t1", None, {}, None, None, STUB_TXN)     # held
    after = part.submit_in_txn(registration, b"t2", None, {}, None, None, STUB_TXN)        # held behind it
    plain = asyncio.ensure_future(producer.send(b"m3"))                     # behind both
    await settle()
    assert len(part._held) == 3
    given_up.cancel()
    receipt_for_head(part)                                                  # room for one
    await settle()
    assert sent_payloads(connection) == [b"m0", b"t2"]
    receipt_for_head(part)
    await after
    await settle()
    receipt_for_head(part)
    await plain
    assert sent_payloads(connection) == [b"m0", b"t2", b"m3"]
    assert not part._held and part._pending_messages == 0


async def test_a_txn_send_cancelled_while_its_registration_is_unanswered_is_not_sent():
    producer, part, connection, _ = stub_producer(max_pending=10)
    registration = asyncio.get_running_loop().create_future()
    given_up = part.submit_in_txn(registration, b"t1", None, {}, None, None, STUB_TXN)     # blocked
    kept = part.submit_in_txn(registration, b"t2", None, {}, None, None, STUB_TXN)
    plain = producer.send_async(b"m3")                                      # blocked behind them
    given_up_plain = producer.send_async(b"m4")
    assert connection.frames == [] and part._pending_messages == 4
    given_up.cancel()
    given_up_plain.cancel()
    registration.set_result(None)
    await settle()
    assert sent_payloads(connection) == [b"t2", b"m3"]
    assert part._pending_messages == 2
    receipt_for_head(part)
    receipt_for_head(part)
    await asyncio.gather(kept, plain)
    assert part._pending_messages == 0


async def test_a_batch_built_while_its_registration_is_unanswered_is_sent_without_its_cancelled_sends():
    producer, part, connection, _ = stub_producer(max_pending=10, batching_enabled=True, batching_max_messages=3,
                                                  batching_max_publish_delay_ms=60_000)
    registration = asyncio.get_running_loop().create_future()
    sends = [part.submit_in_txn(registration, b"t%d" % i, None, {}, None, None, STUB_TXN) for i in range(3)]
    assert len(part._blocked) == 1                                          # full: built, waiting to be written
    sends[1].cancel()
    registration.set_result(None)
    await settle()
    assert sent_payloads(connection) == [b"t0+t2"]
    command_size = int.from_bytes(connection.frames[0][4:8], "big")
    send = pb.BaseCommand.FromString(connection.frames[0][8:8 + command_size]).send
    assert (send.sequence_id, send.highest_sequence_id, send.num_messages) == (0, 2, 2)
    receipt_for_head(part)
    ids = await asyncio.gather(sends[0], sends[2])
    assert [(i.batch_index, i.batch_size) for i in ids] == [(0, 2), (1, 2)]
    assert part._pending_messages == 0


async def test_a_batch_whose_sends_are_all_cancelled_while_held_is_not_sent():
    producer, part, connection, _ = stub_producer(max_pending=10, batching_enabled=True, batching_max_messages=2,
                                                  batching_max_publish_delay_ms=60_000)
    registration = asyncio.get_running_loop().create_future()
    sends = [part.submit_in_txn(registration, b"t%d" % i, None, {}, None, None, STUB_TXN) for i in range(2)]
    for send in sends:
        send.cancel()
    registration.set_result(None)
    await settle()
    assert connection.frames == [] and part._pending_messages == 0 and not part._blocked


async def test_held_sends_that_time_out_fail_and_are_never_sent():
    producer, part, connection, _ = stub_producer(max_pending=1, send_timeout_ms=100)
    registration = asyncio.get_running_loop().create_future()
    registration.set_result(None)
    first = producer.send_async(b"m0")                                      # no receipt comes
    held = part.submit_in_txn(registration, b"t1", None, {}, None, None, STUB_TXN)         # held: queue full
    plain = asyncio.ensure_future(producer.send(b"m2"))                     # held behind it
    for future in (first, held, plain):
        with pytest.raises(TimeoutError):
            await future
    await settle()
    assert sent_payloads(connection) == [b"m0"]
    assert not part._held and part._pending_messages == 0


async def test_sends_held_for_a_registration_time_out_and_the_held_queue_goes_on():
    producer, part, connection, _ = stub_producer(max_pending=1, send_timeout_ms=100)
    registration = asyncio.get_running_loop().create_future()
    producer.send_async(b"m0")                                              # no receipt comes
    held = part.submit_in_txn(registration, b"t1", None, {}, None, None, STUB_TXN)         # held: queue full
    submitter = part._held_submitter
    with pytest.raises(TimeoutError):
        await held
    registration.set_result(None)
    await asyncio.wait({submitter}, timeout=5)
    assert submitter.done() and submitter.exception() is None
    later = part.submit_in_txn(registration, b"t3", None, {}, None, None, STUB_TXN)
    receipt_for_head(part)
    assert (await later).entry_id >= 0
    assert sent_payloads(connection) == [b"m0", b"t3"]


async def test_a_send_blocked_only_by_its_registration_times_out_and_is_never_sent():
    producer, part, connection, _ = stub_producer(max_pending=10, send_timeout_ms=100)
    registration = asyncio.get_running_loop().create_future()
    blocked = part.submit_in_txn(registration, b"t1", None, {}, None, None, STUB_TXN)
    assert part._blocked and not part._pending
    await asyncio.wait({blocked}, timeout=5)
    assert isinstance(blocked.exception(), TimeoutError)
    registration.set_result(None)
    await settle()
    assert connection.frames == [] and part._pending_messages == 0


async def test_a_plain_send_cancelled_while_waiting_for_room_is_not_sent():
    producer, part, connection, waiters = stub_producer(max_pending=1)
    producer.send_async(b"m0")
    given_up = asyncio.ensure_future(producer.send(b"m1"))
    after = asyncio.ensure_future(producer.send(b"m2"))
    await settle()
    given_up.cancel()                                       # before any room frees
    await settle()
    assert given_up.cancelled() and len(waiters) == 1
    receipt_for_head(part)
    await settle()
    assert sent_payloads(connection) == [b"m0", b"m2"]
    receipt_for_head(part)
    await after
    assert part._pending_messages == 0 and part._space_granted == 0


async def test_a_chunked_txn_send_cancelled_while_its_registration_is_unanswered_sends_no_chunk():
    producer, part, connection, _ = stub_producer(max_pending=10, chunking_enabled=True)
    connection.max_message_size = part.max_message_size = 200        # as the broker's CONNECTED said
    registration = asyncio.get_running_loop().create_future()
    given_up = part.submit_in_txn(registration, b"x" * 500, None, {}, None, None, STUB_TXN)
    assert len(part._blocked) >= 3                                          # one per chunk
    given_up.cancel()
    registration.set_result(None)
    await settle()
    assert connection.frames == [] and part._pending_messages == 0 and not part._blocked
