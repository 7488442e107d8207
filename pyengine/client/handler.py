"""The reconnecting part shared by producers, consumers and coordinator handlers.

A handler is bound to one topic (a partition, or a coordinator's assign partition). It finds
the owning broker by LOOKUP, takes a connection from the pool and registers itself there
(`_connection_opened`, done by each kind). When the connection is lost or the broker closes
the handler, it reconnects with exponential back-off, as Pulsar's clients do; the first
connection gives up at the operation timeout, or at once on an error that retrying cannot fix.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pyengine.client.backoff import Backoff
from pyengine.client.connection import ClientConnection
from pyengine.client.errors import AlreadyClosedError
from pyengine.errors import (
    ConsumerAssignError, ConsumerBusyError, IncompatibleSchemaError, InvalidTopicNameError, NotAllowedError,
    ProducerBlockedQuotaExceededException, ProducerBusyError, ProducerFencedError, PulsarError, SubscriptionNotFoundError,
    TopicNotFoundError, TopicTerminatedError,
)
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command

if TYPE_CHECKING:
    from pyengine.client.client import ClientCore

log = logging.getLogger(__name__)

# Errors after which creating a producer or consumer is not retried (the C++ client's list;
# a backlog quota's producer_request_hold is retried, its producer_exception is not).
FATAL_ERRORS = (ConsumerBusyError, ConsumerAssignError, ProducerBusyError, ProducerFencedError, TopicNotFoundError, TopicTerminatedError,
                NotAllowedError, InvalidTopicNameError, SubscriptionNotFoundError, IncompatibleSchemaError,
                ProducerBlockedQuotaExceededException, TypeError, ValueError,
                AlreadyClosedError)      # the client was closed: no connection will come
# Errors after which a producer or consumer created before stops reconnecting, as the Java
# client's: a fenced producer, a terminated topic, a topic deleted that may not be created
# again. Any other refusal on a reconnect (another client took the only producer slot or the
# Exclusive subscription meanwhile, a schema or policy changed) may pass: retried with back-off
# ("in any case", as the C++ client says), the sends waiting meanwhile bounded by their timeout.
RECONNECT_FATAL_ERRORS = (ProducerFencedError, TopicTerminatedError, TopicNotFoundError, TypeError, ValueError,
                          AlreadyClosedError)

CONNECTING, READY, CLOSING, CLOSED, FAILED = "connecting", "ready", "closing", "closed", "failed"


class ConnectionHandler(abc.ABC):
    reconnect_fatal_errors: tuple[type[BaseException], ...] = RECONNECT_FATAL_ERRORS
    def __init__(self, core: ClientCore, topic: str) -> None:
        self._core = core
        self.topic = topic
        self.connection: ClientConnection | None = None
        self.state = CONNECTING
        self.failure: BaseException | None = None     # what put it in the FAILED state
        self._backoff = Backoff(core.config.initial_backoff, core.config.max_backoff)
        self._reconnect_task: asyncio.Task[None] | None = None

    @abc.abstractmethod
    async def _connection_opened(self, connection: ClientConnection) -> None:
        """Register on `connection` and create the broker-side object; set `self.connection`
        and the READY state on success."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the broker-side object (if any) and stop reconnecting."""

    @abc.abstractmethod
    def _failed(self, error: BaseException) -> None:
        """Reconnecting met an error it cannot get past: fail what waits on this handler."""

    async def _connect_once(self) -> None:
        address = await self._core.lookup.lookup(self.topic)
        connection = await self._core.pool.get(address)
        await self._connection_opened(connection)

    async def _start(self) -> None:
        """The first connection: retry until the operation timeout, raise fatal errors at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._core.config.operation_timeout
        while True:
            try:
                async with asyncio.timeout_at(deadline):   # not wait_for: 3.11's ignores a late cancel
                    await self._connect_once()
                self._backoff.reset()
                return
            except FATAL_ERRORS:
                self.state = FAILED
                raise
            except Exception as exc:
                delay = self._backoff.next()
                if loop.time() + delay >= deadline:
                    self.state = FAILED
                    if isinstance(exc, TimeoutError):
                        raise
                    raise TimeoutError(f"{self} not ready within the operation timeout: {exc}") from exc
                log.info("%s: %s; retrying in %.2fs", self, exc, delay)
                await asyncio.sleep(delay)

    def on_connection_closed(self, connection: ClientConnection) -> None:
        if connection is self.connection:
            self.connection = None
            self._schedule_reconnect()

    def on_closed_by_broker(self) -> None:
        log.info("%s: closed by the broker, reconnecting", self)
        self.connection = None
        self._schedule_reconnect()

    def _schedule_reconnect(self) -> None:
        if self.state in (CLOSING, CLOSED, FAILED):
            return
        self.state = CONNECTING
        if self._reconnect_task is None or self._reconnect_task.done():
            self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        while self.state == CONNECTING:
            await asyncio.sleep(self._backoff.next())
            if self.state != CONNECTING:
                return
            try:
                async with asyncio.timeout(self._core.config.operation_timeout):
                    await self._connect_once()
            except ProducerBlockedQuotaExceededException as exc:
                # Fatal to a creation, not to a producer already created (the broker closed it
                # past a backlog quota): as the C++ client, its pending sends fail and it keeps
                # reconnecting, refused until the backlog is consumed.
                log.info("%s: reconnect refused: %s", self, exc)
                self._refused_on_reconnect(exc)
                continue
            except self.reconnect_fatal_errors as exc:
                log.warning("%s: cannot reconnect: %s", self, exc)
                self.state = FAILED
                self.failure = exc
                self._failed(exc)
                return
            except FATAL_ERRORS as exc:
                log.warning("%s: reconnect refused, retrying: %s", self, exc)
                continue
            except Exception as exc:
                log.info("%s: reconnect failed: %s", self, exc)
                continue
            self._backoff.reset()
            return

    def _refused_on_reconnect(self, error: BaseException) -> None:
        """A reconnect refused for now (it goes on): what is waiting for the connection fails."""

    @staticmethod
    def _given_up(connection: ClientConnection, cmd: pb.BaseCommand, error: BaseException) -> None:
        """A creation request (PRODUCER, SUBSCRIBE) got no answer in time and is given up: close
        what the broker may still create, on the connection that stays open (as the C++ and Java
        clients do), or it would hold its name, topic or subscription for nobody."""
        if not isinstance(error, (TimeoutError, asyncio.CancelledError)) or not connection.usable:
            return
        if cmd.type == pb.BaseCommand.PRODUCER:
            close = base_command(pb.BaseCommand.CLOSE_PRODUCER, producer_id=cmd.producer.producer_id,
                                 request_id=connection.new_request_id())
        else:
            close = base_command(pb.BaseCommand.CLOSE_CONSUMER, consumer_id=cmd.subscribe.consumer_id,
                                 request_id=connection.new_request_id())
        connection.send_command(close)          # its SUCCESS answers no pending request: ignored

    async def _close_on_broker(self, connection: ClientConnection | None, command_type: int, **ids: int) -> None:
        """Send CLOSE_PRODUCER / CLOSE_CONSUMER (`command_type`, with the object's id) on
        `connection` if it is usable, and wait for the answer: a refusal or no answer is only
        logged, as the object is closed here whatever the broker says."""
        if connection is None or not connection.usable:
            return
        cmd = base_command(command_type, request_id=connection.new_request_id(), **ids)
        try:
            await connection.request(cmd, self._core.config.operation_timeout)
        except (PulsarError, TimeoutError) as exc:
            log.info("%s: close not confirmed by the broker: %s", self, exc)

    def _stop_reconnecting(self) -> None:
        if self._reconnect_task is not None and not self._reconnect_task.done():
            self._reconnect_task.cancel()


async def start_all(handlers: Iterable[ConnectionHandler]) -> None:
    """Start `handlers` together (each as `_start`); once all are done, raise the first failure.
    The caller closes them all when this raises (a failure, or its cancel): those the broker
    created already would otherwise hold their subscription or producer name for nobody."""
    results = await asyncio.gather(*(h._start() for h in handlers), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def close_all(handlers: Iterable[ConnectionHandler]) -> None:
    """Close `handlers` together, to the end even if the caller is cancelled meanwhile: the
    clean-up after a failed or cancelled start (a close that fails does not stop the others)."""
    await asyncio.shield(asyncio.gather(*(h.close() for h in handlers), return_exceptions=True))
