"""Transaction coordinator: the interface of a coordinator's metadata store, and what it
needs from the rest of the broker to end a transaction on its participants."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyengine.transaction import TxnAction, TxnStatus
from pyengine_kernels import TxnId


@dataclass
class TxnMeta:
    """What a coordinator knows about one transaction."""

    txn_id: TxnId
    status: TxnStatus
    timeout_ms: int
    start_ms: int
    last_modified_ms: int
    partitions: list[str] = field(default_factory=list)                 # in the order added
    subscriptions: list[tuple[str, str]] = field(default_factory=list)  # (topic, subscription)
    # Added: the abort was decided by the coordinator's timeout, so the txn ends TIME_OUT rather
    # than ABORTED; persisted with the ABORTING record so a restart ends it the same way.
    timed_out: bool = False


class TransactionParticipants(Protocol):
    """How a coordinator reaches a transaction's participants (Pulsar's END_TXN_ON_PARTITION /
    END_TXN_ON_SUBSCRIPTION). In one process these are direct calls into the topics. Each must
    be idempotent: the coordinator repeats a call until it succeeds, also after a restart.

    `after` on a partition: the decision's record, not durable yet (the partition is told at
    once, so that its marker shares the decision's group commit). A participant writing into
    the coordinator's StorageEnvironment makes its writes conditional on it
    (`StorageEnvironment.depend`); any other must await it before applying the decision.

    A participant may also offer `end_txn_on_partition_now` (same arguments): the call started
    before it returns, as a future, or None when it cannot (then the coordinator awaits
    `end_txn_on_partition`). It spares a task and a coroutine chain per partition."""

    async def end_txn_on_partition(self, topic: str, txn: TxnId, action: TxnAction,
                                   low_watermark: int, *, after: asyncio.Future[Any] | None = None) -> None: ...

    async def end_txn_on_subscription(self, topic: str, subscription: str, txn: TxnId,
                                      action: TxnAction, low_watermark: int) -> None: ...


class TransactionMetadataStore(ABC):
    """The state of the transactions of one coordinator (Pulsar's TransactionMetadataStore).

    Errors: `TransactionNotFoundError` for an unknown txn id, `InvalidTxnStatusError` for an
    illegal transition (pyengine.errors).
    """

    coordinator_id: int

    @abstractmethod
    async def recover(self) -> list[TxnMeta]:
        """Load the state left by a previous run; returns the transactions not yet terminal."""

    @abstractmethod
    async def new_transaction(self, timeout_ms: int) -> TxnMeta: ...

    @abstractmethod
    async def add_produced_partitions(self, txn: TxnId, partitions: list[str]) -> None: ...

    @abstractmethod
    async def add_acked_subscriptions(self, txn: TxnId, subscriptions: list[tuple[str, str]]) -> None: ...

    @abstractmethod
    async def update_status(self, txn: TxnId, new: TxnStatus, expected: TxnStatus, *,
                            timed_out: bool = False) -> TxnMeta:
        """Move `txn` from `expected` to `new` durably; a txn already in `new` succeeds as is.

        `timed_out` (added) marks an OPEN -> ABORTING move made by the timeout, which then
        ends in TIME_OUT instead of ABORTED.
        """

    @abstractmethod
    def get(self, txn: TxnId) -> TxnMeta:
        """The txn's metadata (TransactionNotFoundError if unknown or long finished)."""

    @abstractmethod
    def low_watermark(self) -> int:
        """The highest sequence such that every txn of this coordinator up to it is terminal."""

    @abstractmethod
    async def close(self) -> None: ...
