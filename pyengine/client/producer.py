"""Producers: sequence ids, a pending queue, batching, reconnect with resend, partitions.

A `PartitionProducer` is one broker-side producer on one topic or partition. Every message it
accepts gets the next sequence id and joins the pending queue; SEND_RECEIPTs settle the queue
from its head, in order (the broker answers a producer's sends in order). When the connection
breaks, the producer re-creates itself on the broker (same id and name, next epoch) and resends
everything still pending with its original sequence ids, so a broker with de-duplication stores
each message once. `Producer` is the public object: one partition producer, or one per partition
of a partitioned topic with Pulsar's routing.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cramjam

from core_ext.frames import encode_payload_frame
from pyengine.client.batch import BatchContainer, plain_single_metadata
from pyengine.client.backoff import every
from pyengine.client.chunks import ChunkMessageId
from pyengine.client.connection import DEFAULT_MAX_MESSAGE_SIZE, ClientConnection
from pyengine.client.errors import AlreadyClosedError, ConnectError, MessageTooBigError, ProducerQueueIsFullError
from pyengine.client.handler import CLOSED, CLOSING, FAILED, READY, ConnectionHandler, close_all
from pyengine.client.key_batching import BatchingType, KeyBasedBatches, check_batching_type
from pyengine.client.message import MessageId
from pyengine.concurrency import RunOnce
from pyengine.client.router import PartitionRouter, check_hashing_scheme
from pyengine.client.transaction import COMMITTING, OPEN, Transaction, check_same_client
from pyengine.client.validation import (
    check_int, check_name, check_payload, check_schema, check_send_fields, option_name,
)
from pyengine.errors import ChecksumError, NotAllowedError, PulsarError, TopicTerminatedError
from pyengine.naming import TopicName
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command
from pyengine.protocol.schema_codec import fill_schema
from pyengine.schema import SchemaData, decode_version

if TYPE_CHECKING:
    from pyengine.client.client import ClientCore

log = logging.getLogger(__name__)

T = pb.BaseCommand
SendCallback = Callable[[BaseException | None, MessageId | None], None]
# SEND_ERRORs that reject one message (the C++ client keeps the connection for ChecksumError
# and NotAllowedError); the transaction codes reject a send to an ended or unknown transaction.
_UNUSABLE = frozenset({CLOSING, CLOSED, FAILED})
# SEND_ERRORs that reject that send only (the connection stays: reconnecting would make every
# consumer sharing it redeliver its unacknowledged messages). A terminated topic rejects every
# send, as Pulsar's producer fails them with TopicTerminatedException without reconnecting (a
# scalable topic's producer then re-routes them to the segment's children).
_REJECTING = frozenset({pb.ChecksumError, pb.NotAllowedError, pb.InvalidTxnStatus, pb.TransactionNotFound,
                        pb.TransactionConflict, pb.ExpiredTransaction, pb.TopicTerminatedError})


class CompressionType(enum.IntEnum):
    """Pulsar's compression codecs (MessageMetadata.compression), as pulsar-client names them
    (`CompressionType.ZLib` is `ZLIB`). `create_producer(compression_type=...)` takes one of
    these, its name as a string (any case: "lz4", "ZSTD"), or pulsar-client's own enum."""

    NONE = 0
    LZ4 = 1
    ZLIB = 2
    ZSTD = 3
    SNAPPY = 4
    ZLib = 2                                     # pulsar-client's spelling (an alias of ZLIB)


_COMPRESSION_NAMES = {member.name.lower(): member for member in CompressionType}


def check_compression_type(value: Any) -> CompressionType:
    """The CompressionType `value` names: a CompressionType, its name as a string (any case),
    or pulsar-client's `pulsar.CompressionType` (matched by name, not imported)."""
    if isinstance(value, CompressionType):
        return value
    codec = _COMPRESSION_NAMES.get(option_name("compression_type", value, "CompressionType"))
    if codec is None:
        raise ValueError(f"compression_type must be one of NONE, LZ4, ZLIB, ZSTD, SNAPPY (any case), not {value!r}")
    return codec


# Each codec as the official clients write it, so that they (and our decoder) read it back: LZ4
# as one raw LZ4 block without its size (MessageMetadata.uncompressed_size carries it: Pulsar's
# LZ4 is the block format, not the frame format), ZLIB as a zlib stream (header and adler32, at
# zlib's default level), ZSTD as a zstd frame at level 3 (the level of Pulsar's clients), and
# SNAPPY as raw snappy (no framing).
_COMPRESSORS: dict[int, Callable[[bytes], bytes]] = {
    CompressionType.LZ4: lambda data: bytes(cramjam.lz4.compress_block(data, store_size=False)),
    CompressionType.ZLIB: lambda data: bytes(cramjam.zlib.compress(data, level=6)),
    CompressionType.ZSTD: lambda data: bytes(cramjam.zstd.compress(data, level=3)),
    CompressionType.SNAPPY: lambda data: bytes(cramjam.snappy.compress_raw(data)),
}


@dataclass(frozen=True, slots=True)
class ProducerOptions:
    producer_name: str | None = None
    batching_enabled: bool = False
    batching_max_messages: int = 1000
    batching_max_allowed_size_in_bytes: int = 128 * 1024
    batching_max_publish_delay_ms: int = 10
    max_pending_messages: int = 1000
    block_if_queue_full: bool = True
    send_timeout_ms: int = 30_000
    initial_sequence_id: int | None = None
    schema: SchemaData | None = None
    compression_type: CompressionType = CompressionType.NONE
    # Pulsar's initialSubscriptionName: the broker creates this durable subscription (at the
    # earliest position) with the producer if the topic has none of that name.
    initial_subscription_name: str | None = None
    # pulsar-client's chunking_enabled: a message over the broker's max_message_size (once
    # compressed) is sent as chunks (see pyengine.client.chunks); not with batching.
    chunking_enabled: bool = False
    # pulsar-client's batching_type: KeyBased batches by key (see pyengine.client.key_batching).
    batching_type: BatchingType = BatchingType.Default
    # Pulsar's hashingScheme: the key hash that picks a keyed message's partition (router.py).
    hashing_scheme: str = "murmur3_32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "compression_type", check_compression_type(self.compression_type))
        object.__setattr__(self, "hashing_scheme", check_hashing_scheme(self.hashing_scheme))
        object.__setattr__(self, "batching_type", check_batching_type(self.batching_type))
        check_name("producer_name", self.producer_name, optional=True)
        check_name("initial_subscription_name", self.initial_subscription_name, optional=True)
        check_schema(self.schema)
        for flag in ("batching_enabled", "block_if_queue_full", "chunking_enabled"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be a bool, not {type(getattr(self, flag)).__name__}")
        if self.batching_enabled and self.chunking_enabled:
            # As pulsar-client's create_producer (and the Java ProducerBuilder).
            raise ValueError("Batching and chunking of messages can't be enabled together.")
        check_int("batching_max_messages", self.batching_max_messages, 1)
        check_int("batching_max_allowed_size_in_bytes", self.batching_max_allowed_size_in_bytes, 1)
        check_int("batching_max_publish_delay_ms", self.batching_max_publish_delay_ms, 0)
        check_int("max_pending_messages", self.max_pending_messages, 1)
        check_int("send_timeout_ms", self.send_timeout_ms, 0)
        if self.initial_sequence_id is not None:
            check_int("initial_sequence_id", self.initial_sequence_id, -1, (1 << 63) - 1)   # as a send's


@dataclass(slots=True)
class _SendOp:
    """One SEND on the wire: a message, or a batch of them (then one future per message)."""

    sequence_id: int
    highest_sequence_id: int
    frame: bytes
    futures: list[asyncio.Future[MessageId]]
    batched: bool
    created: float = field(default_factory=time.monotonic)
    # a batch's messages and keys while it may be held: to build it again without those given up
    batch: tuple[BatchContainer, str | None, bytes | None] | None = None


def _message_fields(key: str | None, properties: dict[str, str], event_time: int | None,
                    ordering_key: bytes | None = None) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if key is not None:
        fields["partition_key"] = key
    if ordering_key is not None:
        fields["ordering_key"] = ordering_key
    if properties:
        fields["properties"] = [pb.KeyValue(key=k, value=v) for k, v in properties.items()]
    if event_time:
        fields["event_time"] = event_time
    return fields


def _check_message(data: Any, key: Any, properties: Any, event_time: Any, sequence_id: Any,
                   txn: Any) -> tuple[bytes, dict[str, str]]:
    if type(data) is bytes and key is None and properties is None and event_time is None \
            and sequence_id is None and (txn is None or type(txn) is Transaction):
        return data, {}                          # the common case, checked in one step (hot path)
    payload = check_payload(data)
    props = check_send_fields(key, properties, event_time, sequence_id)
    if txn is not None and not isinstance(txn, Transaction):
        raise TypeError(f"txn must be a Transaction of pyengine.client, not {type(txn).__name__}")
    return payload, props


def check_ordering_key(ordering_key: Any) -> bytes | None:
    """MessageMetadata.ordering_key for pulsar-client's `ordering_key` (a str, or None); as
    pulsar-client, an empty one sets nothing."""
    if ordering_key is None:
        return None
    if not isinstance(ordering_key, str):
        raise TypeError(f"ordering_key must be a string, not {type(ordering_key).__name__}")
    return ordering_key.encode() or None


# The latest deliver_at_time that is a time (9999-12-31T23:59:59.999Z), as the broker reads it.
MAX_DELIVER_AT_MS = 253_402_300_799_999
_ONE_MS = datetime.timedelta(milliseconds=1)


def check_delivery(deliver_after: Any, deliver_at: Any) -> int | None:
    """MessageMetadata.deliver_at_time (ms since the epoch) for pulsar-client's `deliver_after`
    (a datetime.timedelta from now) or `deliver_at` (ms since the epoch, an int), or None when
    neither asks for a delay. As pulsar-client, a zero value sets nothing (`if deliver_after:`);
    unlike it, a negative value, a time past the year 9999, and both at once are refused."""
    if deliver_after is not None:
        if not isinstance(deliver_after, datetime.timedelta):
            raise TypeError(f"deliver_after must be a datetime.timedelta, not {type(deliver_after).__name__}")
        if deliver_at is not None:
            raise ValueError("give deliver_after or deliver_at, not both")
        if deliver_after < datetime.timedelta(0):
            raise ValueError(f"deliver_after must not be negative, not {deliver_after!r}")
        if not deliver_after:
            return None
        at = time.time_ns() // 1_000_000 + deliver_after // _ONE_MS
        if at > MAX_DELIVER_AT_MS:
            raise ValueError(f"deliver_after={deliver_after!r} is past the year 9999")
        return at
    if deliver_at is None:
        return None
    if not isinstance(deliver_at, int) or isinstance(deliver_at, bool):
        raise TypeError(f"deliver_at must be an int (ms since the epoch), not {type(deliver_at).__name__}")
    if not 0 <= deliver_at <= MAX_DELIVER_AT_MS:
        raise ValueError(f"deliver_at must be ms since the epoch between 0 and {MAX_DELIVER_AT_MS}, not {deliver_at}")
    return deliver_at or None


def _failure(registration: asyncio.Future[None]) -> BaseException | None:
    """The error a finished registration gives the sends that waited for it (None: it succeeded)."""
    if registration.cancelled():
        return ConnectError("the transaction's registration of the partition was cancelled")
    return registration.exception()


def _succeeded(registration: asyncio.Future[None] | None) -> bool:
    return registration is None or registration.done() and _failure(registration) is None


class PartitionProducer(ConnectionHandler):
    def __init__(self, core: ClientCore, topic: str, partition: int, options: ProducerOptions) -> None:
        super().__init__(core, topic)
        self.partition = partition
        self.options = options
        # Compression (None: NONE): of each message sent alone, of each batch as a whole (as
        # Pulsar's clients do: the broker stores the entry as sent, consumers decompress it).
        self._codec = int(options.compression_type)
        self._compress = _COMPRESSORS.get(self._codec)
        self.producer_id = core.new_producer_id()
        self.producer_name: str = options.producer_name or ""
        self._user_named = options.producer_name is not None
        self.schema_version = b""           # of the producer's schema, from PRODUCER_SUCCESS (empty: none)
        self._epoch = 0
        self._connected_once = False
        # The broker's limit as its last CONNECTED said, kept while reconnecting (as the C++
        # client's ClientConnection::getMaxMessageSize): a send meanwhile is checked and chunked
        # by it, not by the default (an oversized frame made the broker close every reconnect).
        self.max_message_size = DEFAULT_MAX_MESSAGE_SIZE
        self._next_sequence = (options.initial_sequence_id + 1 if options.initial_sequence_id is not None else 0)
        # As Java's ProducerImpl (lastSequenceIdPublished = initialSequenceId) and the C++ client
        self.last_sequence_id_published = (options.initial_sequence_id if options.initial_sequence_id is not None
                                           else -1)
        self._pending: deque[_SendOp] = deque()
        self._pending_messages = 0
        # Sends blocked on a full queue, in send order (FIFO): each freed slot wakes the first
        # one only, and is kept for it (`_space_granted`) until it runs, so that no later send
        # takes it meanwhile.
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        self._space_granted = 0
        # Sends held before they take a sequence id, in send order: those of transactions behind
        # a full queue or a failed registration, and every send made while some are held (a
        # plain one's registration is None). (registration, result, message, when handed in)
        self._held: deque[tuple[asyncio.Future[None] | None, asyncio.Future[MessageId], tuple[Any, ...],
                                float]] = deque()
        self._held_submitter: asyncio.Future[None] | None = None
        # Sends built while their transaction's ADD_PARTITION_TO_TXN was unanswered, and every
        # send after them (sequence order is wire order): written once it succeeds.
        self._blocked: deque[tuple[asyncio.Future[None] | None, _SendOp]] = deque()
        self._batch: BatchContainer | KeyBasedBatches | None = None
        self._key_based = options.batching_type == BatchingType.KeyBased
        self._batch_timer: asyncio.TimerHandle | None = None
        self._timeout_timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    def __repr__(self) -> str:
        return f"producer {self.producer_id} ({self.producer_name or '?'}) on {self.topic}"

    # --- connection -----------------------------------------------------------------------

    async def _connection_opened(self, connection: ClientConnection) -> None:
        connection.producers[self.producer_id] = self
        cmd = base_command(T.PRODUCER, topic=self.topic, producer_id=self.producer_id,
                           request_id=connection.new_request_id(), epoch=self._epoch,
                           user_provided_producer_name=self._user_named)
        if self.producer_name:
            cmd.producer.producer_name = self.producer_name
        if self.options.schema is not None:
            fill_schema(cmd.producer.schema, self.options.schema)
        if self.options.initial_subscription_name is not None:
            cmd.producer.initial_subscription_name = self.options.initial_subscription_name
        self._epoch += 1
        try:
            response = await connection.request(cmd, self._core.config.operation_timeout)
        except BaseException as exc:
            if connection.producers.get(self.producer_id) is self:
                del connection.producers[self.producer_id]
            self._given_up(connection, cmd, exc)
            raise
        if self.state in (CLOSING, CLOSED):
            return
        if not connection.usable:
            # It closed while the answer was on its way: its close found no producer of its own
            # to tell, so this one would be "ready" on a dead connection, its sends never settled.
            raise ConnectError(f"{self}: the connection closed as the producer was created")
        self.producer_name = response.producer_name
        self.schema_version = response.schema_version
        last = response.last_sequence_id if response.HasField("last_sequence_id") else -1
        if not self._connected_once:
            # A new producer continues after what the broker already has under its name.
            self._connected_once = True
            if self.options.initial_sequence_id is None and last >= self._next_sequence:
                self._next_sequence = last + 1
            self.last_sequence_id_published = max(self.last_sequence_id_published, last)
        self.connection = connection
        self.max_message_size = connection.max_message_size
        self.state = READY
        # Written at once, before any later send of this turn: receipts come back in this order.
        for op in self._pending:
            connection.write(op.frame)

    def _failed(self, error: BaseException) -> None:
        self._fail_pending(error)

    def _refused_on_reconnect(self, error: BaseException) -> None:
        self._fail_pending(error)

    # --- sending --------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self.state in (CLOSING, CLOSED):
            raise AlreadyClosedError(f"{self} is closed")
        if self.state == FAILED:
            if isinstance(self.failure, TopicTerminatedError):
                # as the Java client's Terminated state: a send is refused as terminated (a
                # scalable producer then re-routes it to the segment's children)
                raise TopicTerminatedError(f"{self}: {self.failure}")
            raise NotAllowedError(f"{self} failed and cannot send")

    @property
    def queue_full(self) -> bool:
        """Whether a send made now finds no room: the slots kept for woken waiters count as taken."""
        batch = self._batch
        batched = batch.count if batch is not None else 0
        return self._pending_messages + batched + self._space_granted >= self.options.max_pending_messages

    async def wait_for_space(self) -> None:
        """Return when the queue has room for one more send (the caller queues it right away),
        the senders blocked here served in FIFO order; ProducerQueueIsFullError at once if it is
        full and the producer does not block."""
        if not self.queue_full:
            return
        if not self.options.block_if_queue_full:
            raise ProducerQueueIsFullError(f"{self}: {self.options.max_pending_messages} messages pending")
        waiter = self._loop.create_future()
        self._space_waiters.append(waiter)
        while True:
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.cancelled():
                    try:
                        self._space_waiters.remove(waiter)
                    except ValueError:
                        pass                    # a wake-up passed it by already
                else:                           # woken, then cancelled: its slot goes to the next one
                    self._space_granted -= 1
                    self._wake_space_waiters()
                raise
            self._space_granted -= 1
            self._check_usable()
            if not self.queue_full:
                if self._space_waiters:
                    # should this send not be queued after all (its submit fails), the next
                    # waiter gets the slot: no receipt may come to free another one
                    self._loop.call_soon(self._wake_space_waiters)
                return
            # its slot was taken all the same (a chunked message takes one per chunk): first again
            waiter = self._loop.create_future()
            self._space_waiters.appendleft(waiter)

    def _wake_space_waiters(self) -> None:
        """Wake as many waiters as there are free slots, the first ones (not every waiter: the
        others would only find the queue full again)."""
        waiters = self._space_waiters
        while waiters and not self.queue_full:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._space_granted += 1

    def submit(self, payload: bytes, key: str | None, properties: dict[str, str], event_time: int | None,
               sequence_id: int | None, txn: Transaction | None,
               future: asyncio.Future[MessageId] | None = None,
               gate: asyncio.Future[None] | None = None,
               deliver_at: int | None = None, ordering_key: bytes | None = None) -> asyncio.Future[MessageId]:
        """Queue one message now (synchronously: submission order is sequence order); its
        receipt settles `future` (a new one when not given). With `gate` (its partition's
        registration with `txn`, unanswered) it is written once that succeeds. With
        `deliver_at` (MessageMetadata.deliver_at_time) it is never batched: as the C++
        client's canAddToBatch, a delayed message is sent alone, after the open batch."""
        # The hot path of every send: few calls, the checks ordered cheapest first.
        if self.state in _UNUSABLE:
            self._check_usable()
        if not self.options.block_if_queue_full and self.queue_full:
            raise ProducerQueueIsFullError(f"{self}: {self.options.max_pending_messages} messages pending")
        compress = self._compress
        uncompressed_size = -1
        alone = False
        unbatched = not self.options.batching_enabled or deliver_at is not None
        if compress is not None and unbatched and payload:
            # As Pulsar's clients: a message sent alone is compressed here, and the broker's
            # size limit applies to what is sent (the compressed payload). An empty one is sent
            # as it is: the C++ client cannot inflate an empty ZLIB stream into 0 bytes.
            uncompressed_size = len(payload)
            payload = compress(payload)
        chunking = self.options.chunking_enabled
        max_size = self.max_message_size
        if len(payload) > max_size and not chunking:
            if compress is None or unbatched:
                raise MessageTooBigError(f"a message of {len(payload)} bytes"
                                         + (f" compressed ({uncompressed_size} uncompressed)" if compress else "")
                                         + f" is larger than the broker's maximum of {max_size}")
            # Batched and compressed: it goes in a batch of its own, whose compressed size is
            # checked when it is closed (Pulsar checks a batch's size once it is compressed).
            alone = True
        if sequence_id is None:
            sequence_id = self._next_sequence
            self._next_sequence = sequence_id + 1
        else:
            self._next_sequence = max(self._next_sequence, sequence_id + 1)
        if future is None:
            future = self._loop.create_future()
        if unbatched:
            fields = _message_fields(key, properties, event_time, ordering_key)
            if deliver_at is not None:
                fields["deliver_at_time"] = deliver_at
                if self._batch is not None:
                    self._flush_batch()     # sequence order is wire order: the batch goes first
            if chunking and len(payload) >= max_size // 2:
                self._send_chunks(payload, fields, sequence_id, txn, future, gate, uncompressed_size, max_size)
            else:
                self._send_single(payload, fields, sequence_id, txn, future, gate, uncompressed_size)
        elif key is None and not properties and not event_time and ordering_key is None:
            self._add_to_batch(plain_single_metadata(len(payload), sequence_id), payload, sequence_id, txn, future,
                               gate, alone)
        else:
            single = pb.SingleMessageMetadata(payload_size=len(payload), sequence_id=sequence_id,
                                              **_message_fields(key, properties, event_time, ordering_key))
            self._add_to_batch(single.SerializeToString(), payload, sequence_id, txn, future, gate, alone,
                               key, ordering_key)
        return future

    def submit_in_txn(self, registration: asyncio.Future[None], payload: bytes, key: str | None,
                      properties: dict[str, str], event_time: int | None, sequence_id: int | None,
                      txn: Transaction, deliver_at: int | None = None,
                      ordering_key: bytes | None = None) -> asyncio.Future[MessageId]:
        """Queue a message of `txn`. While `registration` (ADD_PARTITION_TO_TXN) is unanswered
        the message is batched as any other and its SEND waits for the answer (`_blocked`);
        behind a full queue or a failed registration it is held, and one task submits what is
        held in order (not one task per message: a transaction sends its messages in a burst).
        Given up while held or blocked (its future cancelled, or failed by the send timeout),
        it is never written."""
        if not self._held and not (self.options.block_if_queue_full and self.queue_full):
            if not registration.done():
                return self.submit(payload, key, properties, event_time, sequence_id, txn, gate=registration,
                                   deliver_at=deliver_at, ordering_key=ordering_key)
            if not Transaction._failed(registration):
                return self.submit(payload, key, properties, event_time, sequence_id, txn, deliver_at=deliver_at,
                                   ordering_key=ordering_key)
        return self._hold(registration,
                          (payload, key, properties, event_time, sequence_id, txn, deliver_at, ordering_key))

    def submit_behind_held(self, payload: bytes, key: str | None, properties: dict[str, str],
                           event_time: int | None, sequence_id: int | None, deliver_at: int | None = None,
                           ordering_key: bytes | None = None) -> asyncio.Future[MessageId]:
        """Queue a message without a transaction behind the held ones (call it while `_held` is
        not empty): it takes its sequence id and its place after them, as it was sent after them
        (Pulsar's clients keep a producer's send order; the broker's de-duplication relies on it).
        One given up (its future cancelled, or failed by the send timeout) while held is not sent."""
        return self._hold(None, (payload, key, properties, event_time, sequence_id, None, deliver_at, ordering_key))

    def _hold(self, registration: asyncio.Future[None] | None, message: tuple[Any, ...]) -> asyncio.Future[MessageId]:
        result: asyncio.Future[MessageId] = self._loop.create_future()
        self._held.append((registration, result, message, self._loop.time()))
        self._arm_send_timeout()                # a held send times out as a pending one
        if self._held_submitter is None:
            self._held_submitter = asyncio.ensure_future(self._submit_held())
        return result

    async def _submit_held(self) -> None:
        try:
            while self._held:
                registration = self._held[0][0]
                if registration is not None and not registration.done():
                    await asyncio.wait((registration,))
                    if not self._held or self._held[0][0] is not registration:
                        continue                # they timed out meanwhile (see _fail_pending)
                failure = _failure(registration) if registration is not None else None
                # Every message held behind this registration, in order, checked once for it.
                first_held_at = self._held[0][3]
                while self._held and self._held[0][0] is registration:
                    _, result, message, _ = self._held[0]
                    if failure is not None:
                        if not result.done():
                            result.set_exception(failure)
                    elif not result.done():
                        try:
                            if self.queue_full:
                                await self.wait_for_space()
                            # one given up meanwhile (cancelled, or failed by the send timeout)
                            # is not sent, in a transaction or not (as one blocked on the queue)
                            if not result.done():
                                *fields, deliver_at, ordering_key = message
                                # the receipt settles `result` itself
                                self.submit(*fields, future=result, deliver_at=deliver_at,
                                            ordering_key=ordering_key)
                        except Exception as exc:
                            if not result.done():
                                result.set_exception(exc)
                    if self._held and self._held[0][1] is result:
                        self._held.popleft()
                self._flush_batch_by(first_held_at + self.options.batching_max_publish_delay_ms / 1000)
        finally:
            self._held_submitter = None

    def _flush_batch_by(self, deadline: float) -> None:
        """Held messages waited in the producer already: their batch goes when the batching
        delay has passed since they were handed in, not a whole delay after their release
        (a txn's first messages wait for its ADD_PARTITION_TO_TXN, then the batch)."""
        timer = self._batch_timer
        if timer is None or timer.when() <= deadline:
            return
        if self._loop.time() >= deadline:
            self._flush_batch()
        else:
            timer.cancel()
            self._batch_timer = self._loop.call_at(deadline, self._flush_batch)

    def _single_metadata(self, fields: dict[str, Any], sequence_id: int, txn: Transaction | None,
                         uncompressed_size: int) -> pb.MessageMetadata:
        """The MessageMetadata of a message sent alone (whole or in chunks): compression when
        `uncompressed_size` >= 0, the schema version, the txn id."""
        metadata = pb.MessageMetadata(producer_name=self.producer_name, sequence_id=sequence_id,
                                      publish_time=time.time_ns() // 1_000_000, **fields)
        if uncompressed_size >= 0:
            metadata.compression = self._codec
            metadata.uncompressed_size = uncompressed_size
        if self.schema_version:
            metadata.schema_version = self.schema_version
        if txn is not None:
            metadata.txnid_most_bits = txn.txn_id.most_bits
            metadata.txnid_least_bits = txn.txn_id.least_bits
        return metadata

    def _send_single(self, payload: bytes, fields: dict[str, Any], sequence_id: int, txn: Transaction | None,
                     future: asyncio.Future[MessageId], gate: asyncio.Future[None] | None,
                     uncompressed_size: int = -1) -> None:
        """Send one message alone; `payload` is compressed already when `uncompressed_size` >= 0."""
        metadata = self._single_metadata(fields, sequence_id, txn, uncompressed_size)
        send = pb.CommandSend(producer_id=self.producer_id, sequence_id=sequence_id)
        if txn is not None:
            send.txnid_most_bits = txn.txn_id.most_bits
            send.txnid_least_bits = txn.txn_id.least_bits
        frame = encode_payload_frame(pb.BaseCommand(type=T.SEND, send=send).SerializeToString(),
                                     metadata.SerializeToString(), payload)
        self._enqueue(_SendOp(sequence_id, sequence_id, frame, [future], batched=False), 1, gate)

    def _send_chunks(self, payload: bytes, fields: dict[str, Any], sequence_id: int, txn: Transaction | None,
                     future: asyncio.Future[MessageId], gate: asyncio.Future[None] | None,
                     uncompressed_size: int, max_size: int) -> None:
        """Send a message as chunks if it needs them, as the C++ ProducerImpl: each chunk holds
        up to `max_size` minus the metadata's size, is its own SEND with the message's sequence
        id, and carries uuid (producer name-sequence id), chunk_id, num_chunks_from_msg and
        total_chunk_msg_size (of the payload as sent: compressed). The message's id is the
        ChunkMessageId of all its chunks, once the last one's receipt is in."""
        metadata = self._single_metadata(fields, sequence_id, txn, uncompressed_size)
        chunk_size = max_size - metadata.ByteSize()
        if chunk_size <= 0:
            future.set_exception(MessageTooBigError(f"the metadata of a message ({metadata.ByteSize()} bytes) "
                                                    f"is not under the broker's maximum of {max_size}"))
            return
        size = len(payload)
        count = -(-size // chunk_size) if size >= chunk_size else 1
        if count == 1:
            self._send_single(payload, fields, sequence_id, txn, future, gate, uncompressed_size)
            return
        metadata.uuid = f"{self.producer_name}-{sequence_id}"
        metadata.num_chunks_from_msg = count
        metadata.total_chunk_msg_size = size
        send = pb.CommandSend(producer_id=self.producer_id, sequence_id=sequence_id, is_chunk=True)
        if txn is not None:
            send.txnid_most_bits = txn.txn_id.most_bits
            send.txnid_least_bits = txn.txn_id.least_bits
        command = pb.BaseCommand(type=T.SEND, send=send).SerializeToString()
        chunk_futures: list[asyncio.Future[MessageId]] = [self._loop.create_future() for _ in range(count)]

        def given_up(_: object) -> None:
            if future.cancelled():              # its chunks still held are then not sent
                for chunk in chunk_futures:
                    chunk.cancel()
        future.add_done_callback(given_up)

        def settled(_: object) -> None:
            failure: BaseException | None = None
            for chunk in chunk_futures:
                if chunk.done():
                    error = asyncio.CancelledError() if chunk.cancelled() else chunk.exception()
                    if error is not None and failure is None:
                        failure = error
            if future.done():
                return
            if failure is not None:
                future.set_exception(failure)
            elif all(chunk.done() for chunk in chunk_futures):
                ids = [chunk.result() for chunk in chunk_futures]
                if any(i.entry_id < 0 for i in ids):
                    future.set_result(MessageId(-1, -1, -1, self.partition))    # a duplicate
                else:
                    future.set_result(ChunkMessageId.of(ids))

        view = memoryview(payload)
        for chunk_id in range(count):
            metadata.chunk_id = chunk_id
            piece = view[chunk_id * chunk_size:(chunk_id + 1) * chunk_size]
            frame = encode_payload_frame(command, metadata.SerializeToString(), bytes(piece))
            chunk_futures[chunk_id].add_done_callback(settled)
            self._enqueue(_SendOp(sequence_id, sequence_id, frame, [chunk_futures[chunk_id]], batched=False), 1, gate)

    def _add_to_batch(self, single: bytes, payload: bytes, sequence_id: int, txn: Transaction | None,
                      future: asyncio.Future[MessageId], gate: asyncio.Future[None] | None,
                      alone: bool = False, key: str | None = None, ordering_key: bytes | None = None) -> None:
        # A batch is one entry of one transaction (or of none): a different txn starts a new
        # batch, and so does another registration of it unless the batch's one has succeeded.
        # A message `alone` (larger than the size limit before compression) is a batch of its own.
        batch = self._batch
        # (an open batch is never full: it is sent as soon as it is, so only the bytes can overflow)
        if batch is not None and (alone or batch.txn is not txn or batch.size + len(payload) > batch.max_bytes
                                  or batch.gate is not gate and not _succeeded(batch.gate)):
            self._flush_batch()
            batch = None
        if batch is None:
            batch = self._batch = (KeyBasedBatches if self._key_based else BatchContainer)(
                self.options.batching_max_messages, self.options.batching_max_allowed_size_in_bytes, txn)
        if gate is not None:
            batch.gate = gate
        if isinstance(batch, KeyBasedBatches):
            full = batch.add(single, payload, sequence_id, future, key, ordering_key)
        else:
            full = batch.add(single, payload, sequence_id, future)
        if full or alone:
            self._flush_batch()
        elif self._batch_timer is None:
            self._batch_timer = self._loop.call_later(self.options.batching_max_publish_delay_ms / 1000,
                                                      self._flush_batch)

    def _flush_batch(self) -> None:
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        batch, self._batch = self._batch, None
        if batch is None or not len(batch):
            return
        if isinstance(batch, KeyBasedBatches):
            # One entry per key, keyed by its first message so that Key_Shared routes it by key.
            for keyed in batch.batches():
                keyed.container.gate = batch.gate
                self._send_batch_or_fail(keyed.container, keyed.partition_key, keyed.ordering_key)
        else:
            self._send_batch_or_fail(batch)

    def _send_batch_or_fail(self, batch: BatchContainer, partition_key: str | None = None,
                            ordering_key: bytes | None = None) -> None:
        try:
            self._send_batch(batch, partition_key, ordering_key)
        except Exception as exc:
            # Taken off the producer already: unless failed here, its sends would be in no
            # queue, not even the send timeout's (often in a timer's callback: nobody to raise to)
            log.exception("%s: could not send a batch", self)
            for future in batch.futures:
                if not future.done():
                    future.set_exception(exc)
            self._wake_space_waiters()

    def _send_batch(self, batch: BatchContainer, partition_key: str | None = None,
                    ordering_key: bytes | None = None) -> None:
        op = self._batch_op(batch, partition_key, ordering_key)
        if op is not None:
            if self._blocked or batch.gate is not None:
                op.batch = (batch, partition_key, ordering_key)     # it may be held: see _without_given_up
            self._enqueue(op, len(batch), batch.gate)

    def _batch_op(self, batch: BatchContainer, partition_key: str | None,
                  ordering_key: bytes | None) -> _SendOp | None:
        """The SEND of `batch`; None when it is too large once compressed (its sends fail)."""
        count = len(batch)
        payload = batch.payload()
        metadata = pb.MessageMetadata(producer_name=self.producer_name, sequence_id=batch.first_sequence_id,
                                      publish_time=time.time_ns() // 1_000_000, num_messages_in_batch=count,
                                      highest_sequence_id=batch.last_sequence_id)
        if partition_key is not None:
            metadata.partition_key = partition_key
        if ordering_key is not None:
            metadata.ordering_key = ordering_key
        if self._compress is not None:
            metadata.compression = self._codec
            metadata.uncompressed_size = len(payload)
            payload = self._compress(payload)
        if len(payload) > self.max_message_size:
            # As Pulsar's clients: a batch too large (once compressed, or uncompressed when
            # batching_max_allowed_size_in_bytes is above the broker's limit) fails as a whole;
            # sent, the broker would refuse it, or drop the connection and the batch come again.
            described = (f"{len(payload)} bytes compressed ({metadata.uncompressed_size} uncompressed)"
                         if self._compress is not None else f"{len(payload)} bytes")
            error = MessageTooBigError(f"a batch of {count} messages of {described} is larger than the "
                                       f"broker's maximum of {self.max_message_size}")
            for future in batch.futures:
                if not future.done():
                    future.set_exception(error)
            self._wake_space_waiters()
            return None
        if self.schema_version:
            metadata.schema_version = self.schema_version
        send = pb.CommandSend(producer_id=self.producer_id, sequence_id=batch.first_sequence_id,
                              highest_sequence_id=batch.last_sequence_id, num_messages=count)
        if batch.txn is not None:
            metadata.txnid_most_bits = send.txnid_most_bits = batch.txn.txn_id.most_bits
            metadata.txnid_least_bits = send.txnid_least_bits = batch.txn.txn_id.least_bits
        frame = encode_payload_frame(pb.BaseCommand(type=T.SEND, send=send).SerializeToString(),
                                     metadata.SerializeToString(), payload)
        return _SendOp(batch.first_sequence_id, batch.last_sequence_id, frame, batch.futures, batched=True)

    def _enqueue(self, op: _SendOp, messages: int, gate: asyncio.Future[None] | None = None) -> None:
        self._pending_messages += messages      # counts blocked sends too: they take room
        if self._blocked or gate is not None and not gate.done():
            self._blocked.append((gate, op))
            if len(self._blocked) == 1:
                assert gate is not None
                gate.add_done_callback(self._release_blocked)
            self._arm_send_timeout()            # a blocked send times out as a pending one
        elif gate is not None and _failure(gate) is not None:
            self._reject(op, _failure(gate))
        elif gate is None:
            self._write(op)
        else:
            # its registration was answered while it was batched: what was given up is not sent
            kept = self._without_given_up(op)
            if kept is not None:
                self._write(kept)

    def _write(self, op: _SendOp) -> None:
        self._pending.append(op)
        if self.state == READY and self.connection is not None:
            self.connection.write(op.frame)
        if self._timeout_timer is None:
            self._arm_send_timeout()

    def _arm_send_timeout(self) -> None:
        if self._timeout_timer is None and self.options.send_timeout_ms > 0:
            self._timeout_timer = self._loop.call_later(self.options.send_timeout_ms / 1000, self._check_timeouts)

    def _without_given_up(self, op: _SendOp) -> _SendOp | None:
        """`op` without its messages given up while it was held (their futures cancelled by
        their callers): as Pulsar's clients never send a message that failed before it was
        sent, those never reach the wire (their sequence ids are skipped). None: nothing left."""
        given_up = sum(1 for future in op.futures if future.done())
        held_batch, op.batch = op.batch, None           # not kept once written
        if not given_up:
            return op
        kept: _SendOp | None = None
        if held_batch is not None and given_up < len(op.futures):
            batch, partition_key, ordering_key = held_batch
            kept = self._batch_op(batch.without_settled(), partition_key, ordering_key)
            if kept is not None:
                kept.created = op.created
        self._pending_messages -= len(op.futures) - (len(kept.futures) if kept is not None else 0)
        self._wake_space_waiters()
        return kept

    def _release_blocked(self, _: object = None) -> None:
        """Write the blocked sends up to the next one whose registration is unanswered; those
        of a failed registration fail with its error (their sequence ids are skipped)."""
        blocked = self._blocked
        while blocked:
            gate, op = blocked[0]
            if gate is not None and not gate.done():
                gate.add_done_callback(self._release_blocked)
                return
            blocked.popleft()
            failure = _failure(gate) if gate is not None else None
            if failure is not None:
                self._reject(op, failure)
            elif (kept := self._without_given_up(op)) is not None:
                self._write(kept)

    def _reject(self, op: _SendOp, failure: BaseException) -> None:
        self._pending_messages -= len(op.futures)
        for future in op.futures:
            if not future.done():
                future.set_exception(failure)
        self._wake_space_waiters()

    # --- receipts -------------------------------------------------------------------------

    def _settle_head(self, op: _SendOp) -> None:
        self._pending.popleft()
        self._pending_messages -= len(op.futures)
        self._wake_space_waiters()

    def on_send_receipt(self, receipt: pb.CommandSendReceipt) -> None:
        if not self._pending:
            log.debug("%s: receipt for %d with nothing pending", self, receipt.sequence_id)
            return
        op = self._pending[0]
        sequence_id = receipt.sequence_id
        if sequence_id < op.sequence_id:
            log.debug("%s: stale receipt for %d (head is %d)", self, sequence_id, op.sequence_id)
            return
        if sequence_id > op.highest_sequence_id and sequence_id > op.sequence_id:
            # Receipts are in send order: one past the head means the stream is not ours any more.
            # (The head's highest id is its last message's: with sequence ids given by the
            # caller it can be below its first, which the receipt carries; as Java's
            # getHighestSequenceId, the larger of the two bounds it.)
            log.warning("%s: receipt for %d while %d is the oldest pending; reconnecting", self, sequence_id,
                        op.sequence_id)
            if self.connection is not None:
                self.connection.close()
            return
        self._settle_head(op)
        self.last_sequence_id_published = max(self.last_sequence_id_published, op.highest_sequence_id, op.sequence_id)
        ledger_id = entry_id = -1
        if receipt.HasField("message_id"):
            message_id = MessageId.from_proto(receipt.message_id)
            ledger_id, entry_id = message_id.ledger_id, message_id.entry_id
        count = len(op.futures)
        for index, future in enumerate(op.futures):
            if not future.done():
                future.set_result(MessageId(ledger_id, entry_id, index if op.batched else -1, self.partition,
                                            count if op.batched else 0))

    def on_send_error(self, error: pb.CommandSendError) -> None:
        op = next((op for op in self._pending if op.sequence_id == error.sequence_id), None)
        if op is None:
            return
        if error.error in _REJECTING:
            self._pending.remove(op)
            self._pending_messages -= len(op.futures)
            self._wake_space_waiters()
            exc = PulsarError.from_code(error.error, error.message)
            if error.error == pb.ChecksumError:
                exc = ChecksumError(error.message)
            for future in op.futures:
                if not future.done():
                    future.set_exception(exc)
            return
        # Any other SEND_ERROR: the broker may have dropped later sends too; start over.
        log.warning("%s: SEND_ERROR %s for %d (%s); reconnecting", self, pb.ServerError.Name(error.error),
                    error.sequence_id, error.message)
        if self.connection is not None:
            self.connection.close()

    def _oldest_send_age(self) -> float | None:
        """How long the oldest send still waiting for its receipt was handed in: written, or
        blocked or held (not written yet); None when there is none."""
        now = time.monotonic()
        ages = [now - self._pending[0].created] if self._pending else []
        if self._blocked:
            ages.append(now - self._blocked[0][1].created)
        held_at = next((at for _, result, _, at in self._held if not result.done()), None)
        if held_at is not None:
            ages.append(self._loop.time() - held_at)
        return max(ages, default=None)

    def _check_timeouts(self) -> None:
        self._timeout_timer = None
        age = self._oldest_send_age()
        if age is None:
            return
        timeout = self.options.send_timeout_ms / 1000
        if age >= timeout:
            # As Pulsar's clients: once the oldest send times out, everything pending fails, and
            # what is blocked or held is dropped (never sent).
            self._fail_pending(TimeoutError(f"{self}: no receipt within send_timeout_ms="
                                            f"{self.options.send_timeout_ms}"))
            return
        self._timeout_timer = self._loop.call_later(timeout - age, self._check_timeouts)

    def _fail_pending(self, error: BaseException) -> None:
        held, self._held = self._held, deque()
        for _, result, _, _ in held:
            if not result.done():
                result.set_exception(error)
        pending, self._pending = self._pending, deque()
        pending.extend(op for _, op in self._blocked)
        self._blocked.clear()
        self._pending_messages = 0
        if self._batch is not None:
            pending.append(_SendOp(-1, -1, b"", self._batch.futures, batched=True))
            self._batch = None
        for op in pending:
            for future in op.futures:
                if not future.done():
                    future.set_exception(error)
        if self.state in _UNUSABLE:
            # every waiter wakes, to find the producer unusable
            for waiter in self._space_waiters:
                if not waiter.done():
                    waiter.set_result(None)
                    self._space_granted += 1
            self._space_waiters.clear()
        else:
            self._wake_space_waiters()          # (send timeout) room for some of them

    # --- flush / close --------------------------------------------------------------------

    async def flush(self) -> None:
        """Send the open batch and wait until every message sent before has its receipt
        (failures are reported by their own send futures, not here)."""
        # The open batch first: a send held behind it (the queue full) may wait for the room
        # only its receipt frees; then again, for what the held sends batched meanwhile.
        self._flush_batch()
        if self._held_submitter is not None:
            await asyncio.wait([self._held_submitter])
            self._flush_batch()
        futures = [future for op in self._pending for future in op.futures]
        futures += [future for _, op in self._blocked for future in op.futures]
        if futures:
            await asyncio.wait(futures)

    async def close(self) -> None:
        if self.state in (CLOSING, CLOSED):
            return
        if self.state != FAILED:
            try:
                await asyncio.wait_for(self.flush(), self._core.config.operation_timeout)
            except TimeoutError:
                log.warning("%s: closing with sends still pending", self)
        self.state = CLOSING
        self._stop_reconnecting()
        connection, self.connection = self.connection, None
        try:
            await self._close_on_broker(connection, T.CLOSE_PRODUCER, producer_id=self.producer_id)
        finally:
            # Cancelled too: CLOSE_PRODUCER is out, and a CLOSING producer would stay so for good.
            if connection is not None:
                connection.producers.pop(self.producer_id, None)
            self.state = CLOSED
            for timer in (self._batch_timer, self._timeout_timer):
                if timer is not None:
                    timer.cancel()
            self._fail_pending(AlreadyClosedError(f"{self} was closed"))


class Producer:
    """A producer on a topic; on a partitioned topic, one per partition behind Pulsar's routing."""

    def __init__(self, core: ClientCore, topic: str, partitions: list[PartitionProducer], options: ProducerOptions,
                 partitioned: bool) -> None:
        self._core = core
        self._topic = topic
        self._partitions = partitions
        self._partitioned = partitioned
        self._options = options
        batching = options.batching_enabled
        self._router = PartitionRouter(len(partitions), options.batching_max_messages if batching else 1,
                                       options.hashing_scheme,
                                       options.batching_max_publish_delay_ms if batching else None)
        self._closed = False
        self._closing = RunOnce(self._close)
        self._partitions_update: asyncio.Task[None] | None = None
        if partitioned and core.partitions_update_interval > 0:
            # As Pulsar's clients (autoUpdatePartitions): the partitions added later are taken up.
            self._partitions_update = asyncio.get_running_loop().create_task(
                every(core.partitions_update_interval, self._add_new_partitions, lambda: self._closed,
                      f"producer on {self._topic}: updating its partitions"))

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def producer_name(self) -> str:
        return self._partitions[0].producer_name

    @property
    def schema_version(self) -> int | None:
        """The version the topic's schema registry gave the producer's schema (None: no schema)."""
        raw = self._partitions[0].schema_version
        return decode_version(raw) if raw else None

    @property
    def last_sequence_id(self) -> int:
        """The highest sequence id the broker has confirmed (of any partition)."""
        return max(p.last_sequence_id_published for p in self._partitions)

    async def _add_new_partitions(self) -> None:
        """Start a producer on each partition past the ones produced to; once all are ready,
        the router spreads keys (hash modulo the count) and round robin over the new count.
        A count that did not grow changes nothing: partitions are never removed."""
        count = await self._core.lookup.partitions(self._topic)
        current = len(self._partitions)
        if count <= current or self._closed:
            return
        parsed = TopicName.parse(self._topic)
        added = [PartitionProducer(self._core, str(parsed.partition(i)), i, self._options)
                 for i in range(current, count)]
        try:
            results = await asyncio.gather(*(h._start() for h in added), return_exceptions=True)
        except BaseException:                   # cancelled (closing): none of them is kept
            await close_all(added)
            raise
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors or self._closed:
            await close_all(added)
            if errors:
                raise errors[0]
            return
        self._partitions.extend(added)
        self._router.partitions = count

    def _partition_for(self, key: str | None) -> PartitionProducer:
        if self._closed:
            raise AlreadyClosedError(f"the producer on {self._topic} is closed")
        return self._partitions[self._router.choose(key) if self._partitioned else 0]

    async def send(self, data: bytes, *, key: str | None = None, properties: dict[str, str] | None = None,
                   event_time: int | None = None, sequence_id: int | None = None,
                   txn: Transaction | None = None, deliver_after: datetime.timedelta | None = None,
                   deliver_at: int | None = None, ordering_key: str | None = None) -> MessageId:
        """Send one message and return its id once the broker has stored it (a message the
        broker drops as a duplicate gets (-1, -1)). With `txn`, the message is part of the
        transaction: stored now, visible when the transaction commits. `deliver_after` (a
        timedelta) or `deliver_at` (ms since the epoch), as pulsar-client: a Shared or
        Key_Shared subscription receives the message no sooner (it is sent unbatched).
        `ordering_key` (a str, as pulsar-client's): the key a Key_Shared subscription gives the
        message to a consumer by, instead of `key` (which still picks the partition); KeyBased
        batching groups by it first."""
        payload, props = _check_message(data, key, properties, event_time, sequence_id, txn)
        if txn is not None:
            check_same_client(txn, self._core.coordinator)
        delay = None if deliver_after is None and deliver_at is None else check_delivery(deliver_after, deliver_at)
        ordering = None if ordering_key is None else check_ordering_key(ordering_key)
        producer = self._partition_for(key) if txn is None else self._partition_in_txn(key, txn)
        if txn is None:
            if producer._held:                  # sends made before this one wait there: it goes behind them
                return await producer.submit_behind_held(payload, key, props, event_time, sequence_id, delay,
                                                         ordering_key=ordering)
            await producer.wait_for_space()
            return await producer.submit(payload, key, props, event_time, sequence_id, None, deliver_at=delay,
                                         ordering_key=ordering)
        return await self._submit_in_txn(producer, payload, key, props, event_time, sequence_id, txn, delay,
                                         ordering_key=ordering)

    async def _send_copy(self, data: bytes, key: str | None, ordering_key: bytes | None,
                         properties: dict[str, str]) -> MessageId:
        """Send a copy of a received message (a dead letter): its keys and properties, as the
        C++ client's dead letter producer does."""
        payload, props = _check_message(data, key, properties, None, None, None)
        producer = self._partition_for(key)
        if producer._held:
            return await producer.submit_behind_held(payload, key, props, None, None, ordering_key=ordering_key)
        await producer.wait_for_space()
        return await producer.submit(payload, key, props, None, None, None, ordering_key=ordering_key)

    @staticmethod
    def _submit_in_txn(producer: PartitionProducer, payload: bytes, key: str | None, props: dict[str, str],
                       event_time: int | None, sequence_id: int | None,
                       txn: Transaction, deliver_at: int | None = None, *,
                       track: bool = True, ordering_key: bytes | None = None) -> asyncio.Future[MessageId]:
        """Queue a message of `txn` now, in send order: at once when its partition is already
        registered with the transaction, after the registration otherwise. The transaction
        tracks it from this moment, so a commit right after `send_async` waits for it.
        `track=False`: the caller tracks the logical send with `txn` itself, since before the
        commit began (see `_send_in_txn_untracked`): this attempt is not tracked, and a commit
        under way (waiting for that logical send) does not refuse it."""
        if txn.state != OPEN and (track or txn.state != COMMITTING):
            txn._check_open()
        try:
            registration = txn._partitions.get(producer.topic)
            if registration is None or registration.done():     # the first send, or maybe a failed one
                registration = txn._register_partition(producer.topic)
            future = producer.submit_in_txn(registration, payload, key, props, event_time, sequence_id, txn,
                                            deliver_at, ordering_key)
        except Exception as exc:
            if track:
                txn._track_failure(exc)     # a send of the transaction failed: its commit must not
            raise
        if track:
            txn._track(future)              # commit waits for this send, whatever happens to it
        return future

    def _send_async_in_txn(self, payload: bytes, key: str | None, props: dict[str, str], event_time: int | None,
                           sequence_id: int | None, txn: Transaction, deliver_at: int | None,
                           ordering_key: bytes | None) -> asyncio.Future[MessageId]:
        """`send_async` in `txn`. A transaction sends its messages in a burst, each costing
        more than a plain send: the common case (its partition registered, or its registration
        in flight, and nothing held or blocking) is `_submit_in_txn` with its layers inlined;
        everything else takes that full path."""
        producer = None
        if not self._closed and txn.state == OPEN:
            producer = self._partitions[self._router.choose(key) if self._partitioned else 0]
            gate = txn._partitions.get(producer.topic)
            if gate is not None and not producer._held \
                    and not (producer.options.block_if_queue_full and producer.queue_full) \
                    and not (gate.done() and Transaction._failed(gate)):
                if gate.done():
                    gate = None                 # registered: nothing to wait for
                try:
                    future = producer.submit(payload, key, props, event_time, sequence_id, txn, gate=gate,
                                             deliver_at=deliver_at, ordering_key=ordering_key)
                except Exception as exc:
                    txn._track_failure(exc)
                    raise
                operations = txn._operations
                if len(operations) < txn._prune_at:
                    operations.append(future)   # (txn._track, inlined)
                else:
                    txn._track(future)
                return future
        # (the partition chosen above, if one was: a router asked twice skipped a partition)
        return self._submit_in_txn(producer or self._partition_in_txn(key, txn), payload, key, props, event_time,
                                   sequence_id, txn, deliver_at, ordering_key=ordering_key)

    def _partition_in_txn(self, key: str | None, txn: Transaction) -> PartitionProducer:
        """The partition of a send in `txn`; a closed producer fails the send and the commit."""
        try:
            return self._partition_for(key)
        except AlreadyClosedError as exc:
            if txn.state == OPEN:
                txn._track_failure(exc)
            raise

    def _send_in_txn_untracked(self, payload: bytes, key: str | None, props: dict[str, str],
                               txn: Transaction) -> asyncio.Future[MessageId]:
        """One attempt of a send of `txn` (`payload`, `props` checked by `_check_message`)
        that `txn` does not track: the caller tracks one operation per logical send, settled
        with its final outcome (ScalableProducer: an attempt refused by a sealed segment was
        not stored and is sent again to its child; only that outcome matters to the commit)."""
        return self._submit_in_txn(self._partition_for(key), payload, key, props, None, None, txn, track=False)

    def send_async(self, data: bytes, callback: SendCallback | None = None, *, key: str | None = None,
                   properties: dict[str, str] | None = None, event_time: int | None = None,
                   sequence_id: int | None = None, txn: Transaction | None = None,
                   deliver_after: datetime.timedelta | None = None,
                   deliver_at: int | None = None, ordering_key: str | None = None) -> asyncio.Future[MessageId]:
        """Queue a message without waiting; `callback(error, message_id)` runs when it is settled.
        Without a transaction the message takes its sequence id now, or behind the sends of
        transactions the producer holds (send order is kept); a full queue (the free slots kept
        for sends blocked on it count as taken) raises ProducerQueueIsFullError instead of
        blocking. `deliver_after` / `deliver_at` and `ordering_key` as in `send`."""
        payload, props = _check_message(data, key, properties, event_time, sequence_id, txn)
        if txn is not None:
            check_same_client(txn, self._core.coordinator)
        delay = None if deliver_after is None and deliver_at is None else check_delivery(deliver_after, deliver_at)
        ordering = None if ordering_key is None else check_ordering_key(ordering_key)
        if callback is not None and not callable(callback):
            raise TypeError("callback must be callable")
        if txn is None:
            producer = self._partition_for(key)
            if producer.queue_full:
                raise ProducerQueueIsFullError(f"{producer}: {producer.options.max_pending_messages} messages pending")
            if producer._held:                  # sends made before this one wait there: it goes behind them
                future = producer.submit_behind_held(payload, key, props, event_time, sequence_id, delay,
                                                     ordering_key=ordering)
            else:
                future = producer.submit(payload, key, props, event_time, sequence_id, None, deliver_at=delay,
                                         ordering_key=ordering)
        else:
            future = self._send_async_in_txn(payload, key, props, event_time, sequence_id, txn, delay, ordering)
        if callback is not None:
            def done(settled: asyncio.Future[MessageId]) -> None:
                if settled.cancelled():
                    callback(asyncio.CancelledError(), None)
                elif settled.exception() is not None:
                    callback(settled.exception(), None)
                else:
                    callback(None, settled.result())
            future.add_done_callback(done)
        return future

    async def flush(self) -> None:
        await asyncio.gather(*(p.flush() for p in self._partitions))

    async def close(self) -> None:
        """Flush, then close every partition's producer; a cancelled close still finishes (see
        RunOnce), and a second close() waits for it."""
        await self._closing()

    async def _close(self) -> None:
        self._closed = True
        if self._partitions_update is not None:
            self._partitions_update.cancel()
        await asyncio.gather(*(p.close() for p in self._partitions))
        self._core.forget(self)
