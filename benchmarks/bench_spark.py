"""Spark pipeline benchmarks: READ_COMMITTED on >= 10M rows in `local[2]`, same data, same run.

The data dir is generated once per run by `write_synthetic_data_dir`: entries written with the
storage layer directly (LMDB, in the real stored format: entry header, CRC32C-checked Pulsar
metadata, batch payloads, commit/abort markers, a transaction-buffer snapshot), not through
the broker's send path, which would take minutes for 10M messages.
"""

from __future__ import annotations

import functools
import os
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from benchmarks.figures import Figure, speedup
from core_ext.batch import build_batch
from core_ext.poskeys import pack_i64, pack_position
from pyengine.protocol.commands import message_metadata
from pyengine.protocol.pulsar_api_pb2 import KeyValue, SingleMessageMetadata
from pyengine.storage.entry import HEADER, HEADER_VERSION, MARKER_TXN_ABORT, MARKER_TXN_COMMIT, headers_and_payload
from pyengine.storage.environment import StorageEnvironment
from pyengine.storage.records_pb2 import LedgerRecord, TopicRecord
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer.ended import EndedTxns
from pyengine.transaction.buffer.markers import marker_entry
from pyengine.transaction.buffer.snapshot import TransactionBufferSnapshot
from pyengine.transaction.buffer.topic_buffer import TXN_PROPERTY
from pyengine_kernels import AbortedTxnSet, OngoingTxnMap, Position, TxnId

QUICK = os.environ.get("PYENGINE_BENCH_QUICK") == "1"
TOPICS = ("persistent://public/default/bench-orders", "persistent://public/default/bench-payments")
ENTRIES_PER_LEDGER = 50_000       # ManagedLedgerConfig's default roll-over


# --- the synthetic data dir -----------------------------------------------------------------

def outer_metadata(producer: bytes, sequence_id: int, publish_time: int, *, batch: int = 0, key: bytes | None = None,
                   txn: tuple[int, int] | None = None) -> bytes:
    """A serialised Pulsar MessageMetadata of a stored message (or batch)."""
    fields: dict = {}
    if key is not None:
        fields["partition_key"] = key.decode()
    if batch:
        fields["num_messages_in_batch"] = batch
    if txn is not None:
        fields.update(txnid_most_bits=txn[0], txnid_least_bits=txn[1])
    return message_metadata(producer.decode(), sequence_id, publish_time, **fields).SerializeToString()


@dataclass
class SyntheticStats:
    rows: int = 0
    entries: int = 0
    markers: int = 0
    committed_txns: int = 0
    aborted_txns: int = 0
    open_txns: int = 0


def write_synthetic_data_dir(path: Path, rows: int, topics: tuple[str, ...] = TOPICS, seed: int = 5,
                             entries_per_ledger: int = ENTRIES_PER_LEDGER) -> SyntheticStats:
    """A data dir of `topics` holding about `rows` messages in all, shaped like busy
    transactional topics: 9 in 10 entries are batches of 1..19 messages (keys, some with
    properties), 1 in 10 a single message; ~40% of entries belong to transactions (up to 4 open
    at a time per topic, 1..8 entries each), 1 txn in 5 is aborted, each txn ends with its
    commit/abort marker; the last few txns of each topic stay open (the read horizon stops
    before the first of them, near the end). A transaction-buffer snapshot is stored as the
    broker would have taken it."""
    rng = np.random.default_rng(seed)
    stats = SyntheticStats()
    producer = b"bench-producer"
    body = bytes(rng.integers(32, 127, 64, dtype=np.uint8))
    templates: dict[tuple[int, int], bytes] = {}

    def batch_payload(size: int, variant: int) -> bytes:
        payload = templates.get((size, variant))
        if payload is None:
            singles = []
            for j in range(size):
                single = SingleMessageMetadata(payload_size=24 + (j * 7 + variant) % 40,
                                               partition_key=f"customer-{(variant * 31 + j) % 997}")
                if (variant + j) % 5 == 0:
                    single.properties.append(KeyValue(key="region", value=f"r{j % 3}"))
                singles.append((single.SerializeToString(), body[:single.payload_size]))
            payload = templates[(size, variant)] = build_batch(singles)
        return payload

    env = StorageEnvironment(path, sync=False)
    try:
        meta, topics_db, ledgers_db, entries_db = (env.db(n) for n in ("meta", "topics", "ledgers", "entries"))
        snapshots_db = env.db("tb_snapshots")
        next_ledger = 0
        coordinator_seq = [0] * 16
        per_topic_rows = rows // len(topics)
        for topic_index, topic in enumerate(topics):
            topic_id = topic_index + 1
            prefix = pack_i64(topic_id)
            ongoing = OngoingTxnMap()
            open_txns: list[TxnId] = []
            aborted = AbortedTxnSet()
            ended = EndedTxns()
            remaining_entries: dict[TxnId, int] = {}
            items: list[tuple[bytes, bytes]] = []
            ledger_records: list[LedgerRecord] = []
            next_ledger += 1
            ledger, entry = next_ledger, 0
            topic_rows = 0
            sequence = 0
            publish = 1_700_000_000_000
            closing = False
            choices = rng.random(4 * per_topic_rows // 8 + 1024)
            sizes = rng.integers(1, 20, choices.size)
            variants = rng.integers(0, 64, choices.size)
            k = 0

            def append(value: bytes) -> Position:
                nonlocal ledger, entry, next_ledger
                if entry == entries_per_ledger:
                    ledger_records.append(LedgerRecord(ledger_id=ledger, last_entry_id=entry - 1, entries=entry,
                                                       closed=True))
                    next_ledger += 1
                    ledger, entry = next_ledger, 0
                position = Position(ledger, entry)
                items.append((prefix + pack_position(ledger, entry), value))
                entry += 1
                return position

            while True:
                if k >= choices.size:
                    k = 0
                r, size, variant = choices[k], int(sizes[k]), int(variants[k])
                k += 1
                closing = closing or topic_rows >= per_topic_rows * 0.995
                if topic_rows >= per_topic_rows:
                    break
                txn = None
                if not closing and len(open_txns) < 4 and r < 0.08:
                    coordinator = int(variant % 16)
                    txn = TxnId(coordinator, coordinator_seq[coordinator])
                    coordinator_seq[coordinator] += 1
                    open_txns.append(txn)
                    remaining_entries[txn] = 1 + variant % 8
                elif open_txns and r < 0.40:
                    txn = open_txns[variant % len(open_txns)]
                if txn is not None and remaining_entries[txn] == 0 and not closing:
                    # The txn wrote all its entries: end it with its marker.
                    open_txns.remove(txn)
                    del remaining_entries[txn]
                    action = TxnAction.ABORT if variant % 5 == 0 else TxnAction.COMMIT
                    data, marker_type, _ = marker_entry(action, txn, publish)
                    position = append(HEADER.pack(HEADER_VERSION, 0, marker_type, txn.most_bits, txn.least_bits, 1,
                                                  publish) + data)
                    ongoing.remove(txn)
                    ended.add(txn, action)
                    if action is TxnAction.ABORT:
                        aborted.add(txn, position)
                        stats.aborted_txns += 1
                    else:
                        stats.committed_txns += 1
                    stats.markers += 1
                    continue
                publish += 1 if r < 0.5 else 0
                batched = variant % 10 != 0
                count = size if batched else 1
                if batched:
                    metadata = outer_metadata(producer, sequence, publish, batch=size,
                                              txn=(txn.most_bits, txn.least_bits) if txn else None)
                    payload = batch_payload(size, variant)
                else:
                    metadata = outer_metadata(producer, sequence, publish, key=b"customer-%d" % variant,
                                              txn=(txn.most_bits, txn.least_bits) if txn else None)
                    payload = body[:32]
                sequence += count
                most, least = (txn.most_bits, txn.least_bits) if txn else (-1, -1)
                position = append(HEADER.pack(HEADER_VERSION, 0, 0, most, least, count, publish)
                                  + headers_and_payload(metadata, payload))
                if txn is not None:
                    ongoing.add(txn, position)
                    remaining_entries[txn] = max(0, remaining_entries[txn] - 1)
                topic_rows += count
            last = Position(ledger, entry - 1)
            ledger_records.append(LedgerRecord(ledger_id=ledger, last_entry_id=entry - 1, entries=entry, closed=True))
            horizon = ongoing.max_read_position(last)
            snapshot = TransactionBufferSnapshot(horizon, aborted, ended,
                                                 int(time.time() * 1000))
            record = TopicRecord(topic_id=topic_id, name=topic, created_ms=int(time.time() * 1000),
                                 properties={TXN_PROPERTY: "true"})
            stats.rows += topic_rows
            stats.entries += len(items)
            stats.open_txns += len(open_txns)

            def write(txn, items=items, record=record, ledger_records=ledger_records, prefix=prefix,
                      snapshot=snapshot, topic=topic):
                consumed, added = txn.cursor(db=entries_db).putmulti(items, append=True)
                assert added == len(items), "entries must be written in key order"
                txn.put(topic.encode(), record.SerializeToString(), db=topics_db)
                for ledger_record in ledger_records:
                    txn.put(prefix + pack_i64(ledger_record.ledger_id), ledger_record.SerializeToString(),
                            db=ledgers_db)
                txn.put(prefix, snapshot.encode(), db=snapshots_db)

            env.write_now(write)
        counters = {b"counter/topic": len(topics), b"counter/ledger": next_ledger}
        env.write_now(lambda txn: [txn.put(key, struct.pack(">q", value), db=meta) for key, value in counters.items()])
    finally:
        env.close()
    return stats


# --- the benchmarks ---------------------------------------------------------------------------

NOTES = """
Data: a synthetic data dir of two transactional topics written in the stored format
(`write_synthetic_data_dir`): 9 in 10 entries batches of 1..19 messages, ~40% of entries in
transactions, 1 in 5 transactions aborted, a few left open at the end; ~7.6% of the stored rows
are not READ_COMMITTED-visible. Spark `local[2]`, one session; every figure comes from the same
run on the same data (the whole data dir, or all its stored rows).

`arrow_udf_vs_spark_sql` is the user's path from the data dir: `spark.read.format("pyengine")`
READ_COMMITTED (the reader is planned by Spark as an Arrow map; the Rust kernel decides
visibility per entry from the headers with the state captured on the driver, and only visible
entries are decoded) against reading every stored row with the same source
(`isolation=read_uncommitted, includeMarkers=true`) and filtering it with the best pure Spark
SQL formulation: `NOT is_marker`, the position predicate against each topic's horizon (topics
told apart by their ledger ids) and a broadcast left-anti join against the aborted txns;
`count()` of both.

The filter-only figures start from every stored row's five visibility columns cached in Spark's
memory, `count()` of the filtered rows: ours is `committed_filter` (`NOT is_marker`, which Spark
pushes below the UDF, and a SCALAR_ITER `arrow_udf` of the four other columns calling the Rust
`visibility_mask` over the Arrow buffers, the state broadcast once). On cached
rows the Spark SQL formulation (whole-stage code-generated, no Python) is faster than any
Python UDF: `filter_arrow_udf_vs_spark_sql` is well below 1. The time of our UDF is almost all
Spark's JVM <-> Python Arrow exchange (the kernel itself filters 10M rows in a few ms, see the
kernels suite), which is also why the gap to row-at-a-time Python UDFs is a few times and not
the 20x of the kernel alone: `python_udf` is a classic pickled row-at-a-time UDF
(`useArrow=False`), `arrow_udf_vs_python_udf_arrow_batched` the same function with Spark 4.3's
Arrow-batched transport (still one Python call per row).
Sizes: 10,074,292 stored rows (markers included), 9,310,089 READ_COMMITTED-visible. The run
recorded here had the machine to itself (an earlier one, at load ~8, read 150k rows/s and gave
3.15 / 1.37 for the two ratios: the absolute figures move with the load much more than the
ratios).

Why `arrow_udf_vs_python_udf` stays far from 20: the floor is Spark's exchange, not our code.
Probe on 4M cached rows, same session, best of 3-4 after warm-up (load ~2-4): a do-nothing
`arrow_udf` of ONE column 1.27 s, of the five columns 1.68 s; ours with the five columns 2.2 s,
ours as now (markers tested in Spark, four columns to Python: the bit-packed bool column cost
its transfer and an unpack per batch) 1.42-1.55 s; the row-at-a-time Python UDF 4.4-5.6 s
(the same 4.4 s when it too gets `NOT is_marker` in Spark and four arguments). So even a
one-column no-op is only ~4x faster than the Python UDF here. Tried without effect:
`maxRecordsPerBatch` 65536 / 100000 / 262144 / 1M (within noise once the JVM is warm; an
apparent 1.5x for 100000 was JIT warm-up of the first config measured);
`spark.sql.execution.arrow.pythonUDF.columnarInput.enabled` (applies only to Arrow-backed
columnar input: the default cache is not); Spark 4.3's `ArrowCachedBatchSerializer` as
`spark.sql.cache.serializer`, which would feed cached Arrow batches to the UDF, fails in 4.3.0
(IndexOutOfBoundsException reading a validity buffer, even for a no-op `arrow_udf`).
Later probe (4M stored rows, same session, best of 3 after a warm-up, 2026-11-25): the fixed
cost per Spark task is a large part of an Arrow UDF's time on cached rows. A do-nothing
one-column `arrow_udf` took 0.50 s over the rows in 2 partitions, 0.87 s in the source's 10
(one per ledger of 50k entries; 10M rows make ~22) and 1.58 s in 40: ~35-40 ms per task. Ours
took 0.52-0.60 s, 0.76-0.97 s and 1.56 s; the row-at-a-time Python UDF 1.83 s in 2 partitions
and 2.11 s in 10 (3.1-3.5x and 2.2-2.8x). Reading through the source costs ~57 ms per task the
same way (1.87 s in 10 partitions, 2.51 s in 38, 4.31 s in 96). Packing several ledgers into one
input partition, as Spark's file sources pack small files, would take some of that off both
the source and the filter, but not the exchange: a ratio near 20 is out of reach either way.
Probe at the benchmark's own size (2026-11-25, late: 10,074,292 stored rows cached in the
source's 24 partitions, `local[2]`, best of 2 after a warm-up): a do-nothing one-column
`arrow_udf` filter 1.93 s, ours (`committed_filter`) 1.95 s, the row-at-a-time Python UDF
5.06 s. The baseline is 2.62x slower than an Arrow UDF that does nothing at all, and ours costs
what the no-op costs: the kernel's share is below the noise, and no Arrow UDF, whatever it
computes, can be 20x faster than this baseline on this machine with Spark 4.3.
"""

FULL_ROWS = 10_000_000
QUICK_ROWS = 200_000
ROWS_RUN = QUICK_ROWS if QUICK else FULL_ROWS
# A full run takes minutes per test on a loaded 2-core machine (the suite's default is 300 s).
pytestmark = pytest.mark.timeout(3600)


FIGURES: list[Figure] = [
    speedup("arrow_udf_vs_python_udf", "test_arrow_udf_filter", "test_python_udf_filter",
            "filter on cached rows: our Arrow UDF (Rust kernel) vs a row-at-a-time Python UDF (pickled)", 20),
    speedup("arrow_udf_vs_spark_sql", "test_source_read_committed", "test_source_raw_then_spark_sql",
            "from the data dir: READ_COMMITTED source (Arrow read + Rust kernel) vs raw rows + Spark SQL "
            "(broadcast anti-join, horizon predicate)", 1.0),
    Figure("source_rows_per_s", "rows per second read by the pyengine data source into Spark (count(), "
           "READ_COMMITTED, local[2])", lambda t: 1 / t["test_source_read_committed"], "rows/s"),
    speedup("filter_arrow_udf_vs_spark_sql", "test_arrow_udf_filter", "test_spark_sql_filter",
            "filter only, on cached rows: our Arrow UDF vs the Spark SQL formulation (report)"),
    speedup("arrow_udf_vs_python_udf_arrow_batched", "test_arrow_udf_filter", "test_python_udf_arrow_batched",
            "filter on cached rows: our Arrow UDF vs the row-at-a-time Python UDF with Arrow transport (report)"),
]


@functools.cache
def data_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="pyengine-bench-spark-"))
    write_synthetic_data_dir(path, ROWS_RUN)
    return path


@functools.cache
def spark():
    import spark_udfs

    session = spark_udfs.session("local[2]", app_name="pyengine-bench", conf={
        "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "4g",
    })
    session.sparkContext.setLogLevel("ERROR")
    return session


@functools.cache
def state():
    import spark_udfs

    return spark_udfs.capture_state(data_dir())


def raw_rows():
    """Every stored row (markers too), as read by the source."""
    import spark_udfs
    from spark_udfs.schema import VISIBILITY_COLUMNS

    raw = spark_udfs.read(spark(), str(data_dir()), isolation="read_uncommitted", includeMarkers=True)
    return raw.select(*VISIBILITY_COLUMNS)


@functools.cache
def cached_rows():
    """raw_rows() cached in Spark's memory, and how many there are."""
    cached = raw_rows().cache()
    return cached, cached.count()


@functools.cache
def expected_visible() -> int:
    """What every path must count: the rows of the READ_COMMITTED source (tests/spark checks it
    against the broker's own consumers)."""
    import spark_udfs

    return spark_udfs.read(spark(), str(data_dir())).count()


def teardown_module() -> None:
    if spark.cache_info().currsize:
        spark().stop()
    if data_dir.cache_info().currsize:
        shutil.rmtree(data_dir(), ignore_errors=True)


def row_test(captured):
    """The READ_COMMITTED test of one row, as plain Python over the captured state."""
    horizons = {ledger: (topic.max_read_position.ledger_id, topic.max_read_position.entry_id)
                for topic in captured.topics.values() for ledger in topic.ledgers}
    aborted = {(txn.most_bits, txn.least_bits) for topic in captured.topics.values()
               for txn, _ in topic.aborted_set().items()}

    def read_committed(ledger_id, entry_id, txnid_most, txnid_least, is_marker):
        if is_marker:
            return False
        horizon = horizons.get(ledger_id)
        if horizon is None or (ledger_id, entry_id) > horizon:
            return False
        return txnid_most is None or (txnid_most, txnid_least) not in aborted

    return read_committed


def spark_sql_filter(df, captured):
    """The best pure Spark SQL formulation we know: NOT is_marker, each topic's ledgers against
    its horizon, a broadcast left-anti join against the aborted txns."""
    from pyspark.sql import functions as F

    aborted = sorted({(txn.most_bits, txn.least_bits) for topic in captured.topics.values()
                      for txn, _ in topic.aborted_set().items()})
    aborted_df = spark().createDataFrame(aborted, "a_most long, a_least long")
    ledger, entry = F.col("ledger_id"), F.col("entry_id")
    below_horizon = F.lit(False)
    for topic in captured.topics.values():
        h = topic.max_read_position
        below_horizon = below_horizon | (ledger.isin(list(topic.ledgers)) & (
            (ledger < h.ledger_id) | ((ledger == h.ledger_id) & (entry <= h.entry_id))))
    kept = df.filter(~F.col("is_marker") & below_horizon)
    return kept.join(F.broadcast(aborted_df), (kept.txnid_most == aborted_df.a_most)
                     & (kept.txnid_least == aborted_df.a_least), "left_anti")


def _rounds(slow: bool = False) -> int:
    return 1 if slow or QUICK else 3


def _warmup() -> int:
    return 0 if QUICK else 1


def _measure(benchmark, df, ops: int, slow: bool = False) -> None:
    benchmark.extra_info["ops"] = ops
    counted = benchmark.pedantic(df.count, rounds=_rounds(slow), warmup_rounds=0 if slow else _warmup())
    assert counted == expected_visible()


def test_arrow_udf_filter(benchmark):
    import spark_udfs

    df, rows = cached_rows()
    _measure(benchmark, spark_udfs.committed_filter(df, state()), rows)


def test_python_udf_filter(benchmark):
    from pyspark.sql.functions import udf
    from pyspark.sql.types import BooleanType

    from spark_udfs.schema import VISIBILITY_COLUMNS

    df, rows = cached_rows()
    python_udf = udf(row_test(state()), BooleanType(), useArrow=False)
    _measure(benchmark, df.filter(python_udf(*VISIBILITY_COLUMNS)), rows, slow=True)


def test_python_udf_arrow_batched(benchmark):
    from pyspark.sql.functions import udf
    from pyspark.sql.types import BooleanType

    from spark_udfs.schema import VISIBILITY_COLUMNS

    df, rows = cached_rows()
    python_udf = udf(row_test(state()), BooleanType(), useArrow=True)
    _measure(benchmark, df.filter(python_udf(*VISIBILITY_COLUMNS)), rows, slow=True)


def test_spark_sql_filter(benchmark):
    df, rows = cached_rows()
    _measure(benchmark, spark_sql_filter(df, state()), rows)


def test_source_read_committed(benchmark):
    import spark_udfs

    _measure(benchmark, spark_udfs.read(spark(), str(data_dir())), expected_visible(), slow=True)


def test_source_raw_then_spark_sql(benchmark):
    _measure(benchmark, spark_sql_filter(raw_rows(), state()), expected_visible(), slow=True)
