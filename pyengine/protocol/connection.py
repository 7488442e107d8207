"""One client connection: the Pulsar binary protocol on an asyncio Protocol.

Bytes go through `core_ext.frames.FrameDecoder` (bad checksums reported, not raised), each
frame's BaseCommand is dispatched by type to a handler. Handlers that only touch memory run
inline (SEND, FLOW, ACK, PING, lookups); those that wait for storage or other clients run as
tasks. Replies are collected and written once per event-loop turn (`writelines`).

What makes this connection close, and only this one: a frame that cannot be split or is larger
than allowed, a command that does not decode (or lacks a required field), a command type a
broker does not receive, anything before CONNECT or a second CONNECT, a SEND for a producer
this connection never created (Apache's rule), no CONNECT within `keepalive_interval` seconds,
and keep-alive silence (a PING goes out after `keepalive_interval` seconds without any frame
from the client; another interval of silence closes). Everything else gets the protocol's
answer: errors of requests inside their own responses for lookups and transaction commands,
SEND_ERROR for sends, ERROR otherwise.

Request ids are only echoed: the client runs two independent counters on one connection (its
lookup service and its producers/consumers), so no state is keyed by request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, cast

from core_ext.frames import FrameDecoder, FrameError
from pyengine.broker.consumer import NO_CONSUMER_EPOCH, Consumer
from pyengine.broker.dispatcher import SINGLE_ACTIVE_TYPES
from pyengine.broker.subscription import Subscription
from pyengine.broker.topic import Topic
from pyengine.broker.transactions import append_condition
from pyengine.errors import (
    ChecksumError,
    ConsumerBusyError,
    IncompatibleSchemaError,
    InvalidTopicNameError,
    MetadataError,
    NotAllowedError,
    ProducerBusyError,
    PulsarError,
    ServiceNotReadyError,
    TopicFencedError,
    TransactionNotFoundError,
    to_pulsar_error,
)
from pyengine.naming import TopicName
from pyengine.protocol import lookup, replies
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.access_modes import SHARED, TOPIC_EPOCH_PROPERTY
from pyengine.protocol.commands import BODY_FIELD, ProtocolError, parse_command
from pyengine.protocol.network_consumer import NetworkConsumer
from pyengine.protocol.network_producer import NetworkProducer
from pyengine.protocol.transactions import TransactionCommands, txn_id
from pyengine.protocol.scalable import ScalableTopicCommands, consumer_assignment, scalable_topic_update
from pyengine.protocol.schema_codec import schema_from_proto
from pyengine.protocol.text import undecodable_text
from pyengine.schema import decode_version, encode_version, schema_id
from pyengine.storage.entry import split_headers_and_payload
from pyengine.transaction.outcome import mark_retrieved
from pyengine.transaction.pendingack import IndividualAck
from pyengine_kernels import Position, TxnId, ackset_is_fully_acked

if TYPE_CHECKING:
    from pyengine.protocol.server import ProtocolServer

log = logging.getLogger(__name__)

BaseCommand = pb.BaseCommand
_SUB_TYPES = {pb.CommandSubscribe.Exclusive: "exclusive", pb.CommandSubscribe.Shared: "shared",
              pb.CommandSubscribe.Failover: "failover", pb.CommandSubscribe.Key_Shared: "key_shared"}
_LATEST_LEDGER = (1 << 63) - 1          # MessageId.latest is (2^63-1, 2^63-1)
# Apache's maxPendingPublishRequestsPerConnection: stop reading while this many sends are
# being stored, resume at half.
MAX_PENDING_SENDS = 1000
# Bytes of a stored entry before its metadata: [0x0e01 + CRC32C], the 4-byte metadata size.
_HEADERS_SIZE = {True: 2 + 4 + 4, False: 4}
_parse_base_command = BaseCommand.FromString
_parse_metadata = pb.MessageMetadata.FromString


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _named_position(message_id: pb.MessageIdData) -> Position:
    """The position a client's message id names. Read as Java's signed longs, an id below -1
    (2^64-2 on the wire) names no entry: NotAllowed, as any ack of a position holding none."""
    ledger_id, entry_id = _signed(message_id.ledgerId), _signed(message_id.entryId)
    if ledger_id < -1 or entry_id < -1:
        raise NotAllowedError(f"message id ({ledger_id}, {entry_id}) names no entry")
    return Position(ledger_id, entry_id)


def _metadata_facts(raw: bytes) -> tuple[int, bool, int | None, int] | None:
    """The publish time of a SEND's MessageMetadata (seeks by time find entries by it),
    whether it is a chunk before its message's last (de-duplication skips those, as Apache's
    since #20948: every chunk carries the message's sequence id), its deliver_at_time (None:
    not delayed) and the entry's number of messages, or None when the metadata does not decode
    or lacks a required field.

    The number of messages is the metadata's num_messages_in_batch (1 when absent), as Apache's
    dispatchers read it from each entry: it is what consumers split the batch by, so batch-index
    acks are checked against it. CommandSend.num_messages, which a client may set otherwise,
    only bounds the sequence ids its receipt may name."""
    try:
        metadata = _parse_metadata(raw)
    except Exception:
        return None
    if not metadata.IsInitialized():
        return None
    deliver_at = metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None
    batch_size = metadata.num_messages_in_batch if metadata.HasField("num_messages_in_batch") else 1
    return (metadata.publish_time, metadata.chunk_id < metadata.num_chunks_from_msg - 1, deliver_at,
            max(batch_size, 1))


def _decode(raw: bytes) -> pb.BaseCommand:
    """The frame's command. The fast path lets upb check required fields; anything wrong goes
    through `parse_command` again for its precise ProtocolError."""
    try:
        cmd = _parse_base_command(raw)
    except Exception:
        return parse_command(raw)          # raises ProtocolError
    if cmd.IsInitialized() and cmd.WhichOneof("body") == BODY_FIELD.get(cmd.type):
        return cmd
    return parse_command(raw)


class ServerConnection(asyncio.Protocol):
    def __init__(self, server: ProtocolServer) -> None:
        self.server = server
        self.service = server.service
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.broker_url = ""
        self.client_version = ""
        self.connected = False          # CONNECT handled
        self.closed = False
        self.producers: dict[int, NetworkProducer] = {}
        # WaitForExclusive producers queued for the topic: not producers of this connection yet.
        self._waiting_producers: dict[int, NetworkProducer] = {}
        self._closing_producers: dict[int, NetworkProducer] = {}     # closed, their sends being stored
        self.consumers: dict[int, NetworkConsumer] = {}
        self.txn = TransactionCommands(self)
        self.scalable = ScalableTopicCommands(self)
        self._decoder = FrameDecoder(max_frame_size=server.max_frame_size, checksum_errors="report")
        self._creating: set[tuple[str, int]] = set()
        # PRODUCER / SUBSCRIBE requests not finished yet, numbered in arrival order, and where a
        # CLOSE_PRODUCER / CLOSE_CONSUMER of an id that was not created yet came: the creations
        # requested before it are given up (Apache: "closed before creation was complete").
        self._creations = 0
        self._creations_in_flight: dict[tuple[str, int], int] = {}
        self._closed_while_creating: dict[tuple[str, int], int] = {}
        # Ids of producers the broker closed, each for one keep-alive interval (Apache's
        # recentlyClosedProducers): their SENDs written before the client saw the close are
        # ignored. Timed, or a connection would keep one per producer fenced for good.
        self._recently_closed_producers: dict[int, asyncio.TimerHandle] = {}
        self._out: list[bytes] = []
        self._flush_pending = False
        self._reading = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending_sends = 0
        # Reads are paused (`_paused`) for any of three reasons: this connection's sends in
        # flight, the broker's publish buffer, a shutdown.
        self._paused = False
        self._over_pending_sends = False
        self._over_publish_buffer = False
        self._shutting_down = False
        self._writable = True           # the transport's write buffer is below its high mark
        self._heard = True
        self._ping_outstanding = False
        self._keepalive: asyncio.TimerHandle | None = None
        self._liveness_waiters: list[asyncio.Future[None]] = []
        self._loop = asyncio.get_running_loop()

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)     # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.broker_url = self.server.broker_url_for(transport)
        self.server.connection_opened(self)
        self._arm_keepalive()

    def data_received(self, data: bytes) -> None:
        self._heard = True
        if self._liveness_waiters:
            for waiter in self._liveness_waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self._liveness_waiters.clear()
        broken = None
        try:
            frames = self._decoder.feed(data)
        except FrameError as exc:
            frames, broken = exc.frames, exc      # the frames before the broken one still count
        self._reading = True
        try:
            for frame in frames:
                if self.closed:
                    break
                self._handle_frame(frame)
        finally:
            self._reading = False
            self._flush()
        if broken is not None and not self.closed:
            log.warning("%s: closing the connection, broken frame: %s", self.peer, broken)
            self.close()

    def eof_received(self) -> bool:
        return False                    # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._teardown()

    def pause_writing(self) -> None:
        # Its write buffer is full: its consumers are given nothing more until it drains (as
        # Pulsar's dispatchers skip a consumer whose channel is not writable), or a consumer
        # with huge permits that does not read makes the broker hold the whole backlog.
        self._writable = False
        for consumer in self.consumers.values():
            if consumer.broker_consumer is not None:
                consumer.broker_consumer.writable = False

    def resume_writing(self) -> None:
        self._writable = True
        for consumer in list(self.consumers.values()):
            if consumer.broker_consumer is not None:
                consumer.broker_consumer.writable = True
                if consumer.subscription is not None:
                    consumer.subscription.dispatcher.notify()

    # --- dispatch -------------------------------------------------------------------------

    def _handle_frame(self, frame: Any) -> None:
        try:
            cmd = _decode(frame.command)
        except ProtocolError as exc:
            log.warning("%s: closing the connection, bad command: %s", self.peer, exc)
            self.close()
            return
        type_ = cmd.type
        if not self.connected:
            if type_ != BaseCommand.CONNECT:
                log.warning("%s: closing the connection, %s before CONNECT", self.peer, BaseCommand.Type.Name(type_))
                self.close()
                return
        elif type_ == BaseCommand.CONNECT:
            log.warning("%s: closing the connection, second CONNECT", self.peer)
            self.close()
            return
        handler = _HANDLERS.get(type_)
        if handler is None:
            log.warning("%s: closing the connection, a broker does not handle %s", self.peer,
                        BaseCommand.Type.Name(type_))
            self.close()
            return
        body = getattr(cmd, BODY_FIELD[type_])
        refuse = _TEXT_REFUSALS.get(type_)
        if refuse is not None:
            path = undecodable_text(body)
            if path is not None:
                error_type = InvalidTopicNameError if path.split(".")[-1].split("[")[0] in (
                    "topic", "partitions") else NotAllowedError
                refuse(self, body, error_type(f"{BaseCommand.Type.Name(type_)}: {path} is not UTF-8 text"))
                return
        try:
            handler(self, body, frame)
        except Exception as exc:           # a bug: answer if we can, never take the broker down
            log.exception("%s: %s failed", self.peer, BaseCommand.Type.Name(type_))
            request_id = getattr(body, "request_id", None)
            if request_id is not None and type_ not in _LOOKUP_TYPES:
                self._fail(request_id, exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: request handler failed", self.peer, exc_info=task.exception())

    def _request(self, request_id: int, coro: Coroutine[Any, Any, None]) -> None:
        """Run a request's handler; any failure is answered with ERROR."""
        async def run() -> None:
            try:
                await coro
            except Exception as exc:
                self._fail(request_id, exc)
        self._spawn(run())

    def _fail(self, request_id: int, exc: BaseException) -> None:
        error = to_pulsar_error(exc)
        if error.server_error == pb.UnknownError:
            log.error("%s: request %d failed", self.peer, request_id, exc_info=exc)
        self.write(replies.error(request_id, error.server_error, str(error)))

    # --- writing --------------------------------------------------------------------------

    def write(self, frame: bytes) -> None:
        self._out.append(frame)
        self._schedule_flush()

    def write_many(self, frames: list[bytes]) -> None:
        self._out.extend(frames)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._reading and not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        if not self._out:
            return
        out, self._out = self._out, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close this connection (pending replies are written first)."""
        if self.closed:
            return
        self._flush()
        self._teardown()
        if self.transport is not None:
            self.transport.close()

    def _teardown(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()
        for waiter in self._liveness_waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionError("connection closed"))
        self._liveness_waiters.clear()
        for timer in self._recently_closed_producers.values():
            timer.cancel()
        self._recently_closed_producers.clear()
        for producer in [*self.producers.values(), *self._waiting_producers.values(),
                         *self._closing_producers.values()]:
            self._release_producer(producer)
        self.producers.clear()
        self._closing_producers.clear()
        for consumer in list(self.consumers.values()):
            self._release_consumer(consumer)
        self.consumers.clear()
        self.txn.connection_closed()           # its transaction-key epochs are no longer held
        self.scalable.connection_closed()
        self.server.connection_closed(self)

    async def shutdown(self, timeout: float) -> None:
        """Stop reading, let the sends in flight be stored and answered, then close."""
        if self.closed:
            return
        self._shutting_down = True
        self._update_reading()
        # The closing producers' too: their receipts (and their close's SUCCESS) are answered.
        pending = [producer.wait_idle() for producer in [*self.producers.values(), *self._closing_producers.values()]]
        if pending:
            await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), timeout)
        self.close()

    async def wait_for_tasks(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    # --- keep-alive -----------------------------------------------------------------------

    def _arm_keepalive(self) -> None:
        self._keepalive = self._loop.call_later(self.server.keepalive_interval, self._keepalive_tick)

    def _keepalive_tick(self) -> None:
        if self.closed:
            return
        if not self.connected:
            # As Pulsar's keep-alive: no CONNECT within an interval closes, whatever came (a peer
            # trickling bytes of a frame that never ends was heard, and kept for good).
            log.info("%s: closing the connection, no CONNECT after %.1f s", self.peer,
                     self.server.keepalive_interval)
            self.close()
            return
        if self._heard:
            self._heard = False
            self._ping_outstanding = False
        elif self._paused:
            # Its reads are paused by the broker (sends piling up on storage): its answer to a
            # PING cannot be seen, so silence proves nothing (as Pulsar's handleKeepAliveTimeout,
            # which closes only a channel that reads).
            pass
        elif self._ping_outstanding:
            log.info("%s: closing the connection after %.1f s of silence", self.peer, self.server.keepalive_interval)
            self.close()
            return
        else:
            self._ping_outstanding = True
            self.write(replies.PING_FRAME)
        self._arm_keepalive()

    async def check_liveness(self, timeout: float) -> bool:
        """Whether the client still answers (a PING, then any frame within `timeout`)."""
        if self.closed:
            return False
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._liveness_waiters.append(waiter)
        self.write(replies.PING_FRAME)
        try:
            await asyncio.wait_for(waiter, timeout)
        except (asyncio.TimeoutError, ConnectionError):
            return False
        return True

    # --- flow control of sends ------------------------------------------------------------

    def sends_started(self, count: int, size: int) -> None:
        """`count` sends of `size` bytes in all are being stored."""
        self._pending_sends += count
        if self._pending_sends >= MAX_PENDING_SENDS and not self._over_pending_sends:
            self._over_pending_sends = True
            self._update_reading()
        self.server.publish_buffer_grew(size)
        if self.server.publish_buffer_full and not self._over_publish_buffer:
            # Full before this send: this connection had no producer when it filled, so
            # its own send pauses it (Apache checks the threshold on every send).
            self.throttle_for_publish_buffer(True)

    def sends_finished(self, count: int, size: int) -> None:
        self._pending_sends -= count
        if self._over_pending_sends and self._pending_sends <= MAX_PENDING_SENDS // 2:
            self._over_pending_sends = False
            self._update_reading()
        self.server.publish_buffer_shrank(size)

    def throttle_for_publish_buffer(self, over: bool) -> None:
        """The broker's publish buffer is full (`over`), or below its resume mark again."""
        self._over_publish_buffer = over
        self._update_reading()

    def _update_reading(self) -> None:
        paused = self._over_pending_sends or self._over_publish_buffer or self._shutting_down
        if paused != self._paused and self.transport is not None and not self.closed:
            self._paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # --- connection commands --------------------------------------------------------------

    def _on_connect(self, body: pb.CommandConnect, frame: Any) -> None:
        self.client_version = body.client_version
        # Apache answers the lower of the two versions; the official client speaks 20.
        version = min(body.protocol_version, replies.PROTOCOL_VERSION)
        self.write(replies.connected(self.server.server_version, version, self.server.max_message_size))
        self.connected = True

    def _on_ping(self, body: pb.CommandPing, frame: Any) -> None:
        self.write(replies.PONG_FRAME)

    def _on_pong(self, body: pb.CommandPong, frame: Any) -> None:
        self._ping_outstanding = False

    # --- lookups --------------------------------------------------------------------------

    def _on_partitioned_metadata(self, body: pb.CommandPartitionedTopicMetadata, frame: Any) -> None:
        try:
            partitions = lookup.partition_count(self.service, body.topic)
            created = 0 if partitions else lookup.auto_partitions(self.service, TopicName.parse(body.topic))
        except Exception as exc:
            self._partitioned_metadata_failed(body.request_id, exc)
            return
        if created:
            self._spawn(self._create_partitioned_topic(body, created))
            return
        self.write(replies.partitioned_metadata(body.request_id, partitions))

    async def _create_partitioned_topic(self, body: pb.CommandPartitionedTopicMetadata, partitions: int) -> None:
        try:
            partitions = await lookup.create_partitioned_topic(self.service, TopicName.parse(body.topic), partitions)
        except Exception as exc:
            self._partitioned_metadata_failed(body.request_id, exc)
            return
        self.write(replies.partitioned_metadata(body.request_id, partitions))

    def _partitioned_metadata_failed(self, request_id: int, exc: Exception) -> None:
        error = to_pulsar_error(exc)
        self.write(replies.partitioned_metadata_failed(request_id, error.server_error, str(error)))

    def _on_lookup(self, body: pb.CommandLookupTopic, frame: Any) -> None:
        try:
            lookup.resolve_topic(self.service, body.topic)
        except Exception as exc:
            error = to_pulsar_error(exc)
            self.write(replies.lookup_failed(body.request_id, error.server_error, str(error)))
            return
        if body.topic.startswith("segment://"):     # served by the broker that owns the segment
            self._spawn(self.scalable.lookup_segment(body))
            return
        # The URL the client connected to, so that it reuses this connection (its pool is
        # keyed by the URL string).
        self.write(replies.lookup_connect(body.request_id, self.broker_url))

    def _on_get_topics_of_namespace(self, body: pb.CommandGetTopicsOfNamespace, frame: Any) -> None:
        try:
            topics = lookup.topics_of_namespace(self.service, body.namespace, body.mode)
        except Exception as exc:
            self._fail(body.request_id, exc)
            return
        self.write(replies.topics_of_namespace(body.request_id, topics))

    def _on_get_schema(self, body: pb.CommandGetSchema, frame: Any) -> None:
        self._spawn(self._get_schema(body))

    async def _get_schema(self, body: pb.CommandGetSchema) -> None:
        try:
            name = schema_id(lookup.resolve_topic(self.service, body.topic))
            if body.HasField("schema_version"):
                if not body.schema_version:
                    raise IncompatibleSchemaError("Empty schema version")
                stored = self.service.schemas.registry.get(name, decode_version(body.schema_version))
            else:
                stored = self.service.schemas.registry.latest(name)
        except Exception as exc:
            error = to_pulsar_error(exc)
            self.write(replies.schema_error(body.request_id, error.server_error, str(error)))
            return
        if stored is None:          # Apache's answer for no schema, or no such version
            self.write(replies.schema_error(body.request_id, pb.TopicNotFound,
                                            f"Topic not found or no-schema {body.topic}"))
            return
        self.write(replies.get_schema_response(body.request_id, name, stored))

    def _on_get_or_create_schema(self, body: pb.CommandGetOrCreateSchema, frame: Any) -> None:
        self._spawn(self._get_or_create_schema(body))

    async def _get_or_create_schema(self, body: pb.CommandGetOrCreateSchema) -> None:
        try:
            topic_name = lookup.resolve_topic(self.service, body.topic)
            topic = await self.service.get_topic(str(topic_name), create=False)
            version = await self.service.schemas.for_producer(topic, schema_from_proto(body.schema))
        except Exception as exc:
            error = to_pulsar_error(exc)
            self.write(replies.get_or_create_schema_error(body.request_id, error.server_error, str(error)))
            return
        self.write(replies.get_or_create_schema_response(body.request_id, version))

    # --- producers ------------------------------------------------------------------------

    def _on_producer(self, body: pb.CommandProducer, frame: Any) -> None:
        key = ("producer", body.producer_id)
        self._request(body.request_id, self._creation(key, self._create_producer(body, self._creation_started(key))))

    def _creation_started(self, key: tuple[str, int]) -> int:
        number = self._creations
        self._creations += 1
        self._creations_in_flight[key] = self._creations_in_flight.get(key, 0) + 1
        return number

    async def _creation(self, key: tuple[str, int], coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        finally:
            left = self._creations_in_flight[key] - 1
            if left:
                self._creations_in_flight[key] = left
            else:
                del self._creations_in_flight[key]
                self._closed_while_creating.pop(key, None)

    def _closed_before_created(self, key: tuple[str, int], number: int) -> bool:
        return self._closed_while_creating.get(key, -1) > number

    def _close_while_creating(self, key: tuple[str, int]) -> None:
        if key in self._creations_in_flight:
            self._closed_while_creating[key] = self._creations

    async def _create_producer(self, body: pb.CommandProducer, number: int) -> None:
        request_id, producer_id = body.request_id, body.producer_id
        topic_name = lookup.resolve_topic(self.service, body.topic)
        existing = self.producers.get(producer_id)
        if existing is not None:
            if existing.topic.name != str(topic_name):
                raise ProducerBusyError(f"producer id {producer_id} is in use on {existing.topic.name}")
            self.write(replies.producer_success(request_id, existing.name, existing.producer.last_sequence_id,
                                                schema_version=existing.schema_version))
            return
        key = ("producer", producer_id)
        if key in self._creating:
            raise ServiceNotReadyError(f"producer {producer_id} is already being created")
        self._creating.add(key)
        try:
            lookup.check_attachable(self.service, topic_name)
            topic = await self.service.get_topic(str(topic_name), create=self.service.auto_creates(topic_name))
            schema = schema_from_proto(body.schema) if body.HasField("schema") else None
            schema_version = encode_version(await self.service.schemas.for_producer(topic, schema))
            name = body.producer_name or self.service.generate_producer_name()
            if self.closed:
                return
            if self._closed_before_created(key, number):
                # Before the access mode is asked for: a WaitForExclusive one would be queued
                # for nobody (Shared producers of the topic refused while it waits).
                raise ServiceNotReadyError(f"producer {producer_id} was closed before its creation was complete")
            # The access mode first, then the name, as Pulsar's AbstractTopic.addProducer: an
            # ExclusiveWithFencing producer fences one of its own name (a restarted task), a
            # WaitForExclusive one waits for it to leave, an Exclusive one is ProducerFenced.
            network = NetworkProducer(self, producer_id, topic, None, name=name, epoch=body.epoch,
                                      exclusive=body.producer_access_mode != SHARED, schema_version=schema_version)
            grant = self.server.access.acquire(
                topic.name, network, body.producer_access_mode,
                body.topic_epoch if body.HasField("topic_epoch") else None, self.server.fence_producer,
                int(topic.ledger.properties.get(TOPIC_EPOCH_PROPERTY, 0)))
            if isinstance(grant, asyncio.Future):
                # WaitForExclusive: not a producer of this connection until granted, as in
                # Pulsar: a SEND before then closes the connection, a PRODUCER again is
                # ServiceNotReady (it is being created), a CLOSE_PRODUCER stops the wait.
                self.write(replies.producer_success(request_id, name, -1, ready=False, schema_version=schema_version))
                self._waiting_producers[producer_id] = network
                try:
                    grant = await grant
                except BaseException:
                    self.server.detach_producer(network)
                    raise
                finally:
                    self._waiting_producers.pop(producer_id, None)
                if network.closed or self.closed:
                    self.server.detach_producer(network)
                    if self.closed:
                        return
                    # Closed by the client, or fenced between its grant and now (no
                    # CLOSE_PRODUCER told it: it is not ours yet): answered, or it waits for ever.
                    raise ServiceNotReadyError(f"producer {producer_id} was closed before its creation was complete")
            try:
                producer = await self.server.attach_producer(self, topic, name)
            except BaseException:
                self.server.detach_producer(network)
                raise
            if network.closed:                      # fenced while the name was being taken
                topic.remove_producer(producer)
                raise ServiceNotReadyError(f"producer {producer_id} was closed before its creation was complete")
            network.attach(producer)
            producer.on_disconnect = lambda: self.disconnect_producer(network)
            if body.initial_subscription_name:
                await self._create_initial_subscription(topic, network, body.initial_subscription_name)
            if self.closed:
                self.server.detach_producer(network)
                return
            self._check_topic_still_open(topic, network)
            if network.closed or self._closed_before_created(key, number):
                # Closed by the client, disconnected by the broker, or fenced by an
                # ExclusiveWithFencing producer meanwhile.
                self.server.detach_producer(network)
                raise ServiceNotReadyError(f"producer {producer_id} was closed before its creation was complete")
            if grant is not None:
                # Durable before the producer hears it, as Pulsar stores the epoch: a restart
                # must not let a producer of an older grant back in.
                try:
                    await topic.ledger.set_property(TOPIC_EPOCH_PROPERTY, str(grant))
                except BaseException:
                    self.server.detach_producer(network)
                    raise
                if not self.closed:
                    self._check_topic_still_open(topic, network)
                # Fenced, gone, or closed by the client (CLOSE_PRODUCER) meanwhile.
                if network.closed or self.closed or self._closed_before_created(key, number):
                    self.server.detach_producer(network)
                    if self.closed:
                        return
                    raise ServiceNotReadyError(f"producer {producer_id} was closed before its creation was complete")
            self.producers[producer_id] = network
            self.server.producer_attached(network)
            self._forget_closed_producer(producer_id)
            self.write(replies.producer_success(request_id, network.name, producer.last_sequence_id,
                                                topic_epoch=grant, schema_version=schema_version))
        finally:
            self._creating.discard(key)

    def _check_topic_still_open(self, topic: Topic, network: NetworkProducer) -> None:
        """A producer attached, then its topic closed (unloaded, or its deletion begun) while its
        creation awaited storage: not created (the topic's close disconnected it), refused as
        Pulsar refuses a producer of a fenced topic (TopicFencedException: ServiceNotReady, which
        clients retry, to find the topic loaded or created again), never answered
        PRODUCER_SUCCESS for the closed topic."""
        if topic.closed:
            self.server.detach_producer(network)
            raise TopicFencedError(f"topic {topic.name} is closed (being unloaded or deleted): "
                                   f"producer {network.producer_id} not created")

    async def _create_initial_subscription(self, topic: Any, network: NetworkProducer, name: str) -> None:
        """CommandProducer.initial_subscription_name: as Pulsar's ServerCnx.handleProducer, once
        the producer is on the topic, a durable subscription `name` is created at the earliest
        position if the topic has none of that name, where auto subscription creation is allowed.
        If it cannot be, the producer is not created."""
        if name in topic.subscriptions:
            return
        try:
            self.service.check_initial_subscription(topic)
            await topic.open_subscription(name, "earliest")
        except Exception as exc:
            self.server.detach_producer(network)
            error = to_pulsar_error(exc)
            raise type(error)(f"Failed to create the initial subscription: {error}") from exc

    def _release_producer(self, producer: NetworkProducer) -> None:
        self.server.detach_producer(producer)

    def fence_producer(self, producer: NetworkProducer) -> None:
        """Another producer took the topic exclusively: tell the client and forget this one
        (one still being created is closed: its creation fails)."""
        if self.producers.get(producer.producer_id) is producer:
            del self.producers[producer.producer_id]
            self._closed_by_broker(producer.producer_id)
            self.write(replies.close_producer(producer.producer_id))
        self.server.detach_producer(producer, release_access=False)

    def disconnect_producer(self, producer: NetworkProducer) -> None:
        """The broker closes the producer (a backlog quota): CLOSE_PRODUCER makes the client
        reconnect (as Pulsar's Producer.disconnect). One still being created fails instead: its
        creation sees it closed, and the client retries."""
        if self.producers.get(producer.producer_id) is producer:
            del self.producers[producer.producer_id]
            self._closed_by_broker(producer.producer_id)
            self.write(replies.close_producer(producer.producer_id))
            self.server.detach_producer(producer)
        else:
            self._close_while_creating(("producer", producer.producer_id))

    def _closed_by_broker(self, producer_id: int) -> None:
        self._forget_closed_producer(producer_id)
        self._recently_closed_producers[producer_id] = self._loop.call_later(
            self.server.keepalive_interval, self._recently_closed_producers.pop, producer_id, None)

    def _forget_closed_producer(self, producer_id: int) -> None:
        timer = self._recently_closed_producers.pop(producer_id, None)
        if timer is not None:
            timer.cancel()

    def _on_close_producer(self, body: pb.CommandCloseProducer, frame: Any) -> None:
        producer = self.producers.pop(body.producer_id, None)
        if producer is not None and producer.in_flight:
            self._closing_producers[body.producer_id] = producer
            self._spawn(self._close_after_sends(producer, body.request_id))
            return
        if producer is None:
            producer = self._waiting_producers.get(body.producer_id)     # leaves the queue
        if producer is not None:
            self._release_producer(producer)
        else:
            self._close_while_creating(("producer", body.producer_id))
        self.write(replies.success(body.request_id))       # also for an unknown id, as Apache

    async def _close_after_sends(self, producer: NetworkProducer, request_id: int) -> None:
        """As Pulsar's Producer.close: answered, and the name given up, once the producer's
        sends are stored and answered. A producer of the same name created next then continues
        after their sequence ids (freed at once, it was told an older last sequence id, and its
        next message, taken for a duplicate of one still being written, was lost)."""
        try:
            await producer.wait_idle()
        finally:
            if self._closing_producers.get(producer.producer_id) is producer:
                del self._closing_producers[producer.producer_id]
            self._release_producer(producer)
        self.write(replies.success(request_id))

    def _on_send(self, body: pb.CommandSend, frame: Any) -> None:
        producer = self.producers.get(body.producer_id)
        if producer is None:
            if body.producer_id in self._recently_closed_producers:
                return                  # sent before the client saw our CLOSE_PRODUCER
            log.warning("%s: closing the connection, SEND for producer %d that is not ready",
                        self.peer, body.producer_id)
            self.close()
            return
        sequence_id = body.sequence_id
        if frame.checksum_valid is False:
            producer.reject(sequence_id, ChecksumError.server_error, "the message checksum is wrong")
            return
        data = frame.headers_and_payload
        if data is None:
            producer.reject(sequence_id, pb.MetadataError, "a SEND frame must carry metadata and payload")
            return
        raw_metadata = frame.metadata
        # The limit is the payload's, as clients check it before sending (the checksum and the
        # metadata come on top, within the frame limit's padding, as in Apache's broker).
        if len(data) - len(raw_metadata) - _HEADERS_SIZE[frame.checksum is not None] > self.server.max_message_size:
            producer.reject(sequence_id, pb.NotAllowedError,
                            f"messages bigger than {self.server.max_message_size} bytes are rejected")
            return
        published = _metadata_facts(raw_metadata)
        if published is None:
            producer.reject(sequence_id, pb.MetadataError, "the message metadata does not decode or lacks a field")
            return
        publish_time, first_chunks, deliver_at, num_messages = published
        # The client numbers the messages of a batch consecutively (it expects the receipt's
        # sequence id in [first, first + n - 1]); never past uint64, or its receipt cannot be
        # built and the producer's answers stop.
        highest = min(max(body.highest_sequence_id, sequence_id + max(body.num_messages, 1) - 1), replies.U64 - 1)
        topic = producer.topic
        try:
            if body.HasField("txnid_most_bits") or body.HasField("txnid_least_bits"):
                txn = txn_id(body.txnid_most_bits, body.txnid_least_bits)
                outcome = self._publish_in_txn(producer, txn, data, sequence_id, num_messages, publish_time, highest,
                                               first_chunks, deliver_at)
            else:
                outcome = topic.publish(producer.producer, data, sequence_id=sequence_id, num_messages=num_messages,
                                        publish_time=publish_time, highest_sequence_id=highest,
                                        deduplicate=not first_chunks, deliver_at=deliver_at)
        except Exception as exc:
            error = to_pulsar_error(exc)
            producer.reject(sequence_id, error.server_error, str(error))
            return
        producer.track(sequence_id, highest, outcome, len(data))

    def _publish_in_txn(self, producer: NetworkProducer, txn: TxnId, data: bytes, sequence_id: int,
                        num_messages: int, publish_time: int, highest: int,
                        first_chunks: bool = False, deliver_at: int | None = None) -> asyncio.Future[Position | None]:
        """Register the partition with the txn (a no-op after the first time; it fails for a
        txn that is not open) and append in the same turn: one LMDB transaction holds both."""
        topic = producer.topic
        coordinator = self.service.coordinator
        if coordinator.partition_registered(txn, topic.name):
            # Durably registered (every later send of the txn here): nothing to wait for.
            return topic.publish(producer.producer, data, sequence_id=sequence_id, num_messages=num_messages,
                                 publish_time=publish_time, highest_sequence_id=highest, txn=txn,
                                 deduplicate=not first_chunks, deliver_at=deliver_at)
        registration = coordinator.register_produced_partitions(txn, [topic.name])
        registration.add_done_callback(mark_retrieved)
        stored = topic.publish(producer.producer, data, sequence_id=sequence_id, num_messages=num_messages,
                               publish_time=publish_time, highest_sequence_id=highest, txn=txn,
                               after=append_condition(txn, registration), deduplicate=not first_chunks,
                               deliver_at=deliver_at)

        async def both() -> Position | None:
            try:
                await registration
            finally:
                position = await stored
            return position
        return asyncio.ensure_future(both())

    # --- consumers ------------------------------------------------------------------------

    def _on_subscribe(self, body: pb.CommandSubscribe, frame: Any) -> None:
        key = ("consumer", body.consumer_id)
        self._request(body.request_id, self._creation(key, self._subscribe(body, self._creation_started(key))))

    async def _subscribe(self, body: pb.CommandSubscribe, number: int) -> None:
        request_id, consumer_id = body.request_id, body.consumer_id
        topic_name = lookup.resolve_topic(self.service, body.topic)
        existing = self.consumers.get(consumer_id)
        if existing is not None:
            if existing.topic.name != str(topic_name) or existing.subscription_name != body.subscription:
                raise ConsumerBusyError(f"consumer id {consumer_id} is in use on {existing.topic.name}")
            self.write(replies.success(request_id))
            return
        key = ("consumer", consumer_id)
        if key in self._creating:
            raise ServiceNotReadyError(f"consumer {consumer_id} is already being created")
        if not body.subscription:
            raise NotAllowedError("a subscription needs a name")
        self._creating.add(key)
        try:
            lookup.check_attachable(self.service, topic_name)
            sub_type = _SUB_TYPES[body.subType]
            topic = await self.service.get_topic(
                str(topic_name), create=body.force_topic_creation and self.service.auto_creates(topic_name))
            auto_consume = body.HasField("schema") and body.schema.type == pb.Schema.AUTO_CONSUME
            if body.HasField("schema") and not auto_consume:
                await self.service.schemas.for_consumer(topic, schema_from_proto(body.schema))
            await self.server.wait_for_seek(topic.name, body.subscription)
            consumer = NetworkConsumer(self, consumer_id, topic, body.subscription, sub_type, body.durable)
            sticky = None
            if body.HasField("keySharedMeta") and body.keySharedMeta.keySharedMode == pb.STICKY:
                sticky = [(r.start, r.end) for r in body.keySharedMeta.hashRanges]
            out_of_order = (sub_type == "key_shared" and body.HasField("keySharedMeta")
                            and body.keySharedMeta.allowOutOfOrderDelivery)
            epoch = body.consumer_epoch if body.HasField("consumer_epoch") else NO_CONSUMER_EPOCH
            broker_consumer = Consumer(consumer, name=body.consumer_name or None, priority=body.priority_level,
                                       sticky_ranges=sticky, allow_out_of_order_delivery=out_of_order,
                                       consumer_epoch=epoch)
            broker_consumer.auto_consume_schema = auto_consume
            broker_consumer.writable = self._writable
            subscription = await self._attach(topic, body, sub_type, broker_consumer)
            consumer.attach(subscription, broker_consumer)
            if self.closed:
                self._release_consumer(consumer)
                return
            if topic.closed:
                # As Pulsar's subscribe to a fenced topic (ServiceNotReady, retried): never
                # SUCCESS for a consumer of a closed subscription, which dispatches nothing (a
                # reader's subscription kept across its seek, say, closed with its topic).
                self._release_consumer(consumer)
                raise TopicFencedError(f"topic {topic.name} is closed (being unloaded or deleted): "
                                       f"consumer {consumer_id} not created")
            if self._closed_before_created(key, number):
                self._release_consumer(consumer)
                raise ServiceNotReadyError(f"consumer {consumer_id} was closed before its creation was complete")
            self.consumers[consumer_id] = consumer
            if broker_consumer.writable is not self._writable:      # changed while it was attached
                broker_consumer.writable = self._writable
                subscription.dispatcher.notify()
            if sub_type == "failover" and not broker_consumer.active:
                # Apache tells every joining Failover consumer whether it is the active one.
                consumer.active_changed(False)
            self.write(replies.success(request_id))
        finally:
            self._creating.discard(key)

    async def _attach(self, topic: Topic, body: pb.CommandSubscribe, sub_type: str,
                      broker_consumer: Consumer) -> Subscription:
        initial = "earliest" if body.initialPosition == pb.CommandSubscribe.Earliest else "latest"
        read_compacted = body.read_compacted
        # Those of a subscription this creates (a key given twice: its last value, as Pulsar's map).
        properties = {kv.key: kv.value for kv in body.subscription_properties}
        if body.durable:
            self.service.check_subscription_creation(topic, body.subscription)
            return await topic.subscribe(body.subscription, broker_consumer, sub_type=sub_type,
                                         initial_position=initial, read_compacted=read_compacted,
                                         subscription_properties=properties)
        # A reader that comes back after its seek finds its (moved) subscription kept for it.
        kept = self.server.take_seeked_reader(topic, body.subscription)
        if kept is not None:
            broker_consumer.read_compacted = read_compacted
            try:
                kept.add_consumer(broker_consumer, sub_type)
            except BaseException:
                # Refused (say, Sticky ranges that are not valid): kept again for a retry, or it
                # stays on the topic with no consumer and no timer to drop it.
                if not kept.consumers:
                    self.server.keep_seeked_reader(topic.name, body.subscription, kept)
                raise
            return kept
        return await topic.subscribe(body.subscription, broker_consumer, sub_type=sub_type,
                                     initial_position=initial, durable=False,
                                     start=self._reader_start(topic, body, initial),
                                     read_compacted=read_compacted, subscription_properties=properties)

    @staticmethod
    def _reader_start(topic: Topic, body: pb.CommandSubscribe, initial: str) -> Position:
        ledger = topic.ledger
        end = ledger.lac.next()
        if body.start_message_rollback_duration_sec > 0:
            rollback_ms = body.start_message_rollback_duration_sec * 1000
            return ledger.find_by_publish_time(int(time.time() * 1000) - rollback_ms)
        if body.HasField("start_message_id"):
            return _start_position(topic, body.start_message_id)
        return ledger.first_position() if initial == "earliest" else end

    def _release_consumer(self, consumer: NetworkConsumer, *, keep_reader: bool = False) -> None:
        """Detach a consumer from its subscription (its unacknowledged messages go to others)."""
        consumer.closed = True
        subscription, broker_consumer = consumer.subscription, consumer.broker_consumer
        if subscription is None or broker_consumer is None:
            return
        subscription.remove_consumer(broker_consumer)
        if not consumer.durable and not subscription.consumers:
            if keep_reader:
                self.server.keep_seeked_reader(consumer.topic.name, consumer.subscription_name, subscription)
            else:
                consumer.topic.unsubscribe_reader(subscription)

    def disconnect_consumer(self, consumer: NetworkConsumer, *, keep_reader: bool, detached: bool = False) -> None:
        """Broker-side close: CLOSE_CONSUMER now (the client reconnects that consumer), the
        detach on the next turn (the dispatcher may be iterating its consumers)."""
        if consumer.closed:
            return
        consumer.closed = True
        if self.consumers.get(consumer.consumer_id) is consumer:
            del self.consumers[consumer.consumer_id]
        self.write(replies.close_consumer(consumer.consumer_id))
        if not detached:
            self._loop.call_soon(lambda: self._release_consumer(consumer, keep_reader=keep_reader))
        elif not consumer.durable and consumer.subscription is not None:
            consumer.topic.unsubscribe_reader(consumer.subscription)

    def _consumer(self, consumer_id: int) -> NetworkConsumer:
        """The consumer a SEEK, UNSUBSCRIBE or GET_LAST_MESSAGE_ID names. An unknown one is
        answered as Apache answers them: MetadataError "Consumer not found" (ConsumerNotFound
        is for CONSUMER_STATS)."""
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            raise MetadataError(f"Consumer not found: consumer {consumer_id} is not connected")
        return consumer

    def _on_flow(self, body: pb.CommandFlow, frame: Any) -> None:
        consumer = self.consumers.get(body.consumer_id)
        if consumer is None or consumer.subscription is None or consumer.broker_consumer is None:
            return                      # Apache ignores a FLOW for an unknown consumer
        consumer.subscription.flow(consumer.broker_consumer, body.messagePermits)

    def _on_ack(self, body: pb.CommandAck, frame: Any) -> None:
        has_request = body.HasField("request_id")
        consumer = self.consumers.get(body.consumer_id)
        transactional = body.HasField("txnid_most_bits") or body.HasField("txnid_least_bits")
        if consumer is None or consumer.subscription is None:
            if has_request or transactional:
                self.write(replies.ack_response(body.consumer_id, body.request_id, None, pb.ConsumerNotFound,
                                                f"consumer {body.consumer_id} is not connected"))
            return
        if body.HasField("validation_error"):
            log.warning("%s: consumer %s could not read %d message(s) of %s (%s); acknowledging them",
                        self.peer, consumer.subscription_name, len(body.message_id), consumer.topic.name,
                        pb.CommandAck.ValidationError.Name(body.validation_error))
        if transactional:
            self._spawn(self._ack_in_txn(consumer, body))
            return
        try:
            done = self._ack(consumer, body)
        except Exception as exc:
            if has_request:
                error = to_pulsar_error(exc)
                self.write(replies.ack_response(body.consumer_id, body.request_id, None, error.server_error,
                                                str(error)))
            else:
                log.warning("%s: acknowledgement on %s failed: %s", self.peer, consumer.topic.name, exc)
            return
        if has_request:
            self._spawn(self._answer_ack(body.consumer_id, body.request_id, done))
        else:
            done.add_done_callback(_log_ack_failure)

    def _ack(self, consumer: NetworkConsumer, body: pb.CommandAck) -> asyncio.Future[None]:
        subscription = consumer.subscription
        assert subscription is not None
        if body.ack_type == pb.CommandAck.Cumulative:
            if len(body.message_id) != 1:
                raise NotAllowedError("a cumulative acknowledgement names exactly one message")
            ack = self._claimed_ack(consumer, body.message_id[0])
            if ack.ack_set is None:
                return subscription.ack_cumulative(consumer.broker_consumer, ack.position)
            # Inside a batch: everything before the entry, plus the indexes acked in it.
            before = consumer.topic.ledger.previous_position(ack.position)
            subscription.ack_cumulative(consumer.broker_consumer, before).add_done_callback(_log_ack_failure)
            return subscription.ack_individual(consumer.broker_consumer, [ack])
        acks = [self._claimed_ack(consumer, message_id) for message_id in body.message_id]
        return subscription.ack_individual(consumer.broker_consumer, acks)

    @staticmethod
    def _claimed_ack(consumer: NetworkConsumer, message_id: pb.MessageIdData) -> IndividualAck:
        """The ack of `message_id` with the batch size its client gave (our client's acks, the
        Java client's in a transaction), which the subscription checks against the entry's
        (`Subscription.check_batch_ack`): its ack set was built for that size. Without one
        (0: none), the size the broker knows."""
        if message_id.ack_set and message_id.batch_size:
            return IndividualAck(_named_position(message_id), message_id.batch_size, tuple(message_id.ack_set))
        return ServerConnection._individual_ack(consumer, message_id)

    @staticmethod
    def _individual_ack(consumer: NetworkConsumer, message_id: pb.MessageIdData) -> IndividualAck:
        position = _named_position(message_id)
        if not message_id.ack_set:
            return IndividualAck(position)
        size = consumer.broker_consumer.pending.get(position) if consumer.broker_consumer else None
        if size is None:
            # Not pending here: the stored entry says how many messages it holds. For a
            # position that holds none (which the subscription refuses), the ack set's bits
            # bound it: taken as it came, 2^31 made the broker build ack sets of billions of
            # bits (its memory gone).
            entry = consumer.topic.ledger.read_entry(position)
            bits = 64 * len(message_id.ack_set)
            if entry is not None:
                size = entry.num_messages
            elif message_id.HasField("batch_size"):
                size = min(message_id.batch_size, bits)
            else:
                size = bits
        return IndividualAck(position, size, tuple(message_id.ack_set))

    async def _answer_ack(self, consumer_id: int, request_id: int, done: asyncio.Future[None]) -> None:
        try:
            await done
        except Exception as exc:
            error = to_pulsar_error(exc)
            self.write(replies.ack_response(consumer_id, request_id, None, error.server_error, str(error)))
            return
        self.write(replies.ack_response(consumer_id, request_id))

    async def _ack_in_txn(self, consumer: NetworkConsumer, body: pb.CommandAck) -> None:
        """A transactional ack always gets an ACK_RESPONSE (the Java and Go clients wait for it)."""
        txn = None
        try:
            txn = txn_id(body.txnid_most_bits, body.txnid_least_bits)
            subscription = consumer.subscription
            assert subscription is not None
            registration = self.service.coordinator.register_acked_subscriptions(
                txn, [(consumer.topic.name, subscription.name)])
            registration.add_done_callback(mark_retrieved)
            # The ack's record is written with its registration or after it (never without it):
            # it need not wait for the registration to be durable first.
            after = append_condition(txn, registration)
            if body.ack_type == pb.CommandAck.Cumulative:
                if len(body.message_id) != 1:
                    raise NotAllowedError("a cumulative acknowledgement names exactly one message")
                ack = self._claimed_ack(consumer, body.message_id[0])
                if ack.ack_set is not None:
                    subscription.check_batch_ack(consumer.broker_consumer, ack)
                if ack.ack_set is None or ackset_is_fully_acked(list(ack.ack_set), ack.batch_size):
                    operation = subscription.ack_with_transaction(consumer.broker_consumer, txn,
                                                                  cumulative=ack.position, after=after)
                else:                       # up to a message inside a batch (the Java client's form)
                    operation = subscription.ack_cumulative_in_batch_with_transaction(
                        consumer.broker_consumer, txn, ack, after=after)
            else:
                acks = [self._claimed_ack(consumer, message_id) for message_id in body.message_id]
                operation = subscription.ack_with_transaction(consumer.broker_consumer, txn, acks=acks,
                                                              after=after)
            try:
                await operation
            finally:
                await registration          # settled by now when the record was written
        except Exception as exc:
            error = to_pulsar_error(exc)
            self.write(replies.ack_response(body.consumer_id, body.request_id, txn, error.server_error, str(error)))
            return
        self.write(replies.ack_response(body.consumer_id, body.request_id, txn))

    def _on_redeliver(self, body: pb.CommandRedeliverUnacknowledgedMessages, frame: Any) -> None:
        consumer = self.consumers.get(body.consumer_id)
        if consumer is None or consumer.subscription is None or consumer.broker_consumer is None:
            return
        if body.message_ids and consumer.sub_type in ("shared", "key_shared"):
            # (an id that names no entry has nothing to redeliver: no answer to refuse it in)
            positions = [Position(_signed(m.ledgerId), _signed(m.entryId)) for m in body.message_ids
                         if _signed(m.ledgerId) >= -1 and _signed(m.entryId) >= -1]
            consumer.subscription.redeliver_unacknowledged(consumer.broker_consumer, positions)
        else:
            # Exclusive/Failover (and the id-less form): everything unacknowledged, as Apache.
            # The PIP-84 epoch goes up with the redelivery itself: a v5 rewind may first wait
            # for its transactions' decisions, and what is sent meanwhile is of before it.
            epoch = body.consumer_epoch if body.HasField("consumer_epoch") \
                and consumer.sub_type in SINGLE_ACTIVE_TYPES else None
            consumer.subscription.redeliver_unacknowledged(consumer.broker_consumer, epoch=epoch)

    def _on_seek(self, body: pb.CommandSeek, frame: Any) -> None:
        self._request(body.request_id, self._seek(body))

    async def _seek(self, body: pb.CommandSeek) -> None:
        consumer = self._consumer(body.consumer_id)
        subscription, topic = consumer.subscription, consumer.topic
        assert subscription is not None
        ack_set = None
        if body.HasField("message_id"):
            position = _start_position(topic, body.message_id)
            earliest = _signed(body.message_id.ledgerId) < 0
            if body.message_id.ack_set and not earliest and _signed(body.message_id.entryId) >= -1 \
                    and position == _named_position(body.message_id):
                ack_set = list(body.message_id.ack_set)     # into a batch (the Java client's seek)
        elif body.HasField("message_publish_time"):
            position = topic.ledger.find_by_publish_time(body.message_publish_time)
            earliest = False
            if any(getattr(c, "read_compacted", False) for c in subscription.consumers):
                # The compacted view may hold entries of ledgers trimmed since.
                position = topic.compaction.find_by_publish_time(body.message_publish_time, position)
        else:
            raise NotAllowedError("SEEK needs a message id or a publish time")
        # As Apache: the subscription's consumers are disconnected (each is told by
        # CLOSE_CONSUMER before this SUCCESS) and subscribe again at the new position.
        # Nothing more may be dispatched to them meanwhile.
        for broker_consumer in subscription.consumers:
            broker_consumer.permits = 0
        async with self.server.seeking(topic.name, consumer.subscription_name):
            await subscription.seek(position, earliest=earliest, ack_set=ack_set)
        self.write(replies.success(body.request_id))

    def _on_get_last_message_id(self, body: pb.CommandGetLastMessageId, frame: Any) -> None:
        try:
            consumer = self._consumer(body.consumer_id)
        except PulsarError as exc:
            self._fail(body.request_id, exc)
            return
        topic = consumer.topic
        position, batch_size = topic.last_message_position()
        batch_index = _largest_batch_index(topic, position, batch_size)
        broker_consumer = getattr(consumer, "broker_consumer", None)
        if getattr(broker_consumer, "read_compacted", False):
            # Read compacted: nothing visible after the compaction horizon, the last message is
            # the compacted view's (else a reader would wait for a compacted-out one).
            position, batch_index = topic.compaction.last_message_position(position, batch_index)
        last = replies.message_id_data(position, partition=topic.partition_index, batch_index=batch_index)
        mark_delete = None
        if consumer.subscription is not None:
            mark_delete = replies.message_id_data(consumer.subscription.cursor.mark_delete)
        self.write(replies.last_message_id(body.request_id, last, mark_delete))

    def _on_close_consumer(self, body: pb.CommandCloseConsumer, frame: Any) -> None:
        consumer = self.consumers.pop(body.consumer_id, None)
        if consumer is not None:
            self._release_consumer(consumer)
        else:
            self._close_while_creating(("consumer", body.consumer_id))
        self.write(replies.success(body.request_id))       # also for an unknown id, as Apache

    def _on_unsubscribe(self, body: pb.CommandUnsubscribe, frame: Any) -> None:
        self._request(body.request_id, self._unsubscribe(body))

    async def _unsubscribe(self, body: pb.CommandUnsubscribe) -> None:
        consumer = self._consumer(body.consumer_id)
        subscription = consumer.subscription
        assert subscription is not None
        subscription.check_unsubscribe_by(consumer.broker_consumer)
        del self.consumers[body.consumer_id]
        self._release_consumer(consumer)
        if consumer.durable:
            await consumer.topic.unsubscribe(subscription.name)
        self.write(replies.success(body.request_id))

    def _on_consumer_stats(self, body: pb.CommandConsumerStats, frame: Any) -> None:
        consumer = self.consumers.get(body.consumer_id)
        if consumer is None:
            self.write(replies.consumer_stats_error(body.request_id, pb.ConsumerNotFound,
                                                    f"consumer {body.consumer_id} is not connected"))
            return
        self.write(replies.consumer_stats(body.request_id, consumer.stats()))

    def _on_auth_response(self, body: pb.CommandAuthResponse, frame: Any) -> None:
        log.info("%s: ignoring an AUTH_RESPONSE (this broker never challenges)", self.peer)


def _txn_handler(method: Callable[[TransactionCommands, Any], Coroutine[Any, Any, None] | None]) -> \
        Callable[[ServerConnection, Any, Any], None]:
    """A TC command's handler: its coroutine runs as a task (a method that answered at once
    returns None)."""
    def handle(connection: ServerConnection, body: Any, frame: Any) -> None:
        pending = method(connection.txn, body)
        if pending is not None:
            connection._spawn(pending)
    return handle


def _start_position(topic: Topic, message_id: pb.MessageIdData) -> Position:
    """Where a reader starts / a seek goes: MessageId.earliest (-1, -1) is the first stored
    entry, MessageId.latest and anything past the end is the next entry to be written."""
    ledger_id, entry_id = _signed(message_id.ledgerId), _signed(message_id.entryId)
    end = topic.ledger.lac.next()
    if ledger_id < 0:
        return topic.ledger.first_position()
    if ledger_id == _LATEST_LEDGER:
        return end
    return min(Position(ledger_id, max(entry_id, -1)), end)


def _largest_batch_index(topic: Topic, position: Position, batch_size: int) -> int:
    """GET_LAST_MESSAGE_ID's batch index, as Apache's ServerCnx reads it from the entry's
    metadata: num_messages_in_batch - 1 for a batch (0 for a batch of one message: the client's
    id of that message has index 0, and -1 compares below it), -1 for a message sent alone."""
    fallback = batch_size - 1 if batch_size > 1 else -1
    entry = topic.ledger.read_entry(position) if position.entry_id >= 0 else None
    if entry is None:
        return fallback
    try:
        metadata = _parse_metadata(split_headers_and_payload(entry.data)[0])
    except Exception:
        return fallback
    if metadata.HasField("num_messages_in_batch") and metadata.num_messages_in_batch > 0:
        return metadata.num_messages_in_batch - 1
    return -1


def _log_ack_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("an acknowledgement could not be stored: %s", future.exception())


_LOOKUP_TYPES = frozenset({BaseCommand.PARTITIONED_METADATA, BaseCommand.LOOKUP})


def _refuse_with_error(connection: ServerConnection, body: Any, error: PulsarError) -> None:
    connection.write(replies.error(body.request_id, error.server_error, str(error)))


def _refuse_txn_request(response: int) -> Callable[[ServerConnection, Any, PulsarError], None]:
    def refuse(connection: ServerConnection, body: Any, error: PulsarError) -> None:
        txn = None
        if body.DESCRIPTOR.fields_by_name.get("txnid_most_bits") is not None:
            with contextlib.suppress(TransactionNotFoundError):     # bits that name no txn: none told
                txn = txn_id(body.txnid_most_bits, body.txnid_least_bits)
        connection.write(replies.txn_response(response, body.request_id, txn, error.server_error, str(error)))
    return refuse


# Requests whose names the broker reads, refused in their own answer when a string field is
# not UTF-8 (see pyengine.protocol.text). The others (CONNECT's client version, ACK's
# properties, the close commands' broker URLs) carry text the broker never reads: a close is
# never refused for it.
_TEXT_REFUSALS: dict[int, Callable[[ServerConnection, Any, PulsarError], None]] = {
    BaseCommand.PARTITIONED_METADATA: lambda connection, body, error: connection.write(
        replies.partitioned_metadata_failed(body.request_id, error.server_error, str(error))),
    BaseCommand.LOOKUP: lambda connection, body, error: connection.write(
        replies.lookup_failed(body.request_id, error.server_error, str(error))),
    BaseCommand.GET_TOPICS_OF_NAMESPACE: _refuse_with_error,
    BaseCommand.GET_SCHEMA: lambda connection, body, error: connection.write(
        replies.schema_error(body.request_id, error.server_error, str(error))),
    BaseCommand.GET_OR_CREATE_SCHEMA: lambda connection, body, error: connection.write(
        replies.get_or_create_schema_error(body.request_id, error.server_error, str(error))),
    BaseCommand.PRODUCER: _refuse_with_error,
    BaseCommand.SUBSCRIBE: _refuse_with_error,
    BaseCommand.TC_CLIENT_CONNECT_REQUEST: _refuse_txn_request(BaseCommand.TC_CLIENT_CONNECT_RESPONSE),
    BaseCommand.ADD_PARTITION_TO_TXN: _refuse_txn_request(BaseCommand.ADD_PARTITION_TO_TXN_RESPONSE),
    BaseCommand.ADD_SUBSCRIPTION_TO_TXN: _refuse_txn_request(BaseCommand.ADD_SUBSCRIPTION_TO_TXN_RESPONSE),
    BaseCommand.END_TXN_ON_PARTITION: _refuse_txn_request(BaseCommand.END_TXN_ON_PARTITION_RESPONSE),
    BaseCommand.END_TXN_ON_SUBSCRIPTION: _refuse_txn_request(BaseCommand.END_TXN_ON_SUBSCRIPTION_RESPONSE),
    BaseCommand.SCALABLE_TOPIC_LOOKUP: lambda connection, body, error: connection.write(
        scalable_topic_update(body.session_id, error=error.server_error, message=str(error))),
    BaseCommand.SCALABLE_CONSUMER_REGISTER: lambda connection, body, error: connection.write(
        consumer_assignment(body.consumer_id, request_id=body.request_id, error=error.server_error,
                            message=str(error))),
}

_HANDLERS: dict[int, Callable[[ServerConnection, Any, Any], None]] = {
    BaseCommand.CONNECT: ServerConnection._on_connect,
    BaseCommand.PING: ServerConnection._on_ping,
    BaseCommand.PONG: ServerConnection._on_pong,
    BaseCommand.PARTITIONED_METADATA: ServerConnection._on_partitioned_metadata,
    BaseCommand.LOOKUP: ServerConnection._on_lookup,
    BaseCommand.GET_TOPICS_OF_NAMESPACE: ServerConnection._on_get_topics_of_namespace,
    BaseCommand.GET_SCHEMA: ServerConnection._on_get_schema,
    BaseCommand.GET_OR_CREATE_SCHEMA: ServerConnection._on_get_or_create_schema,
    BaseCommand.PRODUCER: ServerConnection._on_producer,
    BaseCommand.SEND: ServerConnection._on_send,
    BaseCommand.CLOSE_PRODUCER: ServerConnection._on_close_producer,
    BaseCommand.SUBSCRIBE: ServerConnection._on_subscribe,
    BaseCommand.FLOW: ServerConnection._on_flow,
    BaseCommand.ACK: ServerConnection._on_ack,
    BaseCommand.REDELIVER_UNACKNOWLEDGED_MESSAGES: ServerConnection._on_redeliver,
    BaseCommand.SEEK: ServerConnection._on_seek,
    BaseCommand.GET_LAST_MESSAGE_ID: ServerConnection._on_get_last_message_id,
    BaseCommand.CLOSE_CONSUMER: ServerConnection._on_close_consumer,
    BaseCommand.UNSUBSCRIBE: ServerConnection._on_unsubscribe,
    BaseCommand.CONSUMER_STATS: ServerConnection._on_consumer_stats,
    BaseCommand.AUTH_RESPONSE: ServerConnection._on_auth_response,
    BaseCommand.TC_CLIENT_CONNECT_REQUEST: _txn_handler(TransactionCommands.tc_client_connect),
    BaseCommand.NEW_TXN: _txn_handler(TransactionCommands.new_txn),
    BaseCommand.ADD_PARTITION_TO_TXN: _txn_handler(TransactionCommands.add_partition_to_txn),
    BaseCommand.ADD_SUBSCRIPTION_TO_TXN: _txn_handler(TransactionCommands.add_subscription_to_txn),
    BaseCommand.END_TXN: _txn_handler(TransactionCommands.end_txn),
    BaseCommand.END_TXN_ON_PARTITION: _txn_handler(TransactionCommands.end_txn_on_partition),
    BaseCommand.END_TXN_ON_SUBSCRIPTION: _txn_handler(TransactionCommands.end_txn_on_subscription),
    BaseCommand.SCALABLE_TOPIC_LOOKUP: lambda connection, body, frame: connection._spawn(connection.scalable.lookup(body)),
    BaseCommand.SCALABLE_TOPIC_CLOSE: lambda connection, body, frame: connection.scalable.close_session(body),
    BaseCommand.SCALABLE_CONSUMER_REGISTER:
        lambda connection, body, frame: connection._spawn(connection.scalable.register_consumer(body)),
    BaseCommand.SCALABLE_CONSUMER_UNREGISTER:
        lambda connection, body, frame: connection._spawn(connection.scalable.unregister_consumer(body)),
}
