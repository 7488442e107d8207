"""Driving a stream reader (spark_udfs.stream) as Spark drives it, without Spark."""

from __future__ import annotations

import pyarrow as pa

from spark_udfs.schema import ARROW_SCHEMA
from spark_udfs.stream import PyengineStreamReader


class MicroBatches:
    """Drives a stream reader as Spark does: offsets from the last end, partitions, reads."""

    def __init__(self, reader: PyengineStreamReader) -> None:
        self.reader = reader
        self.offset = reader.initialOffset()

    def next(self) -> list[bytes]:
        end = self.reader.latestOffset(self.offset, self.reader.getDefaultReadLimit())
        parts = self.reader.partitions(self.offset, end)
        batches = [batch for part in parts for batch in self.reader.read(part)]
        self.reader.commit(end)
        self.offset = end
        return sorted(pa.Table.from_batches(batches, schema=ARROW_SCHEMA).column("value").to_pylist())
