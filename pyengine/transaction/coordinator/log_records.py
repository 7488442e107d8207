"""The on-disk format of a v4 coordinator's log in the LMDB `txn_log` database.

Key: pack_i64(coordinator id) + pack_i64(log sequence), so one coordinator's records are one
contiguous key range in log order. Log sequence -1 holds the coordinator's header (the next
txn sequence), which sorts before every record and is never trimmed. Values are
`TxnLogRecord`s (records.proto): NEW, ADD_PARTITION, ADD_SUBSCRIPTION and UPDATE while a txn
is live; when it ends they are all replaced by one compact FINISHED record.
"""

from __future__ import annotations

from core_ext.poskeys import pack_i64, unpack_i64
from pyengine.storage.errors import CorruptRecordError
from pyengine.transaction import TxnStatus
from pyengine.transaction.coordinator.records_pb2 import (
    ADD_PARTITION,
    ADD_SUBSCRIPTION,
    FINISHED,
    NEW,
    UPDATE,
    CoordinatorHeader,
    LoggedSubscription,
    TxnLogRecord,
)

HEADER_SEQUENCE = -1
KEY_SIZE = 16

__all__ = [
    "ADD_PARTITION", "ADD_SUBSCRIPTION", "FINISHED", "HEADER_SEQUENCE", "KEY_SIZE", "NEW", "UPDATE",
    "TxnLogRecord", "add_partitions_record", "add_subscriptions_record", "coordinator_prefix",
    "decode_header", "encode_header", "finished_record", "log_key", "log_sequence",
    "new_record", "update_record",
]


def coordinator_prefix(coordinator_id: int) -> bytes:
    return pack_i64(coordinator_id)


def log_key(prefix: bytes, sequence: int) -> bytes:
    return prefix + pack_i64(sequence)


def log_sequence(key: bytes) -> int:
    return unpack_i64(key[8:])


def encode_header(next_txn_sequence: int) -> bytes:
    return CoordinatorHeader(next_txn_sequence=next_txn_sequence).SerializeToString()


def decode_header(raw: bytes) -> int:
    try:
        return CoordinatorHeader.FromString(raw).next_txn_sequence
    except Exception as exc:
        raise CorruptRecordError(f"transaction coordinator header: {exc}") from exc


def new_record(most: int, least: int, timeout_ms: int, start_ms: int) -> bytes:
    return TxnLogRecord(op=NEW, txn_most=most, txn_least=least, timeout_ms=timeout_ms,
                        start_ms=start_ms, modified_ms=start_ms).SerializeToString()


def add_partitions_record(most: int, least: int, partitions: list[str], now_ms: int) -> bytes:
    return TxnLogRecord(op=ADD_PARTITION, txn_most=most, txn_least=least, partitions=partitions,
                        modified_ms=now_ms).SerializeToString()


def add_subscriptions_record(most: int, least: int, subscriptions: list[tuple[str, str]],
                             now_ms: int) -> bytes:
    logged = [LoggedSubscription(topic=topic, subscription=sub) for topic, sub in subscriptions]
    return TxnLogRecord(op=ADD_SUBSCRIPTION, txn_most=most, txn_least=least, subscriptions=logged,
                        modified_ms=now_ms).SerializeToString()


def update_record(most: int, least: int, expected: TxnStatus, new: TxnStatus, timed_out: bool,
                  now_ms: int) -> bytes:
    record = TxnLogRecord(op=UPDATE, txn_most=most, txn_least=least, expected_status=int(expected),
                          new_status=int(new), modified_ms=now_ms)
    if timed_out:
        record.timed_out = True
    return record.SerializeToString()


def finished_record(most: int, least: int, status: TxnStatus, start_ms: int, timeout_ms: int,
                    finished_ms: int) -> bytes:
    return TxnLogRecord(op=FINISHED, txn_most=most, txn_least=least, new_status=int(status),
                        start_ms=start_ms, timeout_ms=timeout_ms,
                        modified_ms=finished_ms).SerializeToString()
