"""Data dirs the source cannot read are refused with a reason, at planning and at capture.

A read-only `StorageEnvironment` checks no data format (only the broker's read-write open
does), so a data dir of another format version was read as if it were this one: rows came
back, decoded under the wrong layout's assumptions. An LMDB environment of another program
(no pyengine databases) failed with lmdb's bare `NotFoundError: mdb_dbi_open: MDB_NOTFOUND`.
"""

from __future__ import annotations

import asyncio
import shutil
import struct
from pathlib import Path

import lmdb
import pytest

from pyengine.broker import Broker
from pyengine.storage.errors import StorageError
from pyengine.storage.reader import DataDirNotFoundError
from spark_udfs.source import PyengineDataSource
from spark_udfs.state import capture_state

TOPIC = "persistent://public/default/orders"


async def _write(data_dir: Path) -> None:
    async with Broker.embedded(data_dir) as broker:
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"plain")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kinds") / "data"
    asyncio.run(_write(path))
    return path


def _plan(path: Path) -> None:
    source = PyengineDataSource({"path": str(path)})
    source.reader(source.schema())


def test_a_data_dir_of_another_format_version_is_refused(data_dir, tmp_path):
    newer = tmp_path / "newer"
    shutil.copytree(data_dir, newer)
    env = lmdb.open(str(newer / "lmdb"), max_dbs=16)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        assert struct.unpack(">q", txn.get(b"format", db=meta)) == (1,)
        txn.put(b"format", struct.pack(">q", 2), db=meta)
    env.close()
    for attempt in (_plan, capture_state):
        with pytest.raises(StorageError, match="holds data format 2, this pyengine reads format 1"):
            attempt(newer)
    _plan(data_dir)           # the original still reads


def test_an_lmdb_environment_of_another_program_is_not_a_data_dir(tmp_path):
    env = lmdb.open(str(tmp_path / "lmdb"))
    with env.begin(write=True) as txn:
        txn.put(b"key", b"value")
    env.close()
    for attempt in (_plan, capture_state):
        with pytest.raises(DataDirNotFoundError, match="is not a pyengine data dir: its LMDB environment lacks"):
            attempt(tmp_path)
