"""Shared helpers of the transaction-buffer tests."""

from __future__ import annotations

from core_ext.poskeys import pack_i64
from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine.transaction.buffer.records_pb2 import TransactionBufferSnapshotRecord
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


async def crash_and_reopen(env, reopen, ledger, config=None, ledger_config=None):
    """Restart as after a process crash: no final snapshot, every acknowledged write durable."""
    await ledger.close()
    await env.drain()
    env = reopen(env)
    ledger, buffer = await open_buffer(env, config, ledger_config)
    return env, ledger, buffer


def stored_snapshot_records(env, topic_id: int) -> tuple[TransactionBufferSnapshotRecord, dict[bytes, bytes]]:
    """The index record and the segments (key suffix -> value) stored for the topic."""
    prefix, db = pack_i64(topic_id), env.db("tb_snapshots")
    segments, index = {}, None
    with env.read() as txn:
        cursor = txn.cursor(db=db)
        if cursor.set_range(prefix):
            for key, value in cursor:
                if not key.startswith(prefix):
                    break
                if key == prefix:
                    index = TransactionBufferSnapshotRecord.FromString(value)
                else:
                    segments[bytes(key[len(prefix):])] = bytes(value)
    assert index is not None
    return index, segments


def fail_next_commit(env) -> None:
    """Make the next group commit of `env` fail (nothing of it becomes durable)."""
    original = env._write_batch

    def failing(writes):
        env._write_batch = original
        raise OSError("injected write failure")

    env._write_batch = failing


async def restart_without_closing(env, reopen):
    """The process dies after its last commit: no final snapshot, nothing closed."""
    await env.drain()
    env = reopen(env)
    ledger = await ManagedLedger.open(env, TOPIC)
    buffer = TopicTransactionBuffer(ledger)
    await buffer.recover()
    return env, ledger, buffer
