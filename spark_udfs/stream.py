"""`spark.readStream.format("pyengine")`: Structured Streaming over a broker's data dir.

Each micro-batch reads what became readable since the previous one, READ_COMMITTED by default
(the options of `spark_udfs.options`; `endPosition` and `filterPushdown` are for batch reads
only and refused here):

* An offset is a JSON object `{topic: "LEDGER:ENTRY"}`: per topic, the next position to read.
  `latestOffset` takes one read snapshot of the data dir and moves each topic to just after
  what a READ_COMMITTED consumer may read now: its read horizon (the max read position: never
  past an open transaction's first entry) or, read_uncommitted, its last entry. So a
  micro-batch never holds a message whose transaction is still open, and the messages behind
  an open transaction come in a later one, once it has ended (as a READ_COMMITTED consumer
  gets them). Everything before the horizon is decided, so a batch's rows never change.
* `partitions(start, end)` plans one partition per ledger (or `maxPartitionEntries` of it)
  between the offsets, and captures the transaction state of the topics read (their aborted
  transactions) in the same snapshot; each partition carries its topic's state to its task,
  which reads as the batch source does (`spark_udfs.source.read_partition`).
* `startPosition`: `earliest` (default), `LEDGER:ENTRY`, per topic as JSON, or `latest`: from
  what becomes readable after the query starts (READ_COMMITTED: from the read horizon, as
  Spark's Kafka source starts a read_committed query at the last stable offset).
* Topics matched by a pattern (`topics` a namespace or glob) that appear later are read from
  their beginning, as Spark's Kafka source reads new partitions; a topic deleted while the
  query runs is no longer planned.

Restarting a query from its checkpoint resumes at the checkpointed offsets. Entries trimmed by
retention before a micro-batch reads them are not there to read (Kafka's failOnDataLoss=false).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from pyengine.storage.reader import TopicInfo
from pyengine_kernels import Position
from spark_udfs.options import OptionError, PositionSpec, ReadOptions, parse_position, resolve_topics
from spark_udfs.source import LedgerPartition, read_partition
from spark_udfs.state import Snapshot, open_snapshot


class StreamPartition(LedgerPartition):
    """A LedgerPartition of a micro-batch, with its topic's READ_COMMITTED state (TxnState
    bytes, None for read_uncommitted): a stream reader's `read` may keep nothing of planning."""

    def __init__(self, topic: str, topic_id: int, ledger_id: int, first_entry: int, last_entry: int,
                 state: bytes | None) -> None:
        super().__init__(topic, topic_id, ledger_id, first_entry, last_entry)
        self.state = state


class PyengineStreamReader(DataSourceStreamReader):
    def __init__(self, options: ReadOptions) -> None:
        if options.end != PositionSpec("latest"):
            raise OptionError("endPosition applies to batch reads: a stream reads on as topics grow "
                              "(stop the query, or filter on ledger_id/entry_id)")
        if options.filter_pushdown:
            raise OptionError("filterPushdown applies to batch reads (spark.read), not to streams")
        self.options = options

    # --- offsets (on the driver) -----------------------------------------------------------

    def initialOffset(self) -> dict:
        with open_snapshot(self.options.path) as snapshot:
            names = self._topics(snapshot, check_start=True)
            offset = {}
            for name in names:
                start = self.options.start.for_topic(name)
                if start == "earliest":
                    position = Position.EARLIEST
                elif start == "latest":
                    position = self._readable_end(snapshot, snapshot.view.topic(name))
                else:
                    position = start
                offset[name] = str(position)
        return offset

    def latestOffset(self, start: dict, limit=None) -> dict:
        """Every topic moved to just after what is readable now (never back)."""
        begin = _positions(start)
        with open_snapshot(self.options.path) as snapshot:
            names = self._topics(snapshot)
            end = dict(begin)
            for name in names:
                readable = self._readable_end(snapshot, snapshot.view.topic(name))
                end[name] = max(begin.get(name, Position.EARLIEST), readable)
        return {name: str(position) for name, position in end.items()}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, stop = _positions(start), _positions(end)
        with open_snapshot(self.options.path) as snapshot:
            stored = set(snapshot.topic_names())
            ranges = {name: (begin.get(name, Position.EARLIEST), position) for name, position in stop.items()
                      if name in stored and begin.get(name, Position.EARLIEST) < position}
            state = snapshot.state(sorted(ranges)) if self.options.read_committed and ranges else None
            parts: list[InputPartition] = []
            for name, (first, after) in sorted(ranges.items()):
                topic_state = state.select([name]).to_bytes() if state is not None else None
                parts += _plan(snapshot.view.topic(name), first, after, self.options.max_partition_entries,
                               topic_state)
        return parts

    def _topics(self, snapshot: Snapshot, check_start: bool = False) -> list[str]:
        names = resolve_topics(self.options.topics, snapshot.topic_names())
        stray = sorted(set(self.options.start.per_topic) - set(names)) if check_start else []
        if stray:
            raise OptionError(f"startPosition names {', '.join(map(repr, stray))}, which is not among the topics "
                              "read: name a topic read, as stored (a partition, a segment)")
        return names

    def _readable_end(self, snapshot: Snapshot, info: TopicInfo) -> Position:
        """The position after the last one a reader of this isolation may read now."""
        last = info.last_position
        if self.options.read_committed:
            last = min(last, snapshot.topic_state(info).max_read_position)
        return last.next() if last != Position.EARLIEST else Position.EARLIEST

    # --- reading (in the workers) ----------------------------------------------------------

    def read(self, partition: StreamPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(self.options, partition.state, partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the data dir is only read (its retention is the broker's)."""


def _positions(offset: Mapping) -> dict[str, Position]:
    """An offset as this reader wrote it; a checkpoint edited by hand fails clearly."""
    if not isinstance(offset, Mapping):
        raise OptionError(f"not an offset of the pyengine stream source: {offset!r}")
    positions = {}
    for name, text in offset.items():
        position = parse_position(f"offset of {name}", text)
        if not isinstance(position, Position):
            raise OptionError(f"offset of {name} must be LEDGER:ENTRY, not {text!r}")
        positions[str(name)] = position
    return positions


def _plan(info: TopicInfo, first: Position, after: Position, step: int, state: bytes | None) -> list[InputPartition]:
    """Partitions of the entries at `first` or after and before `after`."""
    parts: list[InputPartition] = []
    for ledger in info.ledgers:
        lid = ledger.ledger_id
        if not ledger.entries or not first.ledger_id <= lid <= after.ledger_id:
            continue
        low = max(ledger.first_entry, first.entry_id if lid == first.ledger_id else -1)
        high = min(ledger.last_entry, after.entry_id - 1 if lid == after.ledger_id else ledger.last_entry)
        for chunk in range(low, high + 1, step):
            parts.append(StreamPartition(info.name, info.topic_id, lid, chunk, min(high, chunk + step - 1), state))
    return parts


__all__ = ["PyengineStreamReader", "StreamPartition"]
