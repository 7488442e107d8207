"""Storage errors. Each names what went wrong and what the caller can do about it."""


class StorageError(Exception):
    """A storage operation failed; nothing it was asked to write became durable."""


class StorageFullError(StorageError):
    """The LMDB map (or the disk) is full, or nearly: appends are refused once more than 95% of
    the map is used (or less than 256 KiB is free), until less than 90% is, so that what frees
    space can still be written (see environment.FULL_SHARE). Reads keep working; writes fail
    until space is freed (trim consumed ledgers, delete topics: their entries are removed in
    bounded writes, which a nearly full map takes) or the broker restarts with a larger
    ``map_size``."""


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
