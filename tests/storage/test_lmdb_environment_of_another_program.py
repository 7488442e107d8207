"""A data dir whose LMDB environment is another program's, with a record named like one of
pyengine's databases, is refused with a DataDirNotFoundError, and leaves nothing open. Found
by an audit: LMDB's own IncompatibleError came out, the data dir stayed locked and the
environment open, so the next open in the process was refused as "in use by another process"
(its own pid)."""

import lmdb
import pytest

from pyengine.storage import StorageEnvironment
from pyengine.storage.errors import DataDirNotFoundError
from pyengine.storage.reader import StoreReader


def test_another_programs_environment_is_refused_and_left_unlocked(tmp_path):
    (tmp_path / "lmdb").mkdir()
    other = lmdb.open(str(tmp_path / "lmdb"))
    with other.begin(write=True) as txn:
        txn.put(b"meta", b"a record of its own, not a database")
    other.close()
    for _ in range(2):              # the second open is refused alike: nothing was left locked
        with pytest.raises(DataDirNotFoundError, match="not a pyengine data dir"):
            StorageEnvironment(tmp_path)
    with pytest.raises(DataDirNotFoundError, match="not a pyengine data dir"):
        StoreReader(tmp_path)
