"""Settings of the v4 topic transaction buffer (Pulsar's transactionBufferSnapshot* settings)."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.transaction.buffer.snapshot import DEFAULT_SEGMENT_ABORTS


@dataclass(frozen=True)
class TopicTransactionBufferConfig:
    # A snapshot is taken after this many txns ended on the topic
    # (Pulsar's transactionBufferSnapshotMaxTransactionCount) ...
    snapshot_max_txn_count: int = 1000
    # ... or after this long if anything changed since the last one, whichever comes first
    # (transactionBufferSnapshotMinTimeInMillis).
    snapshot_min_interval_ms: int = 5000
    # False: never write snapshots (recovery then replays the whole ledger; for measurements).
    snapshots_enabled: bool = True
    # Aborts per sealed snapshot segment (PIP-196; Pulsar's transactionBufferSnapshotSegmentSize,
    # 256 KiB, is about as many): each is written once, the snapshot record lists them.
    snapshot_segment_aborts: int = DEFAULT_SEGMENT_ABORTS
    # Entries read per step of the recovery replay; the event loop runs between steps.
    replay_chunk_entries: int = 1000

    def __post_init__(self) -> None:
        for name in ("snapshot_max_txn_count", "snapshot_min_interval_ms", "replay_chunk_entries",
                     "snapshot_segment_aborts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        if not isinstance(self.snapshots_enabled, bool):
            raise ValueError(f"snapshots_enabled must be a bool, not {self.snapshots_enabled!r}")
