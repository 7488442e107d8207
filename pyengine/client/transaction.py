"""Transactions of the network client.

A transaction registers each partition it produces to (ADD_PARTITION_TO_TXN) and each
subscription it acknowledges on (ADD_SUBSCRIPTION_TO_TXN) once, before its first send or ack
there; sends and acks in flight share that registration. Commit waits for every send and ack of
the transaction and aborts instead, raising the failure, if one of them failed. A transaction
that is committed, aborted or past its timeout refuses further use locally
(InvalidTxnStatusError), as the Java client's does.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from pyengine.errors import InvalidTxnStatusError, TransactionNotFoundError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine_kernels import TxnId

if TYPE_CHECKING:
    from pyengine.client.coordinator import TransactionCoordinatorClient

OPEN, COMMITTING, ABORTING, COMMITTED, ABORTED, ERROR, TIMED_OUT = (
    "open", "committing", "aborting", "committed", "aborted", "error", "timed_out")


class Transaction:
    def __init__(self, coordinator: TransactionCoordinatorClient, txn_id: TxnId, timeout_ms: int) -> None:
        self._coordinator = coordinator
        self.txn_id = txn_id
        self.state = OPEN
        self._partitions: dict[str, asyncio.Future[None]] = {}
        self._subscriptions: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._operations: list[asyncio.Future[object]] = []
        self._timer = asyncio.get_running_loop().call_later(timeout_ms / 1000, self._timed_out)

    def __repr__(self) -> str:
        return f"Transaction({self.txn_id}, {self.state})"

    def _timed_out(self) -> None:
        if self.state == OPEN:
            self.state = TIMED_OUT               # the coordinator aborts it at the same time

    def _check_open(self) -> None:
        if self.state != OPEN:
            raise InvalidTxnStatusError(f"transaction {self.txn_id} is {self.state.replace('_', ' ')}")

    @staticmethod
    def _failed(registration: asyncio.Future[None] | None) -> bool:
        return registration is None or (registration.done() and (registration.cancelled()
                                                                 or registration.exception() is not None))

    def _register_partition(self, topic: str) -> asyncio.Future[None]:
        """ADD_PARTITION_TO_TXN for `topic`, once (again only if it failed)."""
        registration = self._partitions.get(topic)
        if self._failed(registration):
            registration = self._coordinator.add_partition(self.txn_id, topic)
            self._partitions[topic] = registration
        assert registration is not None
        return registration

    def _register_subscription(self, topic: str, subscription: str) -> asyncio.Future[None]:
        key = (topic, subscription)
        registration = self._subscriptions.get(key)
        if self._failed(registration):
            registration = self._coordinator.add_subscription(self.txn_id, topic, subscription)
            self._subscriptions[key] = registration
        assert registration is not None
        return registration

    def _track(self, operation: asyncio.Future[object]) -> None:
        self._operations.append(operation)

    async def _first_failure(self) -> BaseException | None:
        pending = [op for op in self._operations if not op.done()]
        if pending:
            await asyncio.wait(pending)
        for op in self._operations:
            if op.cancelled():
                return asyncio.CancelledError("an operation of the transaction was cancelled")
            if op.exception() is not None:
                return op.exception()
        return None

    async def commit(self) -> None:
        """Commit once every send and ack of the transaction is done; if one of them failed,
        abort instead and raise its error."""
        self._check_open()
        self.state = COMMITTING
        self._timer.cancel()
        failure = await self._first_failure()
        if failure is not None:
            self.state = ABORTING
            try:
                await self._coordinator.end(self.txn_id, pb.ABORT)
                self.state = ABORTED
            except BaseException:
                self.state = ERROR
            raise failure
        try:
            await self._coordinator.end(self.txn_id, pb.COMMIT)
        except BaseException:
            self.state = ERROR
            raise
        self.state = COMMITTED

    async def abort(self) -> None:
        """Abort: everything the transaction sent is dropped, its acks are released. A
        transaction past its timeout was aborted by the coordinator already."""
        if self.state == TIMED_OUT:
            self.state = ABORTED
            return
        self._check_open()
        self.state = ABORTING
        self._timer.cancel()
        await self._first_failure()
        try:
            await self._coordinator.end(self.txn_id, pb.ABORT)
        except TransactionNotFoundError:
            pass                                 # already ended and forgotten by the coordinator
        except BaseException:
            self.state = ERROR
            raise
        self.state = ABORTED
