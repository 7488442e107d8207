"""Transaction buffer: a topic's view of the transactions writing to it.

Transactional entries are stored in the topic's managed ledger when they are sent; the buffer
decides what a READ_COMMITTED reader may see: nothing at or after the first entry of a
still-open transaction (the max read position), and never an entry of an aborted transaction
(the aborted set). Commit and abort end a transaction on the topic. v4 (`TopicTransactionBuffer`,
`persistent://` topics) writes commit/abort markers into the stream; v5
(`MetadataTransactionBuffer`, `segment://` topics) keeps the state in the metadata store.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

from pyengine.errors import NotAllowedError
from pyengine.storage.entry import Entry
from pyengine_kernels import AbortedTxnSet, Position, TxnId

if TYPE_CHECKING:
    from pyengine.transaction import TxnAction


class BufferState(Enum):
    NONE = "none"                  # created, recovery not started
    INITIALIZING = "initializing"  # recovering: the read horizon is held back
    READY = "ready"
    CLOSED = "closed"


class TransactionBuffer(ABC):
    state: BufferState

    @abstractmethod
    async def recover(self) -> None:
        """Rebuild the state (ongoing and aborted txns, read horizon) before the topic serves."""

    @abstractmethod
    def append(self, txn: TxnId, data: bytes, *, num_messages: int = 1,
               publish_time: int = 0) -> asyncio.Future[Position]:
        """Append a transactional entry; the future resolves with its position once durable.
        Fails at once with TransactionConflictError/NotAllowedError for a txn that already
        ended on this topic."""

    def append_checked(self, txn: TxnId, data: bytes, num_messages: int, publish_time: int,
                       after: asyncio.Future[Any] | None = None) -> asyncio.Future[Position]:
        """`append` for callers whose arguments are known good (the broker's publish path):
        an implementation may skip their checks. `after`: the coordinator's registration of
        this partition with `txn`, maybe still being written to the same storage environment:
        the entry is durable only with or after it, and fails if it failed (v4 only: a v5
        registration is no write of this environment)."""
        if after is not None:
            raise NotAllowedError(f"{type(self).__name__} appends are not ordered after storage writes")
        return self.append(txn, data, num_messages=num_messages, publish_time=publish_time)

    @abstractmethod
    async def commit(self, txn: TxnId, low_watermark: int, *, after: asyncio.Future[Any] | None = None) -> None:
        """End `txn` as committed (idempotent). `low_watermark` is the coordinator's: every txn
        of that coordinator with a sequence up to it has ended. `after`: the coordinator's
        decision, still being written to the same storage environment; what ends the txn here
        is made durable only with or after it (StorageEnvironment.depend)."""

    @abstractmethod
    async def abort(self, txn: TxnId, low_watermark: int, *, after: asyncio.Future[Any] | None = None) -> None:
        """End `txn` as aborted (idempotent); `after` as for `commit`."""

    def end_now(self, txn: TxnId, action: TxnAction, low_watermark: int, *,
                after: asyncio.Future[Any] | None = None) -> asyncio.Future[None] | None:
        """`commit` / `abort` started before this returns, when the buffer can (its future
        resolves as they would return); None when it cannot: await `commit` / `abort`. The
        default never can."""
        return None

    @abstractmethod
    def max_read_position(self) -> Position:
        """Readers may see entries up to and including this position, and no further."""

    @abstractmethod
    def is_txn_aborted(self, txn: TxnId) -> bool: ...

    @abstractmethod
    def ongoing_txns(self) -> list[tuple[TxnId, Position]]:
        """The open txns with an entry on the topic, with the position of their first."""

    def hides(self, entry: Entry) -> bool:
        """True for a transactional entry no reader may ever see: one of an aborted txn (and,
        v5, a write that lost the race with its txn's commit). Markers are the caller's."""
        return entry.txn_most >= 0 and self.is_txn_aborted(entry.txn)

    @property
    @abstractmethod
    def aborted(self) -> AbortedTxnSet:
        """The aborted transactions (read-only use: dispatch and export filter with it)."""

    @abstractmethod
    def add_listener(self, listener: Callable[[], None]) -> None:
        """`listener()` runs on the event loop whenever the max read position may have moved."""

    @abstractmethod
    def stats(self) -> dict: ...

    @abstractmethod
    async def close(self) -> None: ...

    async def delete(self) -> None:
        """The topic is deleted (the buffer closed): remove what the buffer keeps outside the
        topic's ledger (nothing, unless a design keeps state elsewhere)."""
