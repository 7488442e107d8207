"""READ_COMMITTED as an Arrow UDF, for DataFrames the data source did not filter itself.

`committed_udf(state)` is a vectorised `arrow_udf` (Spark >= 4.1; never pandas): it receives
the position and transaction columns of a batch as `pyarrow` arrays and returns the
`visibility_mask` of the Rust kernel, computed over the Arrow buffers without a copy. The
`TxnState` is broadcast once (a Spark broadcast variable of its bytes); each Python worker
decodes it once, on the first batch it sees, and keeps it for every later batch and task.

`committed_filter(df, state)` keeps the rows a READ_COMMITTED consumer would receive: Spark
drops the marker rows itself (`is_marker <=> false`, pushed below the UDF), and the UDF gets the four
other columns. What the UDF costs is almost all Spark's JVM <-> Python Arrow exchange, so a
column less (a bit-packed bool, which also has to be unpacked in Python) is about a third
less time on cached rows.
`committed_rows(df, state, counts)` does the same as one `mapInArrow` pass that also counts
what it drops (markers, aborted, uncommitted) into Spark accumulators: the pipeline's export.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark import Accumulator
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.functions import arrow_udf
from pyspark.sql.types import BooleanType, DataType, LongType

from spark_udfs.schema import VISIBILITY_COLUMNS
from spark_udfs.source import _prepared
from spark_udfs.state import TxnState, flags_numpy

# The Spark types of the five visibility columns, in their order (the data source's schema).
_VISIBILITY_TYPES: tuple[DataType, ...] = (LongType(), LongType(), LongType(), LongType(), BooleanType())


class _Payload:
    """The state's bytes as the UDF closure holds them: a broadcast when there is a
    SparkContext to broadcast with (classic Spark), else inline in the pickled UDF."""

    def __init__(self, spark: SparkSession | None, raw: bytes) -> None:
        self._broadcast = None
        self._raw: bytes | None = raw
        context = getattr(spark, "sparkContext", None) if spark is not None else None
        if context is not None:
            self._broadcast = context.broadcast(raw)
            self._raw = None

    def value(self) -> bytes:
        return self._broadcast.value if self._broadcast is not None else self._raw

    def unpersist(self) -> None:
        if self._broadcast is not None:
            self._broadcast.unpersist()


def committed_udf(state: TxnState, spark: SparkSession | None = None):
    """The READ_COMMITTED test as an Arrow UDF of (ledger_id, entry_id, txnid_most,
    txnid_least, is_marker) -> boolean. `spark` defaults to the active session."""
    return _kernel_udf(state, spark, markers=True)


def _kernel_udf(state: TxnState, spark: SparkSession | None, *, markers: bool):
    """The Arrow UDF calling the kernel; without `markers` it takes the four columns but
    is_marker, for rows the caller has already kept to non-markers in Spark."""
    if not isinstance(state, TxnState):
        raise TypeError(f"state must be a TxnState (spark_udfs.capture_state), not {type(state).__name__}")
    payload = _Payload(spark if spark is not None else SparkSession.getActiveSession(), state.to_bytes())

    if markers:
        @arrow_udf(BooleanType())
        def read_committed(batches: Iterator[tuple[pa.Array, pa.Array, pa.Array, pa.Array, pa.Array]]
                           ) -> Iterator[pa.Array]:
            prepared = _prepared(payload.value())          # once per worker process, not per batch
            for columns in batches:
                yield prepared.mask(*columns)
    else:
        @arrow_udf(BooleanType())
        def read_committed(batches: Iterator[tuple[pa.Array, pa.Array, pa.Array, pa.Array]]) -> Iterator[pa.Array]:
            prepared = _prepared(payload.value())
            for columns in batches:
                yield prepared.mask(*columns, np.zeros(len(columns[0]), np.bool_))

    read_committed.payload = payload
    return read_committed


def committed_column(state: TxnState, columns: tuple[str, ...] = VISIBILITY_COLUMNS,
                     spark: SparkSession | None = None) -> Column:
    """A boolean Column: true for the rows a READ_COMMITTED consumer receives. `columns`
    names the five VISIBILITY_COLUMNS in their order; the result is `is_marker <=> false AND`
    the Arrow UDF of the other four (in a filter, Spark tests the marker flag first); never null."""
    if len(columns) != len(VISIBILITY_COLUMNS):
        raise ValueError(f"columns names the {len(VISIBILITY_COLUMNS)} visibility columns {VISIBILITY_COLUMNS}")
    *positions, is_marker = columns
    # `is_marker = false`, null-safe: a null flag may be a marker (never visible), and NOT null
    # would make the whole column null for that row, which neither a filter on the column nor
    # one on its negation keeps.
    return F.col(is_marker).eqNullSafe(False) & _kernel_udf(state, spark, markers=False)(*positions)


def committed_filter(df: DataFrame, state: TxnState, columns: tuple[str, ...] = VISIBILITY_COLUMNS) -> DataFrame:
    """The rows of `df` a READ_COMMITTED consumer receives. `df` holds rows of the data
    source's schema (read with `isolation=read_uncommitted`, or exported from it), or at
    least the five `columns` (ledger_id, entry_id, txnid_most, txnid_least, is_marker)."""
    _check_columns(df, columns, "committed_filter")
    return df.filter(committed_column(state, columns, df.sparkSession))


def _check_columns(df: DataFrame, columns: tuple[str, ...], caller: str) -> None:
    """The five visibility columns are there with the source's types: a clear error now
    rather than a failure inside a Python worker later."""
    if len(columns) != len(VISIBILITY_COLUMNS):
        raise ValueError(f"columns names the {len(VISIBILITY_COLUMNS)} visibility columns {VISIBILITY_COLUMNS}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"the DataFrame has no column(s) {missing}; {caller} reads {list(columns)}")
    for column, wanted in zip(columns, _VISIBILITY_TYPES):
        actual = df.schema[column].dataType
        if actual != wanted:
            raise TypeError(f"column {column!r} is {actual.simpleString()}, {caller} reads it as "
                            f"{wanted.simpleString()} (the data source's type): cast it first")


COUNTS = ("visible", "marker", "aborted", "uncommitted")


def committed_batches(state: TxnState | None, spark: SparkSession | None = None,
                      counts: dict[str, Accumulator] | None = None):
    """A `mapInArrow` function: each batch in, its READ_COMMITTED rows out (the same
    columns), adding to `counts` (accumulators named as COUNTS) how many rows were visible
    and why the others were dropped. With no state (READ_UNCOMMITTED) only markers drop."""
    if state is not None and not isinstance(state, TxnState):
        raise TypeError(f"state must be a TxnState (spark_udfs.capture_state) or None, not {type(state).__name__}")
    spark = spark if spark is not None else SparkSession.getActiveSession()
    payload = _Payload(spark, state.to_bytes()) if state is not None else None

    def keep_committed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        prepared = _prepared(payload.value()) if payload is not None else None
        for batch in batches:
            columns = [batch.column(name) for name in VISIBILITY_COLUMNS]
            if prepared is not None:
                visible, tally = prepared.classify(*columns)
            else:
                visible = ~flags_numpy(columns[-1])       # a null marker flag may be one
                tally = {"visible": int(visible.sum()), "marker": len(visible) - int(visible.sum())}
            for name, accumulator in (counts or {}).items():
                accumulator.add(tally.get(name, 0))
            if visible.all():
                yield batch
            elif visible.any():
                yield batch.filter(pa.array(visible))

    return keep_committed


def committed_rows(df: DataFrame, state: TxnState | None, counts: dict[str, Accumulator] | None = None
                   ) -> DataFrame:
    """`df`'s READ_COMMITTED rows (every non-marker row when `state` is None) in one
    `mapInArrow` pass, counting into `counts` (see `committed_batches`). `df` needs the
    five VISIBILITY_COLUMNS under their own names; its schema is kept."""
    _check_columns(df, VISIBILITY_COLUMNS, "committed_rows")
    return df.mapInArrow(committed_batches(state, df.sparkSession, counts), df.schema)


__all__ = ["COUNTS", "committed_batches", "committed_column", "committed_filter", "committed_rows", "committed_udf"]
