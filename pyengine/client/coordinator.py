"""The transaction coordinator client: coordinator discovery and the TC requests.

As the Java client does it: PARTITIONED_METADATA of `persistent://pulsar/system/
transaction_coordinator_assign` gives the number of coordinators (0: one, addressed by the
un-partitioned name); for each, a handler looks up its assign partition, connects to the owning
broker and sends TC_CLIENT_CONNECT. New transactions go round robin over the coordinators; every
later request of a transaction goes to the coordinator named by the txn id's most significant
bits. A request answered with TransactionCoordinatorNotFound reconnects its handler and is sent
again after a back-off, as is a request whose connection broke, until the operation timeout.

With a transaction key (`Client(url, transaction_key=...)`) the client talks to one coordinator
only, the key's (`coordinator_for`: the broker checks the same hash): its TC_CLIENT_CONNECT
carries the key and the epoch of the previous connection (-1 the first time) and gets the next
epoch back. When a newer task takes the key, the broker closes this connection; reconnecting
with the old epoch is refused (NotAllowed), and from then on every request of a transaction
begun under the old epoch raises ExpiredTransactionError, a new transaction NotAllowedError.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from google.protobuf.message import Message as ProtoMessage

from pyengine.client.backoff import Backoff
from pyengine.client.connection import ClientConnection
from pyengine.client.errors import AlreadyClosedError, ConnectError
from pyengine.client.handler import CLOSED, CLOSING, FATAL_ERRORS, READY, ConnectionHandler
from pyengine.errors import ExpiredTransactionError, NotAllowedError, TransactionCoordinatorNotFoundError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command, command_body
from pyengine.transaction.coordinator.keys import ANONYMOUS, NO_EPOCH, coordinator_for
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID
from pyengine_kernels import TxnId

if TYPE_CHECKING:
    from pyengine.client.client import ClientCore

log = logging.getLogger(__name__)

TC_ASSIGN_TOPIC = "persistent://pulsar/system/transaction_coordinator_assign"
T = pb.BaseCommand
# Brokers from this protocol version on expect TC_CLIENT_CONNECT before transaction requests.
TC_CLIENT_CONNECT_VERSION = 19


class CoordinatorHandler(ConnectionHandler):
    # A keyed connect refused (NotAllowed: a newer epoch of the key fenced this one) is final.
    reconnect_fatal_errors = FATAL_ERRORS

    def __init__(self, core: ClientCore, tc_id: int, topic: str, transaction_key: str | None = None) -> None:
        super().__init__(core, topic)
        self.tc_id = tc_id
        self.transaction_key = transaction_key
        self.epoch = NO_EPOCH                  # the key's epoch this client holds (keyed handlers)
        self._ready = asyncio.Event()
        self._failure: BaseException | None = None

    def __repr__(self) -> str:
        return f"transaction coordinator {self.tc_id} handler"

    async def _connection_opened(self, connection: ClientConnection) -> None:
        if self.transaction_key is not None:
            cmd = base_command(T.TC_CLIENT_CONNECT_REQUEST, request_id=connection.new_request_id(), tc_id=self.tc_id,
                               transaction_key=self.transaction_key, epoch=self.epoch)
            response = await connection.request(cmd, self._core.config.operation_timeout)
            if not response.HasField("epoch"):
                raise NotAllowedError(f"{self}: the broker does not support transaction keys (no epoch answered)")
            self.epoch = response.epoch
        elif connection.protocol_version >= TC_CLIENT_CONNECT_VERSION:
            cmd = base_command(T.TC_CLIENT_CONNECT_REQUEST, request_id=connection.new_request_id(), tc_id=self.tc_id)
            await connection.request(cmd, self._core.config.operation_timeout)
        if self.state in (CLOSING, CLOSED):
            return
        if connection.closed.done():
            # lost while TC_CLIENT_CONNECT was answered: its close listener would never run, and
            # a handler ready on it would never reconnect
            raise ConnectError(f"{self}: the connection closed as the coordinator was connected")
        connection.add_close_listener(self.on_connection_closed)
        self.connection = connection
        self.state = READY
        self._ready.set()

    def on_connection_closed(self, connection: ClientConnection) -> None:
        if connection is self.connection:
            self._ready.clear()
        super().on_connection_closed(connection)

    def _failed(self, error: BaseException) -> None:
        self._failure = error
        self._ready.set()                     # wakes the waiting requests, which raise it

    def _reconnect_now(self, connection: ClientConnection) -> None:
        """The broker says this coordinator is not (any more) on `connection`: look it up again."""
        if connection is self.connection:
            self.connection = None
            self._ready.clear()
            self._schedule_reconnect()

    def fenced_error(self, txn_id: TxnId | None) -> BaseException | None:
        """Why a request cannot be sent any more: a keyed handler refused on reconnecting was
        fenced by a newer task, which expired every transaction of this client."""
        failure = self._failure
        if failure is None or txn_id is None or self.transaction_key is None or not isinstance(failure, NotAllowedError):
            return failure
        return ExpiredTransactionError(f"transaction {txn_id}: transaction key {self.transaction_key!r} was taken "
                                       f"by a newer connection ({failure})")

    def send(self, build: Callable[[int], pb.BaseCommand], txn_id: TxnId | None = None) -> asyncio.Future[ProtoMessage]:
        """`request` as a task whose command is written now when the handler is connected. A
        task's first step runs a loop turn later: behind the burst of sends that registers a
        partition with a txn, that delayed each ADD_PARTITION_TO_TXN by ~1.5 ms (the broker
        benchmark) while the sends waited for its answer."""
        sent = None
        connection = self.connection
        if self._ready.is_set() and self._failure is None and connection is not None \
                and self.state not in (CLOSING, CLOSED):
            cmd = build(next(self._core.pool.request_ids))
            try:
                sent = (connection, cmd, connection.send_request(cmd))
            except ConnectError:
                sent = None                   # never written: the task sends it once reconnected
        return asyncio.ensure_future(self.request(build, txn_id, sent))

    async def request(self, build: Callable[[int], pb.BaseCommand], txn_id: TxnId | None = None,
                      sent: tuple[ClientConnection, pb.BaseCommand, asyncio.Future[ProtoMessage]] | None = None
                      ) -> ProtoMessage:
        """Send the command `build(request_id)` and return its response body; the request id
        stays the same when the request is sent again. `sent`: its first sending (`send`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._core.config.operation_timeout
        request_id = next(self._core.pool.request_ids) if sent is None else command_body(sent[1]).request_id
        retry_backoff = Backoff(self._core.config.initial_backoff, self._core.config.max_backoff / 10)
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"{self}: no answer within the operation timeout")
            if sent is None:
                if self.state in (CLOSING, CLOSED):
                    raise AlreadyClosedError(f"{self} is closed")
                if not self._ready.is_set():            # (a timeout costs ~10 us even when it is set)
                    try:
                        async with asyncio.timeout(remaining):    # a late cancel still raises
                            await self._ready.wait()
                    except TimeoutError:
                        raise TimeoutError(f"{self} not connected within the operation timeout") from None
                if self._failure is not None:
                    raise self.fenced_error(txn_id) or self._failure
                connection = self.connection
                if connection is None:
                    await asyncio.sleep(0)
                    continue
            try:
                if sent is not None:
                    connection, cmd, response = sent
                    sent = None
                    return await connection.response(cmd, response, remaining)
                return await connection.request(build(request_id), remaining)
            except TransactionCoordinatorNotFoundError:
                if loop.time() >= deadline:
                    raise
                self._reconnect_now(connection)
                await asyncio.sleep(min(retry_backoff.next(), max(deadline - loop.time(), 0)))
            except ConnectError as exc:
                log.info("%s: %s; sending again once reconnected", self, exc)
                # (a connection that failed to write while this handler still takes it for its
                # own: reconnect, rather than write on it again at once, for ever)
                self._reconnect_now(connection)

    async def close(self) -> None:
        self.state = CLOSED
        self._stop_reconnecting()
        self._ready.set()


class TransactionCoordinatorClient:
    def __init__(self, core: ClientCore, transaction_key: str | None = None) -> None:
        self._core = core
        self.transaction_key = transaction_key
        self._handlers: dict[int, CoordinatorHandler] = {}
        self._next = itertools.count()
        self._v5: asyncio.Future[CoordinatorHandler] | None = None     # every broker runs it
        self._started: asyncio.Future[None] | None = None
        self._closed = False

    def _closed_under(self, error: BaseException) -> BaseException:
        """What a caller waiting for discovery (or the v5 handler) gets when it ended with
        `error`: close() cancels them, and a caller that was not cancelled itself fails with
        AlreadyClosedError (as the Java client), not with a CancelledError nobody asked for."""
        current = asyncio.current_task()
        if self._closed and isinstance(error, asyncio.CancelledError) and current is not None \
                and not current.cancelling():
            return AlreadyClosedError("the client is closed")
        return error

    async def start(self) -> None:
        """Discover the coordinators and connect to each (once; later calls wait for it)."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._discover())
        started = self._started               # (another waiter may reset it before this one resumes)
        try:
            await asyncio.shield(started)
        except BaseException as exc:
            if started.done() and self._started is started:
                self._started = None          # the next transaction tries discovery again
            error = self._closed_under(exc)
            if error is exc:
                raise
            raise error from None

    async def _discover(self) -> None:
        partitions = await self._core.lookup.partitions(TC_ASSIGN_TOPIC)
        if self.transaction_key is not None:
            # This broker does not authenticate: the owner is `anonymous`, as the broker sees it.
            tc_id = coordinator_for(ANONYMOUS, self.transaction_key, partitions)
            topic = f"{TC_ASSIGN_TOPIC}-partition-{tc_id}" if partitions > 0 else TC_ASSIGN_TOPIC
            handlers = {tc_id: CoordinatorHandler(self._core, tc_id, topic, self.transaction_key)}
        elif partitions > 0:
            handlers = {i: CoordinatorHandler(self._core, i, f"{TC_ASSIGN_TOPIC}-partition-{i}")
                        for i in range(partitions)}
        else:
            handlers = {0: CoordinatorHandler(self._core, 0, TC_ASSIGN_TOPIC)}
        try:
            results = await asyncio.gather(*(h._start() for h in handlers.values()), return_exceptions=True)
        except BaseException:
            # Cancelled by close(): those connected already are known to no one else, and would
            # reconnect once the pool closes their connection.
            await asyncio.gather(*(h.close() for h in handlers.values()))
            raise
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(h.close() for h in handlers.values()))
            raise errors[0]
        self._handlers = handlers

    @property
    def epoch(self) -> int:
        """The transaction key's epoch this client holds (-1 before it connected; keyed only)."""
        return max((handler.epoch for handler in self._handlers.values()), default=NO_EPOCH)

    async def _v5_handler(self) -> CoordinatorHandler:
        """The v5 coordinator (PIP-473), connected once: no discovery, any broker serves it."""
        if self._v5 is None:
            handler = CoordinatorHandler(self._core, V5_COORDINATOR_ID, TC_ASSIGN_TOPIC)

            async def start() -> CoordinatorHandler:
                await handler._start()
                return handler

            self._v5 = asyncio.ensure_future(start())
        v5 = self._v5                          # (another waiter may reset it before this one resumes)
        try:
            return await asyncio.shield(v5)
        except BaseException as exc:
            if v5.done() and self._v5 is v5:
                self._v5 = None
            error = self._closed_under(exc)
            if error is exc:
                raise
            raise error from None

    def _handler(self, txn_id: TxnId) -> CoordinatorHandler:
        if txn_id.most_bits == V5_COORDINATOR_ID and self._v5 is not None and self._v5.done() \
                and not self._v5.cancelled() and self._v5.exception() is None:
            return self._v5.result()
        handler = self._handlers.get(txn_id.most_bits)
        if handler is None:
            raise TransactionCoordinatorNotFoundError(f"no coordinator {txn_id.most_bits} for transaction {txn_id}")
        return handler

    async def new_transaction(self, timeout_ms: int, *, v5: bool = False) -> TxnId:
        if v5:
            handler = await self._v5_handler()
        else:
            await self.start()
            ids = sorted(self._handlers)
            handler = self._handlers[ids[next(self._next) % len(ids)]]
        # txn_ttl_seconds carries milliseconds, as the Java and Go clients (and Apache's broker) use it.
        response = await handler.request(lambda request_id: base_command(
            T.NEW_TXN, request_id=request_id, txn_ttl_seconds=timeout_ms, tc_id=handler.tc_id))
        return TxnId(response.txnid_most_bits, response.txnid_least_bits)

    def add_partition(self, txn_id: TxnId, topic: str) -> asyncio.Future[Any]:
        """ADD_PARTITION_TO_TXN, written now (the future settles with its answer)."""
        return self._send(txn_id, lambda request_id: base_command(
            T.ADD_PARTITION_TO_TXN, request_id=request_id, txnid_most_bits=txn_id.most_bits,
            txnid_least_bits=txn_id.least_bits, partitions=[topic]))

    def add_subscription(self, txn_id: TxnId, topic: str, subscription: str) -> asyncio.Future[Any]:
        """ADD_SUBSCRIPTION_TO_TXN, written now (the future settles with its answer)."""
        return self._send(txn_id, lambda request_id: base_command(
            T.ADD_SUBSCRIPTION_TO_TXN, request_id=request_id, txnid_most_bits=txn_id.most_bits,
            txnid_least_bits=txn_id.least_bits, subscription=[pb.Subscription(topic=topic, subscription=subscription)]))

    def _send(self, txn_id: TxnId, build: Callable[[int], pb.BaseCommand]) -> asyncio.Future[Any]:
        try:
            handler = self._handler(txn_id)
        except TransactionCoordinatorNotFoundError as exc:
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed
        return handler.send(build, txn_id)

    async def end(self, txn_id: TxnId, action: int) -> None:
        await self._handler(txn_id).request(lambda request_id: base_command(
            T.END_TXN, request_id=request_id, txnid_most_bits=txn_id.most_bits, txnid_least_bits=txn_id.least_bits,
            txn_action=action), txn_id)

    async def close(self) -> None:
        self._closed = True
        if self._started is not None and not self._started.done():
            self._started.cancel()
        handlers = list(self._handlers.values())
        if self._v5 is not None:
            if not self._v5.done():
                self._v5.cancel()
            elif not self._v5.cancelled() and self._v5.exception() is None:
                handlers.append(self._v5.result())
        await asyncio.gather(*(h.close() for h in handlers))

