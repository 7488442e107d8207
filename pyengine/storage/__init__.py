"""Storage on LMDB: the environment of a data dir, managed ledgers (a topic's log of entries)
and managed cursors (a subscription's acknowledgement state)."""

from pyengine.storage.cursor import ManagedCursor
from pyengine.storage.entry import Entry
from pyengine.storage.environment import StorageEnvironment
from pyengine.storage.errors import (
    CorruptRecordError,
    CursorNotFoundError,
    LedgerClosedError,
    StorageError,
    StorageFullError,
    TopicTerminatedError,
)
from pyengine.storage.managed_ledger import ManagedLedger, ManagedLedgerConfig

__all__ = [
    "CorruptRecordError", "CursorNotFoundError", "Entry", "LedgerClosedError", "ManagedCursor",
    "ManagedLedger", "ManagedLedgerConfig", "StorageEnvironment", "StorageError", "StorageFullError",
    "TopicTerminatedError",
]
