"""Helpers: a topic with entries, a durable subscription and its pending-ack handle."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pyengine.protocol.pulsar_api_pb2 import CommandSubscribe
from pyengine.storage import ManagedCursor, ManagedLedger, ManagedLedgerConfig, StorageEnvironment
from pyengine.transaction.pendingack import IndividualAck
from pyengine.transaction.pendingack.handle import PendingAckHandleImpl
from pyengine.transaction.pendingack.log_store import LogPendingAckStore
from pyengine_kernels import Position, TxnId, ackset_and, ackset_new

TOPIC = "persistent://public/default/pending-ack"
SUB = "sub"
EXCLUSIVE = CommandSubscribe.Exclusive
SHARED = CommandSubscribe.Shared
FAILOVER = CommandSubscribe.Failover
KEY_SHARED = CommandSubscribe.Key_Shared

T1, T2, T3 = TxnId(1, 1), TxnId(1, 2), TxnId(1, 3)
_WORD = (1 << 64) - 1


@dataclass
class Subscription:
    ledger: ManagedLedger
    cursor: ManagedCursor
    handle: PendingAckHandleImpl
    positions: list[Position]


async def open_subscription(env: StorageEnvironment, entries: int = 0, *, sub: str = SUB,
                            topic: str = TOPIC, sub_type: int = EXCLUSIVE, per_ledger: int = 4,
                            replay: bool = True, **handle_kwargs) -> Subscription:
    """Open (or reopen after a restart) the topic, append `entries` more entries, open the
    subscription's cursor at the earliest position and a handle on it (replayed)."""
    ledger = await ManagedLedger.open(env, topic, ManagedLedgerConfig(max_entries_per_ledger=per_ledger))
    await asyncio.gather(*(ledger.append(b"m%d" % i) for i in range(entries)))
    cursor = await ledger.open_cursor(sub, "earliest")
    handle = PendingAckHandleImpl(cursor, LogPendingAckStore.for_cursor(cursor), subscription_type=sub_type,
                                  **handle_kwargs)
    if replay:
        await handle.replay()
    positions = [entry.position for entry in ledger.read_entries(Position(-1, -1), 1 << 20)]
    return Subscription(ledger, cursor, handle, positions)


def acking(batch_size: int, *indexes: int) -> list[int]:
    """The ack set of a request acknowledging `indexes` of a batch (their bits cleared)."""
    words = [word & _WORD for word in ackset_new(batch_size)]         # unsigned while editing
    for index in indexes:
        words[index // 64] &= ~(1 << (index % 64))
    signed = [word - (1 << 64) if word >> 63 else word for word in words]
    return ackset_and(signed, signed)


def batch(position, size, *indexes):
    """A transactional ack of `indexes` of the batch entry at `position`."""
    return IndividualAck(position, size, tuple(acking(size, *indexes)))
