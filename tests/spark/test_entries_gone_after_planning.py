"""Entries a query planned and that were deleted before a task read them (a retention trim, a
topic deleted) fail the read with DataDirChangedError. Found by an audit: they were skipped,
and a DataFrame planned before a trim counted 12 rows where it had counted 24 (the data dir as
it never was). Appends after planning stay out, as before."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.storage import ManagedLedgerConfig
from spark_udfs.options import parse_options
from spark_udfs.source import DataDirChangedError, PyengineReader, read_partition

T = "persistent://public/default/trimmed-after-planning"
CONFIG = dict(sync=False, ledger=ManagedLedgerConfig(max_entries_per_ledger=4))


def read_all(reader: PyengineReader) -> int:
    return sum(b.num_rows for p in reader.partitions() for b in read_partition(reader.options, reader.state, p))


def test_a_trim_after_planning_fails_the_read_appends_do_not(tmp_path):
    data_dir = tmp_path / "data"

    async def write(messages: int) -> None:
        async with Broker.embedded(data_dir, **CONFIG) as broker:
            producer = await broker.create_producer(T)
            for i in range(messages):
                await producer.send(b"m%d" % i)

    async def trim() -> None:
        async with Broker.embedded(data_dir, **CONFIG) as broker:
            topic = await broker.service.get_topic(T)
            topic.ledger.set_retention(0, 0)
            assert await topic.ledger.trim(now_ms=1 << 62)    # no subscription: consumed ledgers go

    asyncio.run(write(10))
    reader = PyengineReader(parse_options({"path": str(data_dir), "topics": T}))
    asyncio.run(write(5))                                     # appended after planning: left out
    assert read_all(reader) == 10
    asyncio.run(trim())
    with pytest.raises(DataDirChangedError, match="plan it again"):
        read_all(reader)
    # planned again, the read is of what is left (nothing: every closed ledger was trimmed)
    assert read_all(PyengineReader(parse_options({"path": str(data_dir), "topics": T}))) == 0
