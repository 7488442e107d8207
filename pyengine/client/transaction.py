"""Transactions of the network client.

A transaction registers each partition it produces to (ADD_PARTITION_TO_TXN) and each
subscription it acknowledges on (ADD_SUBSCRIPTION_TO_TXN) once, before its first send or ack
there; sends and acks in flight share that registration. Commit waits for every send and ack of
the transaction and aborts instead, raising the failure, if one of them failed. A transaction
that is committed, aborted or past its timeout refuses further use locally
(InvalidTxnStatusError), as the Java client's does.

An end whose outcome the coordinator did not tell (no answer within the operation timeout, the
coordinator unreachable or failing to write the decision, the call cancelled) leaves the transaction COMMITTING (ABORTING), and
the same decision may be asked again: the coordinator answers a repeated decision with success
(Pulsar #19629; the Java client keeps COMMITTING / ABORTING then too). Only the coordinator's
refusal (InvalidTxnStatus, TransactionNotFound, ...) puts it in ERROR.

A transaction is used by the producers and consumers of its own client only (ValueError
otherwise, before anything is sent, the transaction left as it was): it registers what it
touches with its client's coordinator, while the message or ack goes to the other client's
broker with the txn id alone, which there can name an unrelated transaction (each broker's
coordinators number theirs from 0) — as the embedded API refuses another broker's.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from pyengine.client.errors import TransactionHasOperationFailedError
from pyengine.errors import (
    ExpiredTransactionError, InvalidTxnStatusError, NotAllowedError, TransactionConflictError, TransactionNotFoundError,
)
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine_kernels import TxnId

if TYPE_CHECKING:
    from pyengine.client.coordinator import TransactionCoordinatorClient

OPEN, COMMITTING, ABORTING, COMMITTED, ABORTED, ERROR, TIMED_OUT = (
    "open", "committing", "aborting", "committed", "aborted", "error", "timed_out")


_PRUNE_AT = 256


_done = asyncio.Future.done
_exception = asyncio.Future.exception


def _failed_op(op: asyncio.Future[object]) -> bool:
    return op.cancelled() or op.exception() is not None


def is_end_refusal(error: BaseException) -> bool:
    """Whether an END_TXN that failed with `error` was refused by the coordinator for good (the
    transaction is not open there, not known, expired, of another epoch of its key): it can
    only end in ERROR. Any other failure leaves its outcome unknown (no answer, the client
    closing under it, the coordinator failing to write the decision): the same end may be asked
    again, as the Java client's TransactionImpl, which errs only on TransactionNotFound and
    InvalidTxnStatus."""
    return isinstance(error, (InvalidTxnStatusError, TransactionNotFoundError, ExpiredTransactionError,
                              NotAllowedError, TransactionConflictError))


def check_same_client(txn: Any, coordinator: TransactionCoordinatorClient) -> None:
    """Refuse `txn` for a send or ack of the client whose coordinator is `coordinator` if it is
    another client's (see the module); anything but a Transaction is left to the caller."""
    if isinstance(txn, Transaction) and txn._coordinator is not coordinator:
        raise ValueError(f"transaction {txn.txn_id} is of another client: a producer or consumer takes the "
                         "transactions of its own client only")


class Transaction:
    def __init__(self, coordinator: TransactionCoordinatorClient, txn_id: TxnId, timeout_ms: int) -> None:
        self._coordinator = coordinator
        self.txn_id = txn_id
        self.state = OPEN
        self._partitions: dict[str, asyncio.Future[None]] = {}
        self._subscriptions: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._operations: list[asyncio.Future[object]] = []      # sends and acks: see _track
        self._prune_at = _PRUNE_AT
        self._retry: str | None = None       # COMMITTING / ABORTING: that end may be asked again
        # consumers that acked cumulatively in this txn: an abort makes them read again from
        # their subscription's position (see abort)
        self._cumulative_consumers: list[Any] = []
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
        operations = self._operations
        if len(operations) >= self._prune_at:
            # Only what is under way or failed matters to the commit: a long transaction keeps
            # those, not a future per send or ack done (the Java client keeps a count).
            self._operations = operations = [op for op in operations if not op.done() or _failed_op(op)]
            self._prune_at = max(_PRUNE_AT, 2 * len(operations))
        operations.append(operation)

    def _refused(self, error: BaseException) -> None:
        """A send or ack of this (still open) transaction refused before it began (a closed or
        failed producer or consumer): recorded, so that the commit fails with it."""
        if self.state == OPEN:
            self._track_failure(error)

    def _track_failure(self, error: BaseException) -> None:
        """A send or ack of this transaction that failed before it was under way (a message
        too big, a full queue, a closed producer): the commit fails with it, as the Java client
        registers a send before it can fail."""
        failed = asyncio.get_running_loop().create_future()
        failed.set_exception(error)
        failed.exception()                      # the commit reports it; nothing to log here
        self._track(failed)

    async def _first_failure(self) -> BaseException | None:
        operations = self._operations
        # A transaction's sends are many: screened at C speed first (`exception()` raises for
        # a cancelled one, which the loop below then finds)
        if not all(map(_done, operations)):
            await asyncio.wait([op for op in operations if not op.done()])
            operations = self._operations
        try:
            if not any(map(_exception, operations)):
                return None
        except asyncio.CancelledError:
            pass
        for op in operations:
            # A cancelled operation is a failure of the transaction, not a cancellation of the
            # caller: raising CancelledError from commit() would end a task nobody cancelled.
            failure = asyncio.CancelledError() if op.cancelled() else op.exception()
            if isinstance(failure, asyncio.CancelledError):
                error = TransactionHasOperationFailedError(
                    f"transaction {self.txn_id}: one of its operations was cancelled")
                error.__cause__ = failure
                return error
            if failure is not None:
                return failure
        return None

    def _begin_end(self, state: str) -> None:
        """OPEN -> `state`; or a repeat of an end of that kind whose outcome is unknown."""
        if self.state == state and self._retry == state:
            self._retry = None
            return
        self._check_open()
        self.state = state
        self._timer.cancel()

    async def _end(self, action: int, state: str) -> None:
        """END_TXN `action`; what its failure leaves: `state` again when the outcome is unknown
        (the same end may be asked again), ERROR when the coordinator refused it."""
        try:
            await self._coordinator.end(self.txn_id, action)
        except BaseException as exc:
            if is_end_refusal(exc):
                self.state = ERROR
            else:
                self._retry = state
            raise

    async def commit(self) -> None:
        """Commit once every send and ack of the transaction is done; if one of them failed,
        abort instead and raise its error. A commit that failed without an answer from the
        coordinator (timeout, connection) may be called again."""
        self._begin_end(COMMITTING)
        try:
            failure = await self._first_failure()
        except BaseException:                    # cancelled while waiting: nothing was sent
            self._retry = COMMITTING
            raise
        if failure is not None:
            self.state = ABORTING
            try:
                await self._end(pb.ABORT, ABORTING)
                self.state = ABORTED
            except TransactionNotFoundError:
                self.state = ABORTED             # already ended and forgotten by the coordinator
            except asyncio.CancelledError:
                raise                            # this commit was cancelled: ABORTING, abort() may go on
            except Exception:
                pass                             # ERROR, or ABORTING and abort() may be called again
            if self.state == ABORTED:
                # as an abort (Java's commit calls abort()): a refused cumulative ack among
                # the failures leaves its consumer to be rewound, or the broker refuses again
                await self._rewind_cumulative_consumers()
            raise failure
        await self._end(pb.COMMIT, COMMITTING)
        self.state = COMMITTED

    async def abort(self) -> None:
        """Abort: everything the transaction sent is dropped, its acks are released. A
        transaction past its timeout was aborted by the coordinator already. An abort that
        failed without an answer from the coordinator may be called again."""
        if self.state == TIMED_OUT:
            self.state = ABORTED
            await self._rewind_cumulative_consumers()
            return
        self._begin_end(ABORTING)
        try:
            await self._first_failure()
        except BaseException:
            self._retry = ABORTING
            raise
        try:
            await self._end(pb.ABORT, ABORTING)
        except TransactionNotFoundError:
            pass                                 # already ended and forgotten by the coordinator
        self.state = ABORTED
        await self._rewind_cumulative_consumers()

    async def _rewind_cumulative_consumers(self) -> None:
        """As the Java client's abort: a consumer that acked cumulatively in the transaction
        drops what it has queued and gets everything unacknowledged again, in order (the
        broker rewinds its Exclusive / Failover subscription). Kept, its queue's later messages
        came first: an application that acked one of those cumulatively acked the released
        messages before them without having processed them. A scalable (v5) transaction's
        abort is one write the segment's subscription learns of later: the broker applies it
        there before it rewinds (read-your-writes), so the released messages come in order too."""
        consumers, self._cumulative_consumers = self._cumulative_consumers, []
        for consumer in consumers:
            if not consumer._closed:
                await consumer.redeliver_unacknowledged_messages()
