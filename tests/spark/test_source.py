"""`spark.read.format("pyengine")` against the broker's own READ_COMMITTED consumers, row for row.

The data dir comes from a randomized transactional workload (tests/spark/workload.py):
commits, aborts, timeouts, batches, transactions spanning topics, small ledgers, and a
transaction still open at the end, in both transaction designs (v4 persistent://, v5 segment://).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

import spark_udfs
from pyengine.storage.errors import StorageError
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID
from spark_udfs.options import OptionError
from spark_udfs.source import PyengineDataSource
from tests.spark.workload import ALL_TOPICS, SCALABLE, SEGMENTS, TOPICS, Workload, read_directly

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
ORDER = ("topic", "ledger_id", "entry_id", "batch_index")


def _ms(value: dt.datetime | None) -> int | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return (value - EPOCH) // dt.timedelta(milliseconds=1)


def rows_of(df) -> list[dict]:
    """The DataFrame's (or Arrow table's) rows as the consumer rows of tests/spark/workload.py
    (plus the transaction columns), in position order."""
    rows = []
    for row in (df if isinstance(df, pa.Table) else df.toArrow()).to_pylist():
        row["publish_time"] = _ms(row["publish_time"])
        row["event_time"] = _ms(row["event_time"])
        row["properties"] = dict(row["properties"])
        rows.append(row)
    return sorted(rows, key=lambda r: tuple(r[c] for c in ORDER))


CONSUMER_COLUMNS = ("topic", "ledger_id", "entry_id", "batch_index", "publish_time", "event_time", "key", "value",
                    "properties", "producer_name", "sequence_id")


def expected(workload: Workload) -> list[dict]:
    return sorted(workload.delivered, key=lambda r: tuple(r[c] for c in ORDER))


# Each whole-data-dir read once for the module (a Spark query costs about a second).
@pytest.fixture(scope="module")
def committed(spark, workload) -> list[dict]:
    return rows_of(spark.read.format("pyengine").load(str(workload.data_dir)))


@pytest.fixture(scope="module")
def uncommitted(spark, workload) -> list[dict]:
    return rows_of(spark.read.format("pyengine").option("isolation", "read_uncommitted").load(str(workload.data_dir)))


def test_read_committed_equals_the_brokers_consumer_row_for_row(committed, workload):
    got = committed
    assert [{c: r[c] for c in CONSUMER_COLUMNS} for r in got] == expected(workload)
    # The workload's outcome agrees: nothing of aborted or open transactions, no markers.
    for row in got:
        label = int(row["value"])
        topic, txn = workload.labels[label]
        assert row["topic"] == topic and not row["is_marker"]
        assert (row["txnid_most"], row["txnid_least"]) == (txn if txn is not None else (None, None))
        assert txn is None or workload.outcome[txn] == "committed"
        assert label not in workload.late
    # The workload exercised what it should have, in both designs (v5: segment:// topics).
    outcomes = Counter((workload.outcome[txn], topic in SEGMENTS) for topic, txn in workload.labels.values() if txn)
    assert all(outcomes[(state, v5)] for state in ("committed", "aborted", "open") for v5 in (False, True))
    assert {r["topic"] for r in got} == set(ALL_TOPICS) and workload.late
    assert any(r["batch_index"] > 0 for r in got) and any(r["ledger_id"] != got[0]["ledger_id"] for r in got)


def test_read_uncommitted_has_every_message_and_markers_on_request(workload, uncommitted):
    assert sorted(int(r["value"]) for r in uncommitted) == sorted(workload.labels)
    # (Through Spark, includeMarkers is what `pyengine pipeline export` reads with.)
    with_markers = rows_of(read_directly(workload.data_dir, isolation="read_uncommitted", includeMarkers="true"))
    markers = [r for r in with_markers if r["is_marker"]]
    assert len(markers) == workload.markers
    assert all(r["txnid_most"] is not None and workload.outcome[(r["txnid_most"], r["txnid_least"])] != "open"
               for r in markers)


def test_committed_filter_on_raw_rows_equals_the_read_committed_source(spark, workload):
    raw = (spark.read.format("pyengine").option("isolation", "read_uncommitted").option("includeMarkers", "true")
           .load(str(workload.data_dir)))
    state = spark_udfs.capture_state(workload.data_dir)
    filtered = rows_of(spark_udfs.committed_filter(raw, state))
    assert [{c: r[c] for c in CONSUMER_COLUMNS} for r in filtered] == expected(workload)
    # The same test as a column over a DataFrame with other column names, and as the UDF of
    # all five columns (markers tested in Python): they agree on every row.
    names = tuple(f"x_{c}" for c in spark_udfs.VISIBILITY_COLUMNS)
    renamed = raw.select(*(F.col(c).alias(name) for c, name in zip(spark_udfs.VISIBILITY_COLUMNS, names)))
    both = renamed.select(spark_udfs.committed_column(state, names).alias("column"),
                          spark_udfs.committed_udf(state)(*names).alias("udf")).toArrow()
    assert Counter(zip(both["column"].to_pylist(), both["udf"].to_pylist())) == {
        (True, True): len(workload.delivered),
        (False, False): len(workload.labels) + workload.markers - len(workload.delivered)}


def test_committed_filter_rejects_rows_of_topics_it_has_no_state_for(spark, workload):
    raw = spark.read.format("pyengine").option("isolation", "read_uncommitted").load(str(workload.data_dir))
    state = spark_udfs.capture_state(workload.data_dir, [TOPICS[0]])
    with pytest.raises(PySparkException, match="a stored topic the captured state leaves out holds"):
        spark_udfs.committed_filter(raw, state).count()
    with pytest.raises(ValueError, match="no column"):
        spark_udfs.committed_filter(raw.select("ledger_id"), state)
    with pytest.raises(TypeError, match="TxnState"):
        spark_udfs.committed_filter(raw, {"not": "a state"})


def test_visibility_columns_of_another_type_are_refused_when_the_filter_is_built(spark, workload):
    """Found by an audit: int columns failed inside a Python worker, strings deep in NumPy."""
    raw = spark.read.format("pyengine").option("isolation", "read_uncommitted").load(str(workload.data_dir))
    state = spark_udfs.capture_state(workload.data_dir)
    for column, cast in (("ledger_id", "int"), ("txnid_least", "string"), ("txnid_most", "decimal(20,0)"),
                         ("is_marker", "int")):
        other = raw.withColumn(column, F.col(column).cast(cast))
        for build in (spark_udfs.committed_filter, spark_udfs.committed_rows):
            with pytest.raises(TypeError, match=f"column '{column}' is .*cast it first"):
                build(other, state)


def test_a_null_marker_flag_is_never_visible(spark, workload):
    """A row whose is_marker is null (an exported DataFrame) may be a marker: every filter
    drops it. Before, the UDF kept it, committed_rows failed and committed_filter dropped it
    (found by an audit)."""
    raw = spark.read.format("pyengine").option("isolation", "read_uncommitted").load(str(workload.data_dir))
    state = spark_udfs.capture_state(workload.data_dir)
    # One row, scanned once (each action on `raw.limit(1)` scanned the workload again).
    rows = spark.createDataFrame(raw.limit(1).collect(), raw.schema).withColumn(
        "is_marker", F.lit(None).cast("boolean"))
    assert spark_udfs.committed_filter(rows, state).count() == 0
    assert spark_udfs.committed_rows(rows, state).count() == 0
    assert spark_udfs.committed_rows(rows, None).count() == 0
    assert rows.select(spark_udfs.committed_udf(state)(*spark_udfs.VISIBILITY_COLUMNS)).first()[0] is False


def test_topics_positions_and_pushed_filters(spark, workload):
    path = str(workload.data_dir)
    everything = expected(workload)
    # A namespace, a glob, a list (the source's reader itself), a scalable topic (through Spark).
    for option, topics in [("acme/sales", {TOPICS[2]}), ("persistent://public/default/pay*", {TOPICS[1]}),
                           (f"{TOPICS[0]},{TOPICS[2]}", {TOPICS[0], TOPICS[2]}), (SCALABLE, set(SEGMENTS))]:
        rows = rows_of(spark_udfs.read(spark, path, topics=option) if option == SCALABLE
                       else read_directly(workload.data_dir, topics=option))
        assert [{c: r[c] for c in CONSUMER_COLUMNS} for r in rows] == [r for r in everything if r["topic"] in topics]
    # Pushed comparisons are honoured by the source (Spark does not re-apply them), with
    # filterPushdown on (a DataFrame per query: tests/spark/test_planning.py says why).
    orders = [r for r in everything if r["topic"] == TOPICS[0]]
    ledger = orders[len(orders) // 2]["ledger_id"]
    pushing = spark.read.format("pyengine").option("filterPushdown", True)
    pushed = pushing.load(path).filter((F.col("topic") == TOPICS[0]) & (F.col("ledger_id") >= ledger) & (F.col("entry_id") < 20))
    want = [r for r in orders if r["ledger_id"] >= ledger and r["entry_id"] < 20]
    assert [{c: r[c] for c in CONSUMER_COLUMNS} for r in rows_of(pushed)] == want
    picked = pushing.load(path).filter(F.col("entry_id").isin(3, 5) & F.col("topic").startswith("persistent://public/"))
    assert len(rows_of(picked)) == sum(1 for r in everything
                                      if r["entry_id"] in (3, 5) and r["topic"].startswith("persistent://public/"))
    # Negations and ORs are left to Spark (a Not has no single column: it was once a crash).
    negated = pushing.load(path).filter(~(F.col("entry_id") == 3) & ((F.col("ledger_id") == ledger) | F.col("key").isNull()))
    assert len(rows_of(negated)) == sum(1 for r in everything
                                        if r["entry_id"] != 3 and (r["ledger_id"] == ledger or r["key"] is None))
    # Start and end positions, inclusive; per topic as JSON.
    start, end = orders[3], orders[-3]
    window = rows_of(read_directly(workload.data_dir, topics=TOPICS[0], startPosition=f"{start['ledger_id']}:"
                                   f"{start['entry_id']}", endPosition=f"{end['ledger_id']}:{end['entry_id']}"))
    key = lambda r: (r["ledger_id"], r["entry_id"])  # noqa: E731
    assert [r["value"] for r in window] == [r["value"] for r in orders if key(start) <= key(r) <= key(end)]
    per_topic = rows_of(read_directly(workload.data_dir, startPosition=f'{{"{TOPICS[0]}": "latest"}}'))
    assert [r for r in per_topic if r["topic"] == TOPICS[0]] == []
    assert len(per_topic) == len(everything) - len(orders)


def test_topics_as_a_list_as_spark_passes_it(spark, workload):
    """`.option("topics", [...])` reaches the source as the list's str() ("['a', 'b']"); a
    JSON list and a tuple's str() read the same way."""
    want = rows_of(read_directly(workload.data_dir, topics=f"{TOPICS[0]},{TOPICS[2]}"))
    assert {r["topic"] for r in want} == {TOPICS[0], TOPICS[2]}
    for given in (str([TOPICS[0], TOPICS[2]]), json.dumps([TOPICS[2], TOPICS[0]]), str((TOPICS[0], TOPICS[2])),
                  str([f" {TOPICS[0]} ", TOPICS[2], ""])):
        assert rows_of(read_directly(workload.data_dir, topics=given)) == want, given
    # Through Spark: a list with a scalable topic and a namespace.
    reader = spark.read.format("pyengine").option("topics", [SCALABLE, "acme/sales"])
    assert dict(Counter(r.topic for r in reader.load(str(workload.data_dir)).select("topic").collect())) == \
        dict(Counter(r["topic"] for r in expected(workload) if r["topic"] in (*SEGMENTS, TOPICS[2])))


@pytest.mark.parametrize(("options", "message"), [
    ({"isolation": "serializable"}, "isolation must be one of"),
    ({"startPosition": "3-4"}, "startPosition must be earliest, latest, LEDGER:ENTRY"),
    ({"endPosition": "{not json"}, "endPosition: not a JSON object"),
    ({"topics": "persistent://public/default/nope"}, "unknown topic"),
    ({"topics": "ghost/ns"}, "namespace 'ghost/ns' has no stored topic"),
    ({"topics": "public/default/zz*"}, "no stored topic matches"),
    ({"topics": " , "}, "topics is empty"),
    ({"topics": "[]"}, "topics is empty"),
    # Lists as `.option("topics", [...])` passes them (their str()), malformed:
    ({"topics": f"['{TOPICS[0]}', '{TOPICS[1]}'"}, r"topics: cannot read .* as a list of strings"),   # unclosed
    ({"topics": "[orders, payments]"}, r"topics: cannot read .* as a list of strings"),        # not quoted
    ({"topics": f"[['{TOPICS[0]}']]"}, r"topics: cannot read .* as a list of strings"),        # nested
    ({"topics": "[1, 2]"}, r"topics: cannot read .* as a list of strings"),                   # not strings
    ({"topics": f"['{TOPICS[0]}'] + ['{TOPICS[1]}']"}, r"topics: cannot read .* as a list of strings"),
    ({"topics": f"['{TOPICS[0]}', 'persistent://public/default/nope']"}, "unknown topic"),
    ({"includeMarkers": "true"}, "includeMarkers needs isolation=read_uncommitted"),
    ({"includeMarkers": "maybe", "isolation": "read_uncommitted"}, "includeMarkers must be true or false"),
    ({"maxBatchRows": "0"}, "maxBatchRows must be a positive integer"),
    ({"maxPartitionEntries": "lots"}, "maxPartitionEntries must be a positive integer"),
    ({"filterPushdown": "sometimes"}, "filterPushdown must be true or false"),
    ({"tpoics": "x"}, "unknown option"),
])
def test_malformed_options_fail_with_a_clear_error(workload, options, message):
    """What Spark calls when it plans a read (schema(), then reader()), without a Spark query:
    the two tests below show such errors reach Spark's caller."""
    with pytest.raises((OptionError, StorageError), match=message):
        source = PyengineDataSource({"path": str(workload.data_dir), **options})
        source.reader(source.schema())


def test_option_errors_reach_the_spark_caller(spark, workload):
    for options, message in [({"isolation": "serializable"}, "isolation must be one of"),      # at schema()
                             ({"topics": "public/default/zz*"}, "no stored topic matches")]:   # at reader()
        reader = spark.read.format("pyengine")
        for key, value in options.items():
            reader = reader.option(key, value)
        with pytest.raises(PySparkException, match=message):
            reader.load(str(workload.data_dir)).count()


def test_a_missing_data_dir_or_a_schema_is_refused(spark, tmp_path):
    with pytest.raises(PySparkException, match=str(tmp_path / "nowhere")):
        spark.read.format("pyengine").load(str(tmp_path / "nowhere")).count()
    with pytest.raises(OptionError, match="needs the broker's data dir"):
        PyengineDataSource({}).schema()
    with pytest.raises(OptionError, match="fixed schema"):
        PyengineDataSource({"path": str(tmp_path)}).reader(StructType([StructField("topic", StringType())]))


def test_nothing_after_an_open_transaction_is_visible(workload, committed, uncommitted):
    """The workload ends with an open transaction's message and a plain message behind it, in
    each design (v4 on a persistent:// topic, v5 on a segment:// topic)."""
    last_four = sorted(workload.labels)[-4:]
    assert {workload.labels[label][0] for label in last_four} == {TOPICS[0], SEGMENTS[0]}
    assert not {int(r["value"]) for r in committed} & set(last_four)
    assert set(last_four) <= {int(r["value"]) for r in uncommitted}


def test_transactions_ended_by_their_timeout_are_not_read_committed(workload, committed, uncommitted):
    """The workload has, in each design, transactions its client never ended that their
    coordinator aborted when their timeout passed; their messages are stored (READ_UNCOMMITTED)
    and absent from READ_COMMITTED, though later messages of their topics are visible (the
    read horizon is past them: the abort hides them)."""
    assert {txn[0] == V5_COORDINATOR_ID for txn in workload.timed_out} == {False, True}
    assert all(workload.outcome[txn] == "aborted" for txn in workload.timed_out)
    visible = {int(r["value"]) for r in committed}
    assert visible == {int(r["value"]) for r in workload.delivered}
    stored = {int(r["value"]) for r in uncommitted}
    passed = set()          # the designs with a timed-out transaction the read horizon is past
    for txn in workload.timed_out:
        mine = [(label, topic) for label, (topic, owner) in workload.labels.items() if owner == txn]
        assert {label for label, _ in mine} <= stored and not {label for label, _ in mine} & visible
        if mine and all(any(later > label and workload.labels[later][0] == topic for later in visible)
                        for label, topic in mine):
            passed.add(txn[0] == V5_COORDINATOR_ID)
    assert passed == {False, True}
