"""Pending acknowledgements: a subscription's view of the transactions acknowledging on it.

A transactional acknowledgement reserves a message for its transaction: it is applied to the
subscription's cursor when the transaction commits and dropped (the message is delivered
again) when it aborts. A second transaction acknowledging the same message (or batch index),
or an acknowledgement of something already acknowledged, is a TransactionConflictError.
v4 keeps a pending-ack log per subscription (`handle.PendingAckHandleImpl` over
`log_store.LogPendingAckStore`); v5 keeps op records in the metadata store.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from pyengine.errors import ServiceNotReadyError
from pyengine_kernels import Position, TxnId


class PendingAckReplayError(ServiceNotReadyError):
    """The pending acks of a subscription could not be rebuilt (a record cannot be decoded,
    the store cannot be read). The message names the subscription and the record; the handle
    then refuses every call with ServiceNotReadyError until a later replay succeeds.
    (Added to the interface so that v4 and v5 stores fail the same way.)"""


@dataclass(frozen=True)
class IndividualAck:
    """One message (or some indexes of a batch) acknowledged by a transaction. `ack_set` is
    Pulsar's batch ack set (a set bit is an index still unacknowledged); None acks the whole
    entry."""

    position: Position
    batch_size: int = 1
    ack_set: tuple[int, ...] | None = None


class PendingAckHandle(ABC):
    @abstractmethod
    async def replay(self) -> None:
        """Rebuild the pending acks before the subscription serves; fails loudly
        (PendingAckReplayError) rather than hanging when its records cannot be read."""

    @property
    def replay_failed(self) -> bool:
        """Whether its last replay failed: it refuses every call until a replay succeeds."""
        return False

    @abstractmethod
    async def individual_ack(self, txn: TxnId, acks: list[IndividualAck], *,
                             after: asyncio.Future[Any] | None = None) -> None:
        """Reserve messages for `txn` durably, or raise TransactionConflictError (nothing of
        the request is then reserved). `after`: the coordinator's registration of this
        subscription with `txn`, maybe still being written; the request's record is never
        durable without it, and fails if it failed."""

    @abstractmethod
    async def cumulative_ack(self, txn: TxnId, position: Position, *,
                             after: asyncio.Future[Any] | None = None) -> None:
        """Reserve everything up to `position` for `txn` (Exclusive/Failover subscriptions);
        `after` as for `individual_ack`."""

    @abstractmethod
    async def cumulative_ack_in_batch(self, txn: TxnId, before: Position, ack: IndividualAck, *,
                                      after: asyncio.Future[Any] | None = None) -> None:
        """A cumulative ack up to a message inside a batch: everything up to `before`
        cumulatively and `ack`'s batch indexes individually, as one request (both reserved
        or neither, as Pulsar's single cumulative position with an ack set)."""

    @abstractmethod
    async def commit(self, txn: TxnId, low_watermark: int) -> list[Position]:
        """Apply `txn`'s acknowledgements to the cursor (idempotent); returns the positions acked."""

    @abstractmethod
    async def abort(self, txn: TxnId, low_watermark: int) -> list[Position]:
        """Drop `txn`'s acknowledgements (idempotent); returns the positions to deliver again."""

    @abstractmethod
    def is_fully_pending(self, position: Position, batch_size: int = 1) -> bool:
        """True when every message of the entry is either acknowledged on the cursor or reserved
        by an open transaction: the dispatcher must not deliver it (Pulsar #19581)."""

    @abstractmethod
    def pending_ack_set(self, position: Position) -> list[int] | None:
        """The batch ack set of the indexes still free at `position` after pending acks (set bit
        = neither acknowledged nor reserved), or None when no transaction holds part of it."""

    def resolve_decided(self) -> asyncio.Future[None] | None:
        """Before a consumer's rewind: apply the decisions already taken on the txns holding
        acks here that this handle may not have heard of yet; a future done once they are
        applied, or None when there is nothing to wait for. None by default: a v4 decision
        reaches the handle (END_TXN_ON_SUBSCRIPTION) before the client is answered."""
        return None

    @abstractmethod
    def stats(self) -> dict: ...

    @abstractmethod
    async def close(self) -> None: ...
