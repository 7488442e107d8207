"""Shared helpers of the transaction-buffer tests."""

from __future__ import annotations

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine.transaction.buffer.topic_buffer import TopicTransactionBuffer
from pyengine_kernels import Position

TOPIC = "persistent://public/default/tb"


async def open_buffer(env: StorageEnvironment, config: TopicTransactionBufferConfig | None = None,
                      ledger_config: ManagedLedgerConfig | None = None,
                      topic: str = TOPIC) -> tuple[ManagedLedger, TopicTransactionBuffer]:
    ledger = await ManagedLedger.open(env, topic, ledger_config)
    buffer = TopicTransactionBuffer(ledger, config)
    await buffer.recover()
    return ledger, buffer


async def shut(ledger: ManagedLedger, buffer: TopicTransactionBuffer) -> None:
    """A clean stop: final snapshot, ledger closed, every write durable."""
    await buffer.close()
    await ledger.close()
    await ledger.env.drain()


def visible_positions(ledger: ManagedLedger, buffer: TopicTransactionBuffer) -> set[Position]:
    """What a READ_COMMITTED reader may see: non-marker entries up to the max read position
    whose txn (if any) is not aborted."""
    horizon = buffer.max_read_position()
    return {entry.position for entry in ledger.read_entries(Position.EARLIEST, 10**9, horizon)
            if not entry.is_marker and (entry.txn is None or not buffer.is_txn_aborted(entry.txn))}
