"""One TCP connection to a broker: the protocol core under the client's public API.

`ClientConnection` is an `asyncio.Protocol` (no streams: frames are split by
`core_ext.frames.FrameDecoder` straight from `data_received`). It performs the CONNECT /
CONNECTED handshake, matches responses to requests by request id, routes SEND_RECEIPT /
SEND_ERROR to producers and MESSAGE to consumers by their ids, answers PINGs and PINGs an idle
broker, and tells every producer, consumer and pending request when it is gone.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Protocol

from google.protobuf.message import Message as ProtoMessage

from core_ext.frames import Frame, FrameDecoder, FrameError, encode_command
from pyengine.client.config import ClientConfig
from pyengine.client.errors import ConnectError
from pyengine.client.url import BrokerAddress
from pyengine.errors import PulsarError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import ProtocolError, base_command, command_body, parse_command

log = logging.getLogger(__name__)

CLIENT_VERSION = "pyengine-client-0.1.0"
PROTOCOL_VERSION = 20
# What a broker that does not say allows (the C++ client's assumption: 5 MiB - 10 KiB).
DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024 - 10 * 1024
T = pb.BaseCommand

# Responses settled by request id (the lookups included: only their own responses answer them).
_RESPONSES = frozenset({
    T.SUCCESS, T.ERROR, T.PRODUCER_SUCCESS, T.PARTITIONED_METADATA_RESPONSE, T.LOOKUP_RESPONSE,
    T.GET_LAST_MESSAGE_ID_RESPONSE, T.GET_SCHEMA_RESPONSE, T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
    T.ACK_RESPONSE, T.TC_CLIENT_CONNECT_RESPONSE, T.NEW_TXN_RESPONSE, T.ADD_PARTITION_TO_TXN_RESPONSE,
    T.ADD_SUBSCRIPTION_TO_TXN_RESPONSE, T.END_TXN_RESPONSE, T.CONSUMER_STATS_RESPONSE,
})
_PING = encode_command(base_command(T.PING).SerializeToString())
_PONG = encode_command(base_command(T.PONG).SerializeToString())


class ProducerListener(Protocol):
    def on_send_receipt(self, receipt: pb.CommandSendReceipt) -> None: ...
    def on_send_error(self, error: pb.CommandSendError) -> None: ...
    def on_closed_by_broker(self) -> None: ...
    def on_connection_closed(self, connection: ClientConnection) -> None: ...


class ConsumerListener(Protocol):
    def on_message(self, message: pb.CommandMessage, frame: Frame) -> None: ...
    def on_active_changed(self, active: bool) -> None: ...
    def on_closed_by_broker(self) -> None: ...
    def on_connection_closed(self, connection: ClientConnection) -> None: ...


def response_error(type_: int, body: ProtoMessage) -> PulsarError | None:
    """The error a response carries, in whichever form its command type uses."""
    if type_ == T.ERROR:
        return PulsarError.from_code(body.error, body.message)
    if type_ == T.LOOKUP_RESPONSE:
        if body.response == pb.CommandLookupTopicResponse.Failed:
            return PulsarError.from_code(body.error, body.message or "lookup failed")
        return None
    if type_ == T.PARTITIONED_METADATA_RESPONSE:
        if not body.HasField("response"):
            return ConnectError("the broker's partitioned-metadata response says neither success nor failure")
        if body.response == pb.CommandPartitionedTopicMetadataResponse.Failed:
            return PulsarError.from_code(body.error, body.message or "partitioned metadata lookup failed")
        return None
    if type_ in (T.GET_SCHEMA_RESPONSE, T.CONSUMER_STATS_RESPONSE):
        if body.HasField("error_code"):
            return PulsarError.from_code(body.error_code, body.error_message)
        return None
    if "error" in body.DESCRIPTOR.fields_by_name and body.HasField("error"):
        return PulsarError.from_code(body.error, body.message)
    return None


class ClientConnection(asyncio.Protocol):
    def __init__(self, address: BrokerAddress, config: ClientConfig, request_ids: itertools.count) -> None:
        self.address = address
        self._config = config
        self._request_ids = request_ids
        self._loop = asyncio.get_running_loop()
        self._decoder = FrameDecoder(checksum_errors="report")
        self._transport: asyncio.Transport | None = None
        self._handshake: asyncio.Future[None] = self._loop.create_future()
        self._pending: dict[int, asyncio.Future[ProtoMessage]] = {}
        self.producers: dict[int, ProducerListener] = {}
        self.consumers: dict[int, ConsumerListener] = {}
        # scalable-topic DAG watch sessions (PIP-468): session id -> listener of its updates
        self.dag_sessions: dict[int, Callable[[pb.CommandScalableTopicUpdate], None]] = {}
        # ordered consumers of scalable topics: consumer id -> listener of its assignments
        self.scalable_consumers: dict[int, Callable[[pb.CommandScalableConsumerAssignment], None]] = {}
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._close_listeners: list[Callable[[ClientConnection], None]] = []
        self.protocol_version = 0
        self.max_message_size = DEFAULT_MAX_MESSAGE_SIZE
        self.server_version = ""
        self._heard = True
        self._keepalive: asyncio.TimerHandle | None = None
        self._close_reason: BaseException | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass: check what we use instead.
        assert hasattr(transport, "write") and hasattr(transport, "abort")
        self._transport = transport  # type: ignore[assignment]
        connect = base_command(T.CONNECT, client_version=CLIENT_VERSION, protocol_version=PROTOCOL_VERSION,
                               feature_flags=pb.FeatureFlags(supports_broker_entry_metadata=True))
        transport.write(encode_command(connect.SerializeToString()))

    async def wait_connected(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self._handshake), timeout)
        except TimeoutError:
            self.close(ConnectError(f"no CONNECTED from {self.address.logical} within {timeout}s"))
            raise ConnectError(f"no CONNECTED from {self.address.logical} within {timeout}s") from None

    @property
    def usable(self) -> bool:
        return self._handshake.done() and not self._handshake.exception() and not self.closed.done()

    def add_close_listener(self, listener: Callable[[ClientConnection], None]) -> None:
        if listener not in self._close_listeners:      # added again by a re-registration
            self._close_listeners.append(listener)

    def remove_close_listener(self, listener: Callable[[ClientConnection], None]) -> None:
        """Forget `listener` (its owner closed): a pooled connection outlives what uses it,
        and kept, each listener would keep its closed owner in memory."""
        if listener in self._close_listeners:
            self._close_listeners.remove(listener)

    def close(self, reason: BaseException | None = None) -> None:
        """Close the connection (at once: what is not written yet is dropped)."""
        if self._close_reason is None:
            self._close_reason = reason or ConnectError(f"connection to {self.address.logical} closed")
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        reason = self._close_reason or ConnectError(
            f"connection to {self.address.logical} lost" + (f": {exc}" if exc else ""))
        if self._keepalive is not None:
            self._keepalive.cancel()
        if not self._handshake.done():
            self._handshake.set_exception(reason)
            self._handshake.exception()          # read: nobody may be waiting any more
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectError(str(reason)))
        self.closed.set_result(None)
        for listener in list(self._close_listeners):
            listener(self)
        for handler in list(self.producers.values()) + list(self.consumers.values()):
            handler.on_connection_closed(self)
        self.producers.clear()
        self.consumers.clear()

    # --- writing --------------------------------------------------------------------------

    def new_request_id(self) -> int:
        return next(self._request_ids)

    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def send_command(self, cmd: pb.BaseCommand) -> None:
        self.write(encode_command(cmd.SerializeToString()))

    async def request(self, cmd: pb.BaseCommand, timeout: float) -> ProtoMessage:
        """Send a command with a request id and wait for its response body (errors raised)."""
        return await self.response(cmd, self.send_request(cmd), timeout)

    def send_request(self, cmd: pb.BaseCommand) -> asyncio.Future[ProtoMessage]:
        """Write a command with a request id now; its response settles the future returned
        (`response` waits for it)."""
        if self.closed.done():
            raise ConnectError(f"connection to {self.address.logical} is closed")
        future: asyncio.Future[ProtoMessage] = self._loop.create_future()
        self._pending[command_body(cmd).request_id] = future
        self.send_command(cmd)
        return future

    async def response(self, cmd: pb.BaseCommand, future: asyncio.Future[ProtoMessage], timeout: float) -> ProtoMessage:
        """The response body of `cmd`, sent by `send_request` as `future` (errors raised)."""
        request_id = command_body(cmd).request_id
        try:
            # Not wait_for: Python 3.11's returns an answer that came as the caller was cancelled,
            # and the caller then goes on (a consumer READY) though it was cancelled.
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise TimeoutError(f"{T.Type.Name(cmd.type)} (request {request_id}) to {self.address.logical} "
                               f"got no answer within {timeout}s") from None
        finally:
            if self._pending.get(request_id) is future:
                del self._pending[request_id]

    # --- reading --------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        broken = None
        try:
            frames = self._decoder.feed(data)
        except FrameError as exc:
            frames, broken = exc.frames, exc      # the frames before the broken one still count
        self._heard = True
        self._handle_frames(frames)
        if broken is not None and self._close_reason is None:
            log.warning("closing %s: unreadable frame from the broker: %s", self.address.logical, broken)
            self.close(ConnectError(f"unreadable frame from {self.address.logical}: {broken}"))

    def _handle_frames(self, frames: list[Frame]) -> None:
        for frame in frames:
            try:
                cmd = parse_command(frame.command)
            except ProtocolError as exc:
                log.warning("closing %s: invalid command from the broker: %s", self.address.logical, exc)
                self.close(ConnectError(f"invalid command from {self.address.logical}: {exc}"))
                return
            if not self._handshake.done():
                self._on_handshake(cmd)
                continue
            try:
                self._dispatch(cmd, frame)
            except Exception:
                log.exception("error handling %s from %s", T.Type.Name(cmd.type), self.address.logical)

    def _on_handshake(self, cmd: pb.BaseCommand) -> None:
        if cmd.type != T.CONNECTED:
            error = (PulsarError.from_code(cmd.error.error, cmd.error.message) if cmd.type == T.ERROR
                     else ConnectError(f"expected CONNECTED, got {T.Type.Name(cmd.type)}"))
            self._handshake.set_exception(error)
            self._handshake.exception()          # read: wait_connected raises it, if still waiting
            self.close(error)
            return
        connected = cmd.connected
        self.server_version = connected.server_version
        self.protocol_version = connected.protocol_version
        if connected.HasField("max_message_size") and connected.max_message_size > 0:
            self.max_message_size = connected.max_message_size
        self._handshake.set_result(None)
        self._keepalive = self._loop.call_later(self._config.keep_alive_interval, self._keepalive_tick)

    def _keepalive_tick(self) -> None:
        # Anything heard since the last tick answers the PING (as the C++ client counts it).
        if not self._heard:
            log.warning("closing %s: no answer to the keep-alive PING", self.address.logical)
            self.close(ConnectError(f"keep-alive timeout on {self.address.logical}"))
            return
        self._heard = False
        self.write(_PING)
        self._keepalive = self._loop.call_later(self._config.keep_alive_interval, self._keepalive_tick)

    def _dispatch(self, cmd: pb.BaseCommand, frame: Frame) -> None:
        type_ = cmd.type
        if type_ == T.MESSAGE:
            consumer = self.consumers.get(cmd.message.consumer_id)
            if consumer is not None:
                consumer.on_message(cmd.message, frame)
        elif type_ == T.SEND_RECEIPT:
            producer = self.producers.get(cmd.send_receipt.producer_id)
            if producer is not None:
                producer.on_send_receipt(cmd.send_receipt)
        elif type_ in _RESPONSES:
            self._settle(cmd)
        elif type_ == T.SEND_ERROR:
            producer = self.producers.get(cmd.send_error.producer_id)
            if producer is not None:
                producer.on_send_error(cmd.send_error)
        elif type_ == T.PING:
            self.write(_PONG)
        elif type_ == T.PONG:
            pass
        elif type_ == T.CLOSE_PRODUCER:
            producer = self.producers.pop(cmd.close_producer.producer_id, None)
            if producer is not None:
                producer.on_closed_by_broker()
        elif type_ in (T.CLOSE_CONSUMER, T.REACHED_END_OF_TOPIC):
            consumer_id = (cmd.close_consumer.consumer_id if type_ == T.CLOSE_CONSUMER
                           else cmd.reachedEndOfTopic.consumer_id)
            if type_ == T.REACHED_END_OF_TOPIC:
                log.info("consumer %d of %s reached the end of a terminated topic", consumer_id,
                         self.address.logical)
                return
            consumer = self.consumers.pop(consumer_id, None)
            if consumer is not None:
                consumer.on_closed_by_broker()
        elif type_ == T.ACTIVE_CONSUMER_CHANGE:
            consumer = self.consumers.get(cmd.active_consumer_change.consumer_id)
            if consumer is not None:
                consumer.on_active_changed(cmd.active_consumer_change.is_active)
        elif type_ == T.SCALABLE_TOPIC_UPDATE:
            listener = self.dag_sessions.get(cmd.scalableTopicUpdate.session_id)
            if listener is not None:
                listener(cmd.scalableTopicUpdate)
        elif type_ == T.SCALABLE_CONSUMER_ASSIGNMENT:
            listener = self.scalable_consumers.get(cmd.scalableConsumerAssignment.consumer_id)
            if listener is not None:
                listener(cmd.scalableConsumerAssignment)
        elif type_ == T.TOPIC_MIGRATED:
            migrated = cmd.topicMigrated
            table = self.producers if migrated.resource_type == pb.CommandTopicMigrated.Producer else self.consumers
            handler = table.pop(migrated.resource_id, None)
            if handler is not None:
                handler.on_closed_by_broker()
        else:
            log.warning("closing %s: the broker sent %s, which a client does not expect",
                        self.address.logical, T.Type.Name(type_))
            self.close(ConnectError(f"unexpected {T.Type.Name(type_)} from {self.address.logical}"))

    def _settle(self, cmd: pb.BaseCommand) -> None:
        body = command_body(cmd)
        if cmd.type == T.ACK_RESPONSE and not body.HasField("request_id"):
            return
        request_id = body.request_id
        future = self._pending.get(request_id)
        if future is None or future.done():
            log.debug("%s for unknown request %d from %s", T.Type.Name(cmd.type), request_id, self.address.logical)
            return
        if cmd.type == T.PRODUCER_SUCCESS and body.HasField("producer_ready") and not body.producer_ready:
            return                               # queued behind an exclusive producer: a second one follows
        del self._pending[request_id]
        error = response_error(cmd.type, body)
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(body)
