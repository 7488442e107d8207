"""Storage errors. Each names what went wrong and what the caller can do about it."""


class StorageError(Exception):
    """A storage operation failed; nothing it was asked to write became durable."""


class StorageFullError(StorageError):
    """The LMDB map (or the disk) is full. Reads keep working; writes fail until space is freed
    (trim, delete topics) or the broker restarts with a larger ``map_size``."""


class DataDirNotFoundError(StorageError):
    """The path is not a pyengine data dir (no LMDB environment, or another program's)."""


class DataDirInUseError(StorageError):
    """Another process writes the data dir (two writers would hand out the same ids and
    overwrite each other's records)."""


class TopicTerminatedError(StorageError):
    """The managed ledger was terminated (sealed): it accepts no more appends."""


class LedgerClosedError(StorageError):
    """The managed ledger or cursor was closed."""


class CursorNotFoundError(StorageError):
    """No cursor with that name exists on the managed ledger."""


class CorruptRecordError(StorageError):
    """A stored record could not be decoded: the data dir is damaged or from another version."""
