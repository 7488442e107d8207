"""`write_now` (start-up writes) reports a full disk as StorageFullError, as group commits do,
and the environment keeps working after it."""

import lmdb
import pytest

from pyengine.storage import StorageEnvironment, StorageFullError


def test_write_now_reports_a_full_disk_as_storage_full(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    try:
        meta = env.db("meta")

        def write(txn):
            txn.put(b"lost", b"1", db=meta)
            raise lmdb.DiskError("mdb_txn_commit: No space left on device")

        with pytest.raises(StorageFullError):
            env.write_now(write)
        with env.read() as txn:
            assert txn.get(b"lost", db=meta) is None
        env.write_now(lambda txn: txn.put(b"kept", b"1", db=meta))
        with env.read() as txn:
            assert txn.get(b"kept", db=meta) == b"1"
    finally:
        env.close()
