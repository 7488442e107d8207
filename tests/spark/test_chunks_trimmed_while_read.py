"""A chunked message whose first chunks were trimmed after the read was planned fails the read
(DataDirChangedError), as the entries of a partition do: found by an audit, it was left out
silently. The task reading the ledger of its last chunk reads back for its first chunks
(`spark_udfs.chunks`); when retention had trimmed their ledger since planning (the task of that
ledger had already run), the look-back found nothing and the query succeeded without the
message: the data dir as it never was."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest

from pyengine.broker import Broker
from pyengine.storage import ManagedLedgerConfig
from pyengine_kernels import Position
from spark_udfs.options import parse_options
from spark_udfs.schema import ARROW_SCHEMA
from spark_udfs.source import DataDirChangedError, PyengineReader, read_partition
from tests.spark.test_chunked_messages import Stored, chunked, stored_bytes

T = "persistent://public/default/chunks-trimmed-while-read"
CONFIG = dict(sync=False, ledger=ManagedLedgerConfig(max_entries_per_ledger=3))


def values(reader: PyengineReader, partition) -> list[bytes]:
    batches = list(read_partition(reader.options, reader.state, partition))
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA).column("value").to_pylist()


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_first_chunks_trimmed_after_planning_fail_the_read(tmp_path, isolation):
    data_dir = tmp_path / "data"
    whole = b"0123456789" * 4
    # ledger 1: a, b, the first chunk; ledger 2: the last chunk, c
    items = [Stored("p", 0, b"a"), Stored("p", 1, b"b"), *chunked("p", 2, whole, 2, False), Stored("p", 3, b"c")]

    async def write() -> list[Position]:
        async with Broker.embedded(data_dir, **CONFIG) as broker:
            producer = await broker.create_producer(T)
            positions = []
            for item in items:
                data, publish_time = stored_bytes(item)
                positions.append(await producer._topic.publish(producer._producer, data, sequence_id=item.sequence_id,
                                                               publish_time=publish_time, deduplicate=False))
            return positions

    async def trim(first_ledger: Position) -> None:
        async with Broker.embedded(data_dir, **CONFIG) as broker:
            topic = await broker.service.get_topic(T)
            topic.ledger.set_retention(0, 0)
            topic.ledger.add_trim_bound(lambda: first_ledger)          # the first ledger only
            assert await topic.ledger.trim(now_ms=1 << 62) == [first_ledger.ledger_id]

    positions = asyncio.run(write())
    assert positions[2].ledger_id == positions[0].ledger_id != positions[3].ledger_id
    reader = PyengineReader(parse_options({"path": str(data_dir), "topics": T, "isolation": isolation}))
    first, second = reader.partitions()
    assert values(reader, first) == [b"a", b"b"]                       # the message is not complete in it
    assert sorted(values(reader, second)) == [whole, b"c"]             # read back from the planned entries
    asyncio.run(trim(positions[2]))                                    # then the first ledger is trimmed
    with pytest.raises(DataDirChangedError, match="plan it again"):
        values(reader, second)
    # planned again, the message is left out (its first chunk is gone), as a reader would
    again = PyengineReader(reader.options)
    assert [value for partition in again.partitions() for value in values(again, partition)] == [b"c"]
