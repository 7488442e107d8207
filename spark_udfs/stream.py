"""`spark.readStream.format("pyengine")`: Structured Streaming over a broker's data dir.

Each micro-batch reads what became readable since the previous one, READ_COMMITTED by default
(the options of `spark_udfs.options`; `endPosition` and `filterPushdown` are for batch reads
only and refused here):

* An offset is a JSON object `{topic: "LEDGER:ENTRY"}`: per topic, the next position to read
  (and, under `$starts`, where the query began reading it).
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
  query runs is no longer planned, and leaves the offsets (as a deleted partition leaves
  Kafka's). A pattern may match nothing, at the start or once its
  topics are deleted: its micro-batches are then empty (Kafka's subscribePattern).
* `maxEntriesPerTrigger` (as Kafka's maxOffsetsPerTrigger): at most about that many entries per
  micro-batch (a batched entry holds several messages), shared among the topics in proportion
  to what each has to read, each topic with something to read getting at least one. With
  `Trigger.AvailableNow` the query reads what was readable when it started, in as many
  micro-batches as the limit needs, and stops.

A chunked message comes whole in the micro-batch that reads its last chunk (see
`spark_udfs.chunks`), its first chunks read back from earlier offsets (down to an explicit
`startPosition`; with `earliest` or `latest`, from the topic's beginning).

Restarting a query from its checkpoint resumes at the checkpointed offsets. Entries trimmed by
retention before a micro-batch reads them are not there to read: by default the query reads
on from what is left (Kafka's failOnDataLoss=false), also when the trim falls between planning
and a task; with `failOnDataLoss` true a micro-batch that finds what it was to read gone fails
(DataDirChangedError, see `_check_no_data_lost`), as Spark's Kafka source does by default.
Retention records the last entry it trimmed from each topic (TopicRecord.trimmed_through) in
the write that deletes the ledgers, and `earliest` and `latest` starts are resolved to what is
stored when the query begins (as Kafka's source resolves them to offsets), so that what was
trimmed before the query began is no loss; data dirs written before that record existed tell
only a deletion. Offsets also keep where the query began reading each topic (`$starts`), so
that a chunked message whose first chunks were read and then trimmed, before the micro-batch
that reads its last chunk, fails that micro-batch too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from pyengine.storage.reader import TopicInfo
from pyengine_kernels import Position
from spark_udfs.options import OptionError, PositionSpec, ReadOptions, parse_position, resolve_topics
from spark_udfs.source import (
    DataDirChangedError, FirstChunksTrimmedError, LedgerPartition, PlannedEntriesGoneError, read_partition,
)
from spark_udfs.state import Snapshot, open_snapshot

log = logging.getLogger(__name__)


class StreamPartition(LedgerPartition):
    """A LedgerPartition of a micro-batch, with its topic's READ_COMMITTED state (TxnState
    bytes, None for read_uncommitted): a stream reader's `read` may keep nothing of planning.
    `since` (failOnDataLoss): where the query began reading the topic. A chunked message whose
    last chunk is read here and whose first chunks are gone, with the topic trimmed at or after
    there, may have begun in what the query read, its chunks trimmed before their message came
    whole: a loss (or, for one begun before the query, a false alarm)."""

    def __init__(self, topic: str, topic_id: int, ledger_id: int, first_entry: int, last_entry: int,
                 state: bytes | None, floor: Position = Position.EARLIEST, since: Position | None = None) -> None:
        super().__init__(topic, topic_id, ledger_id, first_entry, last_entry, floor)
        self.state = state
        self.first_chunks_since = (since.ledger_id, since.entry_id) if since is not None else None


class PyengineStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions) -> None:
        if options.end != PositionSpec("latest"):
            raise OptionError("endPosition applies to batch reads: a stream reads on as topics grow "
                              "(stop the query, or filter on ledger_id/entry_id)")
        if options.filter_pushdown:
            raise OptionError("filterPushdown applies to batch reads (spark.read), not to streams")
        self.options = options
        self._target: dict[str, Position] | None = None     # Trigger.AvailableNow: where to stop

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_entries_per_trigger
        return ReadMaxRows(limit) if limit is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Read up to what is readable now, whatever comes after."""
        with open_snapshot(self.options.path) as snapshot:
            self._target = {name: self._readable_end(snapshot, snapshot.view.topic(name))
                            for name in self._topics(snapshot)}

    # --- offsets (on the driver) -----------------------------------------------------------

    def initialOffset(self) -> dict:
        with open_snapshot(self.options.path) as snapshot:
            names = self._topics(snapshot, check_start=True)
            offset = {}
            for name in names:
                start = self.options.start.for_topic(name)
                if start == "earliest":
                    # What is stored now, as Kafka's source resolves `earliest` to offsets: an
                    # offset of -1:-1 later means that nothing was trimmed when the query began.
                    position = _first_unread(snapshot.view.topic(name))
                elif start == "latest":
                    info = snapshot.view.topic(name)
                    position = max(self._readable_end(snapshot, info), _first_unread(info))
                else:
                    position = start
                offset[name] = str(position)
        offset[_STARTS] = {name: offset[name] for name in names}
        return offset

    def latestOffset(self, start: dict, limit: ReadLimit | None = None) -> dict:
        """Every topic moved to just after what is readable now (never back), or, under a
        ReadMaxRows limit, by its share of that many entries."""
        begin, starts = _positions(start), _starts(start)
        with open_snapshot(self.options.path) as snapshot:
            # A topic no longer stored (deleted) leaves the offsets, as a deleted partition
            # leaves Kafka's: kept, the offsets of a pattern over topics that come and go
            # grew for good. `partitions` tells its deletion (failOnDataLoss) from the start
            # offset; one created again later is a new topic, read from its beginning.
            stored = set(snapshot.topic_names())
            end = {name: position for name, position in begin.items() if name in stored}
            infos = {}
            for name in self._topics(snapshot):
                if self._target is not None and name not in self._target:
                    continue                    # appeared after an AvailableNow query started
                infos[name] = info = snapshot.view.topic(name)
                readable = self._readable_end(snapshot, info)
                if self._target is not None:
                    readable = min(readable, self._target[name])
                end[name] = max(begin.get(name, Position.EARLIEST), readable)
            if isinstance(limit, ReadMaxRows):
                end.update(_rate_limited(infos, begin, end, limit.max_rows))
        # Where each topic's reading began: a topic that appeared since from its beginning, one
        # of a checkpoint written before starts were kept from where it is now.
        kept = {name: str(starts.get(name, begin.get(name, Position.EARLIEST))) for name in end}
        return {**{name: str(position) for name, position in end.items()}, _STARTS: kept}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, stop = _positions(start), _positions(end)
        # Where the query began reading each topic (failOnDataLoss: see StreamPartition).
        starts = _starts(end)
        for name, position in _starts(start).items():
            if name in starts and position != starts[name]:
                # A first micro-batch planned before a restart, its start asked of initialOffset
                # again (the source keeps none in the checkpoint): it begins where it began then
                # (its logged end kept it), not where `earliest`/`latest` resolve now.
                begin[name] = starts[name]
        with open_snapshot(self.options.path) as snapshot:
            stored = set(snapshot.topic_names())
            if self.options.fail_on_data_loss:
                # (a topic deleted before `latestOffset` is in `begin` only: see there)
                _check_no_data_lost(snapshot, stored, begin, {**dict.fromkeys(begin), **stop})
            ranges = {name: (begin.get(name, Position.EARLIEST), position) for name, position in stop.items()
                      if name in stored and begin.get(name, Position.EARLIEST) < position}
            state = snapshot.state(sorted(ranges)) if self.options.read_committed and ranges else None
            parts: list[InputPartition] = []
            for name, (first, after) in sorted(ranges.items()):
                topic_state = state.select([name]).to_bytes() if state is not None else None
                since = starts.get(name) if self.options.fail_on_data_loss else None
                parts += _plan(snapshot.view.topic(name), first, after, self.options.max_partition_entries,
                               topic_state, self._floor(name), since)
        return parts

    def _topics(self, snapshot: Snapshot, check_start: bool = False) -> list[str]:
        # A topic named exactly must be stored when the query begins; one deleted since is no
        # longer read (failOnDataLoss tells it), rather than failing every micro-batch for good.
        names = resolve_topics(self.options.topics, snapshot.topic_names(), patterns_may_match_none=True,
                               names_may_be_gone=not check_start)
        stray = sorted(set(self.options.start.per_topic) - set(names)) if check_start else []
        if stray:
            raise OptionError(f"startPosition names {', '.join(map(repr, stray))}, which is not among the topics "
                              "read: name a topic read, as stored (a partition, a segment)")
        return names

    def _floor(self, name: str) -> Position:
        """Where the query's reading of a topic began, as far as a chunked message completed in
        a micro-batch may have begun (`spark_udfs.chunks`): an explicit `startPosition`, else
        the topic's beginning (a `latest` start is not kept across restarts)."""
        start = self.options.start.for_topic(name)
        return start if isinstance(start, Position) else Position.EARLIEST

    def _readable_end(self, snapshot: Snapshot, info: TopicInfo) -> Position:
        """The position after the last one a reader of this isolation may read now."""
        last = info.last_position
        if self.options.read_committed:
            last = min(last, snapshot.topic_state(info).max_read_position)
        return last.next() if last != Position.EARLIEST else Position.EARLIEST

    # --- reading (in the workers) ----------------------------------------------------------

    def read(self, partition: StreamPartition) -> Iterator[pa.RecordBatch]:
        try:
            yield from read_partition(self.options, partition.state, partition)
        except FirstChunksTrimmedError as exc:
            _report_data_loss(str(exc))
        except PlannedEntriesGoneError as exc:
            # Trimmed (or the topic deleted) between planning and this task: Kafka's source
            # fails with failOnDataLoss, else skips what is gone (the rest of the batch is read).
            gone = (f"entries {partition.ledger_id}:{partition.first_entry}..{partition.ledger_id}:"
                    f"{partition.last_entry} of {partition.topic} were trimmed by retention (or the topic deleted) "
                    "after the micro-batch was planned, before its task read them")
            if self.options.fail_on_data_loss:
                _report_data_loss(gone)
            log.warning("%s: left out (failOnDataLoss is false)", gone)

    def commit(self, end: dict) -> None:
        """Nothing to release: the data dir is only read (its retention is the broker's)."""


# The key of an offset that holds, per topic, where the query began reading it (not a topic
# name: those have a domain, `persistent://...`).
_STARTS = "$starts"


def _positions(offset: Mapping) -> dict[str, Position]:
    """An offset as this reader wrote it; a checkpoint edited by hand fails clearly."""
    if not isinstance(offset, Mapping):
        raise OptionError(f"not an offset of the pyengine stream source: {offset!r}")
    positions = {}
    for name, text in offset.items():
        if name == _STARTS:
            continue
        position = parse_position(f"offset of {name}", text)
        if not isinstance(position, Position):
            raise OptionError(f"offset of {name} must be LEDGER:ENTRY, not {text!r}")
        positions[str(name)] = position
    return positions


def _starts(offset: Mapping) -> dict[str, Position]:
    """Where the query began reading each topic, as the offset keeps it (none in an offset of a
    checkpoint written before they were kept)."""
    starts = offset.get(_STARTS) if isinstance(offset, Mapping) else None
    if starts is None:
        return {}
    if not isinstance(starts, Mapping) or not all(isinstance(text, str) for text in starts.values()):
        raise OptionError(f"not an offset of the pyengine stream source: {offset!r}")
    positions = {}
    for name, text in starts.items():
        position = parse_position(f"start of {name}", text)
        if not isinstance(position, Position):
            raise OptionError(f"start of {name} must be LEDGER:ENTRY, not {text!r}")
        positions[str(name)] = position
    return positions


def _check_no_data_lost(snapshot: Snapshot, stored: set[str], begin: dict[str, Position],
                        stop: dict[str, Position]) -> None:
    """failOnDataLoss, as Spark's Kafka source checks it when it plans a micro-batch: fail when
    what the query was to read next is gone. A topic's offset (the next position to read) at or
    before the last position retention deleted lost the entries from there (whole ledgers go,
    oldest first; one fully read before its trim lost nothing). A topic read before and no longer
    stored was deleted, and one whose ledgers all come after its offset (ledger ids only grow)
    was deleted and created again: what it held after the offset may be lost. A topic that
    appeared since the last micro-batch (a pattern's) lost what was trimmed before it is read.
    An `earliest` offset reads what is left."""
    for name in sorted(stop):
        offset = begin.get(name)
        if name not in stored:
            if offset is not None:
                _report_data_loss(f"{name} was deleted after the query read it up to {offset}: what it held "
                                  "after that may be lost")
            continue
        info = snapshot.view.topic(name)
        trimmed = info.trimmed_through
        if offset is None:
            if trimmed is not None:
                _report_data_loss(f"{name} appeared after the query started, and its entries through {trimmed} "
                                  "were trimmed by retention before the query read them")
        elif offset == Position.EARLIEST:
            # Nothing was trimmed when the query began (`initialOffset`), nor when it last read.
            if trimmed is not None:
                _report_data_loss(f"the entries of {name} through {trimmed} were trimmed by retention before the "
                                  "query read them")
        elif trimmed is not None and offset <= trimmed:
            _report_data_loss(f"the entries of {name} from {offset} through {trimmed} were trimmed by retention "
                              "before the query read them")
        elif trimmed is None and info.ledgers and offset < Position(info.ledgers[0].ledger_id, 0):
            _report_data_loss(f"{name} holds nothing before ledger {info.ledgers[0].ledger_id} and its record notes no "
                              f"trim, yet the query was to read it from {offset}: it was deleted and created again "
                              "since (or trimmed by retention in a data dir written before pyengine recorded "
                              "trims), and what it held after that offset may be lost")


def _first_unread(info: TopicInfo) -> Position:
    """The offset of a query that reads `info` from its first entry left: just after what
    retention trimmed, else the beginning."""
    trimmed = info.trimmed_through
    return trimmed.next() if trimmed is not None else Position.EARLIEST


def _report_data_loss(what: str) -> None:
    raise DataDirChangedError(
        f"failOnDataLoss: {what}. Set failOnDataLoss to false to read on from what is left (this may be a "
        "false alarm for a topic deleted once it was read to its end)")


def _spans(info: TopicInfo, first: Position, after: Position) -> Iterator[tuple[int, int, int]]:
    """(ledger id, first entry, last entry) of the entries at `first` or after, before `after`."""
    for ledger in info.ledgers:
        lid = ledger.ledger_id
        if not ledger.entries or not first.ledger_id <= lid <= after.ledger_id:
            continue
        low = max(ledger.first_entry, first.entry_id if lid == first.ledger_id else -1)
        high = min(ledger.last_entry, after.entry_id - 1 if lid == after.ledger_id else ledger.last_entry)
        if low <= high:
            yield lid, low, high


def _rate_limited(infos: dict[str, TopicInfo], begin: dict[str, Position], end: dict[str, Position],
                  max_entries: int) -> dict[str, Position]:
    """The ends of the topics that have more than their share of `max_entries` to read, moved
    back to that share (as Kafka's maxOffsetsPerTrigger: in proportion to what each has, at
    least one entry each)."""
    available = {name: sum(high - low + 1 for _, low, high in _spans(info, begin.get(name, Position.EARLIEST),
                                                                     end[name]))
                 for name, info in infos.items()}
    total = sum(available.values())
    if total <= max_entries:
        return {}
    limited = {}
    for name, count in available.items():
        if not count:
            continue
        share = max(1, count * max_entries // total)
        if share >= count:
            continue
        for lid, low, high in _spans(infos[name], begin.get(name, Position.EARLIEST), end[name]):
            if share <= high - low + 1:
                limited[name] = Position(lid, low + share)     # after the share's last entry
                break
            share -= high - low + 1
    return limited


def _plan(info: TopicInfo, first: Position, after: Position, step: int, state: bytes | None,
          floor: Position, since: Position | None) -> list[InputPartition]:
    """Partitions of the entries at `first` or after and before `after`."""
    return [StreamPartition(info.name, info.topic_id, lid, chunk, min(high, chunk + step - 1), state, floor, since)
            for lid, low, high in _spans(info, first, after) for chunk in range(low, high + 1, step)]


__all__ = ["PyengineStreamReader", "StreamPartition"]
