"""`spark.read.format("pyengine")`: a Python Data Source over a broker's data dir.

Planning (`DataSource.reader`, run by Spark in a Python planner process on the driver side)
opens the data dir read-only, takes one LMDB read snapshot of the chosen topics (ledger ranges,
last positions and, for READ_COMMITTED, each topic's transaction state), closes it again, and
plans one input partition per ledger (a ledger larger than `maxPartitionEntries` is split into
entry ranges). Everything a task reads is bounded by that snapshot's positions, so the result
is the data dir as it was when the query was planned, even while a broker keeps appending.
Entries planned and deleted before a task reads them (a retention trim, a topic deleted) fail
the task (DataDirChangedError) rather than leave rows out.

Reading (`read`, in a Python worker per task) opens the data dir read-only again in the
worker's own process, reads the partition's entries in chunks, and for READ_COMMITTED decides
visibility per entry with the Rust kernel (`visibility_mask` over the entry headers, with the
state planned on the driver and shipped inside the reader: decoded once per worker process),
then decodes only the visible entries into one row per message (`core_ext.records`; a
chunked message is put back together from its chunk entries, `spark_udfs.chunks`) and
yields `pyarrow.RecordBatch`es. Spark runs a Python data source's reads as an Arrow map
function (MapInArrow), so this is the Arrow filter fused into the scan: no row crosses into
the JVM to be dropped there.

Filter push-down (Spark >= 4.1 with `spark.sql.python.filterPushdown.enabled=true`, which
`spark_udfs.register` sets), with the option `filterPushdown=true` only: comparisons that
narrow what is read are taken over and honoured exactly by the source, so Spark does not
re-apply them:

* `topic`: `=`, `<=>`, `IN`, `STARTSWITH`, `ENDSWITH`, `CONTAINS`, `IS NOT NULL` -> only
  those topics are planned;
* `ledger_id`, `entry_id`: `=`, `<=>`, `<`, `<=`, `>`, `>=`, `IN`, `IS NOT NULL` -> only
  those ledgers, and only those entry ranges in each, are read (an `IN` on `entry_id` is
  checked per entry before decoding).

Everything else (negations, ORs, other columns) is left to Spark.

Without the option (the default) every filter is left to Spark and the plan never depends on a
query's filters. The reason is a flaw of Spark 4.3 (the pinned version): the plan made with
the pushed filters (the reader, its partitions) is stored on the loaded DataFrame's data
source, not on the scan, and every later scan of that DataFrame without filters Spark can push
(`df.count()` after `df.filter(...).count()`) reuses it, as do all scans of it in one query (a
union of two filtered views gets the last one's rows twice): rows silently lost or repeated.
(Spark's master keeps the plan per scan instead.)
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, bisect_right
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)
from pyspark.sql.types import StructType

from pyengine.storage.reader import ReadView, StoreReader, TopicInfo, TopicNotStoredError
from pyengine_kernels import Position
from spark_udfs.chunks import RangeChunks, chunks_of, earlier_chunks
from spark_udfs.options import OptionError, ReadOptions, parse_options, resolve_topics
from spark_udfs.schema import SCHEMA, record_batch
from spark_udfs.state import PreparedState, TxnState, open_snapshot

_MIN_CHUNK, _MAX_CHUNK, _FIRST_CHUNK = 16, 65536, 1024
_LOOK_BACK_ENTRIES = 64             # entries read at a time looking back for first chunks (up to MBs each)
_READ_BYTES = 64 << 20              # and about this many bytes of stored entries (large messages, chunks)
_MESSAGE_ROWS_BYTES = 64 << 20      # chunked messages decoded together, by stored size
_INT64_MAX = (1 << 63) - 1


class LedgerPartition(InputPartition):
    """Entries `first_entry..last_entry` (inclusive) of one ledger of one topic. `floor`: the
    read's start in that topic, which a chunked message completed in this range may begin at
    or after (see `spark_udfs.chunks`). `first_stored`: the first entry at or after `floor`
    stored when planned (None: not known), which a look-back for first chunks needs still there."""

    def __init__(self, topic: str, topic_id: int, ledger_id: int, first_entry: int, last_entry: int,
                 floor: Position = Position.EARLIEST, first_stored: Position | None = None) -> None:
        super().__init__((topic, ledger_id, first_entry, last_entry))
        self.topic = topic
        self.topic_id = topic_id
        self.ledger_id = ledger_id
        self.first_entry = first_entry
        self.last_entry = last_entry
        self.floor = (floor.ledger_id, floor.entry_id)
        self.first_stored = (first_stored.ledger_id, first_stored.entry_id) if first_stored is not None else None


def first_stored(info: TopicInfo, floor: Position) -> Position | None:
    """The first entry of the topic at or after `floor` (None: none is stored)."""
    for ledger in info.ledgers:
        if ledger.entries and ledger.last >= floor:
            return max(ledger.first, floor)         # entries of a ledger are contiguous
    return None


class PyengineDataSource(DataSource):
    """The `pyengine` format: see the module doc and `spark_udfs.options` for the options."""

    @classmethod
    def name(cls) -> str:
        return "pyengine"

    def schema(self) -> StructType:
        parse_options(self.options)        # bad options fail at load(), before any planning
        return SCHEMA

    def reader(self, schema: StructType) -> PyengineReader:
        _check_schema(schema)
        options = parse_options(self.options)
        if options.max_entries_per_trigger is not None:
            raise OptionError("maxEntriesPerTrigger applies to streams (spark.readStream), not to batch reads")
        return PyengineReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """`spark.readStream.format("pyengine")`: see `spark_udfs.stream`."""
        from spark_udfs.stream import PyengineStreamReader

        _check_schema(schema)
        return PyengineStreamReader(parse_options(self.options))


def _check_schema(schema: StructType) -> None:
    # Types and nullability too: Spark checks every batch a task yields against the schema it
    # was given, so one differing anywhere but in names failed each task with its traceback.
    if [(f.name, f.dataType, f.nullable) for f in schema.fields] != [(f.name, f.dataType, f.nullable)
                                                                    for f in SCHEMA.fields]:
        raise OptionError("the pyengine data source has a fixed schema (spark_udfs.SCHEMA): "
                          "select columns after load() instead of passing a schema")


class _Bounds:
    """Closed integer interval plus an optional exact set, from pushed comparisons."""

    def __init__(self) -> None:
        self.low, self.high = -1, _INT64_MAX
        self.values: frozenset[int] | None = None
        self.ordered: tuple[int, ...] = ()             # the values, sorted

    def push(self, flt: Filter) -> bool:
        if isinstance(flt, IsNotNull):
            return True
        if isinstance(flt, In):
            values = [v for v in flt.value]
            if not values or not all(_is_int(v) for v in values):
                return False
            self.values = frozenset(values) if self.values is None else self.values & frozenset(values)
            self.ordered = tuple(sorted(self.values))
            return True
        value = getattr(flt, "value", None)
        if not _is_int(value):
            return False
        if isinstance(flt, (EqualTo, EqualNullSafe)):
            self.low, self.high = max(self.low, value), min(self.high, value)
        elif isinstance(flt, GreaterThan):
            self.low = max(self.low, value + 1)
        elif isinstance(flt, GreaterThanOrEqual):
            self.low = max(self.low, value)
        elif isinstance(flt, LessThan):
            self.high = min(self.high, value - 1)
        elif isinstance(flt, LessThanOrEqual):
            self.high = min(self.high, value)
        else:
            return False
        return True

    def clip(self, low: int, high: int) -> tuple[int, int] | None:
        """The smallest part of `low..high` holding every value admitted in it (None: none is)."""
        low, high = max(low, self.low), min(high, self.high)
        if self.values is not None:
            inside = self.ordered[bisect_left(self.ordered, low):bisect_right(self.ordered, high)]
            if not inside:
                return None
            low, high = inside[0], inside[-1]
        return (low, high) if low <= high else None

    def admits(self, value: int) -> bool:
        return self.low <= value <= self.high and (self.values is None or value in self.values)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class PyengineReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.ledger_bounds = _Bounds()
        self.entry_bounds = _Bounds()
        with open_snapshot(options.path) as snapshot:
            names = resolve_topics(options.topics, snapshot.topic_names())
            for option, spec in (("startPosition", options.start), ("endPosition", options.end)):
                stray = sorted(set(spec.per_topic) - set(names))
                if stray:
                    shown = ", ".join(names[:5]) + (f", ... ({len(names)} topics)" if len(names) > 5 else "")
                    raise OptionError(f"{option} names {', '.join(map(repr, stray))}, which is not among the topics "
                                      f"read ({shown}): name a topic read, as stored (a partition, a segment)")
            self.topics: dict[str, TopicInfo] = {name: snapshot.view.topic(name) for name in names}
            if options.fail_on_data_loss:
                for info in self.topics.values():
                    _check_no_data_lost(info, options.start.for_topic(info.name))
            state = snapshot.state(names) if options.read_committed else None
        # Shipped to every task inside this reader (pickled once with the plan); each worker
        # process decodes it once.
        self.state = state.to_bytes() if state is not None else None
        self.horizons = {name: s.max_read_position for name, s in state.topics.items()} if state else {}

    # --- planning ---------------------------------------------------------------------------

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        if not self.options.filter_pushdown:
            yield from filters            # see the module doc: Spark would reuse this plan elsewhere
            return
        for flt in filters:
            # Not (and any filter over several columns) has no single attribute: Spark keeps it.
            attribute = getattr(flt, "attribute", ())
            column = attribute[0] if len(attribute) == 1 else None
            if column == "topic" and self._push_topic(flt):
                continue
            if column == "ledger_id" and self.ledger_bounds.push(flt):
                continue
            if column == "entry_id" and self.entry_bounds.push(flt):
                continue
            yield flt

    def _push_topic(self, flt: Filter) -> bool:
        if isinstance(flt, IsNotNull):
            return True
        if isinstance(flt, In):
            wanted = set(flt.value)
            keep = lambda name: name in wanted  # noqa: E731
        elif isinstance(flt, (EqualTo, EqualNullSafe)):
            keep = lambda name: name == flt.value  # noqa: E731
        elif isinstance(flt, StringStartsWith):
            keep = lambda name: name.startswith(flt.value)  # noqa: E731
        elif isinstance(flt, StringEndsWith):
            keep = lambda name: name.endswith(flt.value)  # noqa: E731
        elif isinstance(flt, StringContains):
            keep = lambda name: flt.value in name  # noqa: E731
        else:
            return False
        self.topics = {name: info for name, info in self.topics.items() if keep(name)}
        return True

    def _range(self, info: TopicInfo) -> tuple[Position, Position]:
        """The positions to read of a topic, both inclusive (start > end: nothing)."""
        last = info.last_position
        start = self.options.start.for_topic(info.name)
        end = self.options.end.for_topic(info.name)
        start = Position.EARLIEST if start == "earliest" else last.next() if start == "latest" else start
        end = last if end == "latest" else min(end, last)
        if info.name in self.horizons:
            end = min(end, self.horizons[info.name])      # nothing after the horizon is visible
        return start, end

    def partitions(self) -> list[InputPartition]:
        """One partition per ledger holding entries to read, or one per `maxPartitionEntries`
        of them; each cut to the entries the pushed `entry_id` comparisons admit (a range
        admitting none of an `IN` list's values is not planned)."""
        parts: list[InputPartition] = []
        step = self.options.max_partition_entries
        for info in self.topics.values():
            start, end = self._range(info)
            stored = first_stored(info, start)
            for ledger in info.ledgers:
                lid = ledger.ledger_id
                if not ledger.entries or not start.ledger_id <= lid <= end.ledger_id:
                    continue
                first = max(ledger.first_entry, start.entry_id if lid == start.ledger_id else -1)
                last = min(ledger.last_entry, end.entry_id if lid == end.ledger_id else _INT64_MAX)
                span = self.entry_bounds.clip(first, last)
                if span is None or not self.ledger_bounds.admits(lid):
                    continue
                first, last = span
                for chunk_first in range(first, last + 1, step):
                    chunk = self.entry_bounds.clip(chunk_first, min(last, chunk_first + step - 1))
                    if chunk is not None:
                        parts.append(LedgerPartition(info.name, info.topic_id, lid, *chunk, floor=start,
                                                     first_stored=stored))
        return parts

    # --- reading (in the workers) -----------------------------------------------------------

    def read(self, partition: LedgerPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, LedgerPartition):
            # Nothing planned: PySpark reads one placeholder partition of its own (no rows).
            return
        wanted_entries = self.entry_bounds.values
        entry_set = np.fromiter(wanted_entries, np.int64) if wanted_entries is not None else None
        yield from read_partition(self.options, self.state, partition, entry_set)


def _trimmed_through(view: ReadView, topic: str) -> Position | None:
    """How far retention trimmed `topic` as `view` reads it (deleted: as far as can be)."""
    try:
        return view.topic(topic).trimmed_through
    except TopicNotStoredError:
        return Position(2**63 - 1, 2**63 - 1)


class DataDirChangedError(RuntimeError):
    """Entries a query planned were deleted before a task read them."""


class FirstChunksTrimmedError(DataDirChangedError):
    """A chunked message read in a stream's partition began in entries of the topic that
    retention trimmed after the query began reading it (see StreamPartition)."""


class PlannedEntriesGoneError(DataDirChangedError):
    """The entries of a partition were deleted between planning and its task, which read none
    of them (whole ledgers go, and a task reads its ledger in one read snapshot)."""


def _check_no_data_lost(info: TopicInfo, start: Position | str) -> None:
    """failOnDataLoss: an explicit start before the first entry still stored (none stored:
    before the topic's current ledger) is one whose entries were trimmed since (whole ledgers,
    oldest first) or the topic deleted; read from there, they would silently be left out."""
    if not isinstance(start, Position):
        return
    first = info.first_position
    if start < (first if first is not None else info.last_position):
        left = (f"its first entry left ({first})" if first is not None
                else f"its current ledger ({info.last_position.ledger_id}; it holds no entry now)")
        raise DataDirChangedError(
            f"failOnDataLoss: startPosition {start} of {info.name} is before {left}: the entries from there on were "
            "trimmed by retention (or the topic deleted) and would be left out (failOnDataLoss=false reads what "
            "is left)")


def read_partition(options: ReadOptions, state: bytes | None, partition: LedgerPartition,
                   entry_set: np.ndarray | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of `partition` (in a worker): READ_COMMITTED decided per entry with `state`
    (a TxnState's bytes covering the partition's topic), or every message (read_uncommitted);
    `entry_set`: only these entry ids. A chunked message is one row, at its last chunk
    (`spark_udfs.chunks`)."""
    from core_ext.records import ChunkTooLargeError, chunk_indices, decode_entries, entry_headers

    prepared = _prepared(state) if state is not None else None

    def visible(ledger_ids: np.ndarray, entry_ids: np.ndarray, headers: tuple) -> np.ndarray | None:
        """What the reader may see of these entries (None: all), before any entry filter."""
        marker, most, least, _count, _publish = headers
        if prepared is not None:
            return prepared.topic_mask(partition.topic, ledger_ids, entry_ids, most, least, marker != 0)
        return None if options.include_markers else marker == 0

    start = Position(partition.ledger_id, partition.first_entry)
    end = Position(partition.ledger_id, partition.last_entry)
    target = options.max_batch_rows
    chunk = min(_FIRST_CHUNK, target)
    most_entries = _MAX_CHUNK         # lowered when a chunk decompresses past a column's 2 GiB
    pieces: RangeChunks | None = None
    with StoreReader(options.path) as store, store.view() as view:
        position = start
        while position <= end:
            raw = next(view.iter_raw(partition.topic_id, position, end, chunk, _READ_BYTES), None)
            if raw is None or raw[0][0] != position.ledger_id or raw[1][0] != position.entry_id:
                # Entries of a ledger are contiguous, and the plan saw these: they were deleted
                # since (a retention trim, the topic deleted). Read without them, the result
                # would silently be the data dir as it never was.
                raise (PlannedEntriesGoneError if position == start else DataDirChangedError)(
                    f"entries {position}..{end} of {partition.topic} were planned but are gone (trimmed by "
                    "retention, or the topic deleted, since the query was planned): plan it again (a new "
                    "DataFrame)")
            ledgers, entries, values = raw
            ledger_ids = np.array(ledgers, dtype=np.int64)
            entry_ids = np.array(entries, dtype=np.int64)
            headers = entry_headers(values)
            seen = visible(ledger_ids, entry_ids, headers)
            keep = seen
            if entry_set is not None:
                in_set = np.isin(entry_ids, entry_set)
                keep = in_set if keep is None else keep & in_set
            chunk_entries = np.empty(0, np.int64)
            if keep is None or keep.any():
                try:
                    columns = decode_entries(ledger_ids, entry_ids, values, keep)
                except ChunkTooLargeError:
                    if len(values) == 1:
                        raise
                    # Chunks go by messages, and compressed payloads grow when decoded: read
                    # this one again in halves, and no chunk of the partition as large again.
                    chunk = most_entries = max(1, len(values) // 2)
                    continue
                if columns["rows"]:
                    yield record_batch(partition.topic, columns)
                chunk_entries = columns["chunks"]
            if entry_set is not None:
                # A chunk outside the entry filter may still belong to a message whose last
                # chunk is inside it.
                outside = ~in_set if seen is None else seen & ~in_set
                if outside.any():
                    chunk_entries = np.sort(np.concatenate(
                        [chunk_entries, chunk_indices(ledger_ids, entry_ids, values, outside)]))
            if len(chunk_entries):
                if pieces is None:
                    pieces = RangeChunks()
                done = [pieces.add(piece) for piece in chunks_of(ledgers, entries, values, chunk_entries)]
                yield from _message_rows(partition.topic, [d for d in done if d is not None], entry_set)
            position = Position(ledgers[-1], entries[-1]).next()
            messages = max(1, int(headers[3].sum()))
            chunk = max(min(_MIN_CHUNK, most_entries), min(most_entries, len(values) * target // messages))
        if pieces is not None:
            floor = Position(*partition.floor)

            def look_back(uuids: set[str]) -> dict:
                found = earlier_chunks(view.iter_raw_before(partition.topic_id, start, floor, _LOOK_BACK_ENTRIES,
                                                            _READ_BYTES),
                                       lambda lids, eids, vals: visible(np.array(lids, dtype=np.int64),
                                                                        np.array(eids, dtype=np.int64),
                                                                        entry_headers(vals)),
                                       uuids)
                if len(found) < len(uuids) and partition.first_stored is not None:
                    # A first chunk not found may be one trimmed since planning (only whole
                    # ledgers are, oldest first): then the planned first entry is gone too,
                    # and leaving the message out would be the data dir as it never was.
                    kept = Position(*partition.first_stored)
                    if next(view.iter_raw(partition.topic_id, kept, kept, 1), None) is None:
                        raise DataDirChangedError(
                            f"entries of {partition.topic} from {kept} on, before {start}, were planned but are "
                            "gone (trimmed by retention, or the topic deleted, since the query was planned), and "
                            "a chunked message read here began in them: plan it again (a new DataFrame)")
                since = getattr(partition, "first_chunks_since", None)
                if len(found) < len(uuids) and since is not None:
                    trimmed = _trimmed_through(view, partition.topic)
                    if trimmed is not None and trimmed >= Position(*since):
                        raise FirstChunksTrimmedError(
                            f"a chunked message of {partition.topic} whose last chunk is at or after {start} began "
                            f"in entries trimmed by retention (through {trimmed}) after the query began reading "
                            f"the topic at {Position(*since)}, before the message came whole (or it began before "
                            "the query did)")
                return found

            yield from _message_rows(partition.topic, pieces.finish(look_back), entry_set)


def _message_rows(topic: str, messages: list, entry_set: np.ndarray | None) -> Iterator[pa.RecordBatch]:
    """The rows of chunked messages put back together (`RangeChunks`): one per message, at its
    last chunk; with `entry_set`, only those whose last chunk is in it. Large messages are
    decoded a few at a time (a column of one call stays under 2 GiB)."""
    from core_ext.records import decode_entries

    if entry_set is not None:
        messages = [m for m in messages if m[0].entry_id in entry_set]
    group: list = []
    size = 0
    for index, message in enumerate(messages):
        group.append(message)
        size += len(message[1])
        if size < _MESSAGE_ROWS_BYTES and index < len(messages) - 1:
            continue
        columns = decode_entries(np.array([last.ledger_id for last, _ in group], dtype=np.int64),
                                 np.array([last.entry_id for last, _ in group], dtype=np.int64),
                                 [entry for _, entry in group])
        yield record_batch(topic, columns)
        group, size = [], 0


_PREPARED: dict[bytes, PreparedState] = {}


def _prepared(raw: bytes) -> PreparedState:
    """The state decoded once per worker process (a reused worker keeps it across tasks)."""
    key = hashlib.blake2b(raw, digest_size=16).digest()
    prepared = _PREPARED.get(key)
    if prepared is None:
        if len(_PREPARED) >= 8:
            _PREPARED.pop(next(iter(_PREPARED)))
        prepared = _PREPARED[key] = PreparedState(TxnState.from_bytes(raw))
    return prepared


__all__ = ["LedgerPartition", "PyengineDataSource", "PyengineReader", "read_partition"]
