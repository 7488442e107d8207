"""Findings of a review of the Spark side (spark_udfs, `pyengine pipeline export`)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.cli import main

A, B, A_COMMA_B = ("persistent://public/default/a", "persistent://public/default/b",
                   "persistent://public/default/a,b")


async def _write(data_dir, messages: dict[str, list[bytes]]) -> None:
    async with Broker.embedded(data_dir, sync=False) as broker:
        for topic, values in messages.items():
            producer = await broker.create_producer(topic)
            for value in values:
                await producer.send(value)


def _no_spark(*args, **kwargs):
    raise AssertionError("Spark started")


def test_an_export_of_a_data_dir_without_topics_is_refused_before_spark(tmp_path, monkeypatch):
    """A data dir storing no topic (a broker that never got one): the export started Spark and
    failed inside it on the empty topic list it passed (`topics is empty`, an internal option
    the user never gave), with Spark's traceback. It is refused before Spark starts now."""
    import spark_udfs

    data_dir = tmp_path / "data"
    asyncio.run(_write(data_dir, {}))
    monkeypatch.setattr(spark_udfs, "session", _no_spark)
    with pytest.raises(SystemExit, match="stores no topic to export"):
        main(["pipeline", "export", "--data-dir", str(data_dir), "--out", str(tmp_path / "out"), "--no-progress"])


def test_read_with_a_list_of_topics_keeps_a_name_with_a_comma_whole(spark, tmp_path):
    """`spark_udfs.read(topics=[...])` (and so the export, which passes the topics it resolved)
    joined the list with commas, and a topic whose local name holds a comma (a valid name) was
    split: `a,b` read the topics `a` and `b` instead, silently the wrong rows."""
    import spark_udfs

    data_dir = tmp_path / "data"
    asyncio.run(_write(data_dir, {A: [b"of-a"], B: [b"of-b"], A_COMMA_B: [b"of-a,b"]}))
    rows = spark_udfs.read(spark, str(data_dir), topics=[A_COMMA_B]).select("topic", "value").collect()
    assert [(r.topic, bytes(r.value)) for r in rows] == [(A_COMMA_B, b"of-a,b")]
    both = spark_udfs.read(spark, str(data_dir), topics=[A_COMMA_B, B]).select("value").collect()
    assert sorted(bytes(r.value) for r in both) == [b"of-a,b", b"of-b"]


@pytest.mark.parametrize("change", ["type", "nullability"])
def test_a_schema_of_the_right_names_but_other_types_is_refused_when_planned(spark, tmp_path, change):
    """A schema passed to the reader was checked by its column names only: one with another
    type (`ledger_id int`) or other nullability (a DDL string makes every column nullable)
    was accepted and every task then failed in its Python worker with Spark's schema mismatch
    traceback, not the source's own clear refusal."""
    from pyspark.sql.types import IntegerType, StructField, StructType

    from spark_udfs import SCHEMA

    data_dir = tmp_path / "data"
    asyncio.run(_write(data_dir, {A: [b"x"]}))
    if change == "type":
        fields = [StructField(f.name, IntegerType() if f.name == "ledger_id" else f.dataType, f.nullable)
                  for f in SCHEMA.fields]
    else:
        fields = [StructField(f.name, f.dataType, True) for f in SCHEMA.fields]
    with pytest.raises(Exception, match="fixed schema") as raised:
        spark.read.format("pyengine").schema(StructType(fields)).load(str(data_dir)).collect()
    assert "DATA_SOURCE_RETURN_SCHEMA_MISMATCH" not in str(raised.value)
    with pytest.raises(Exception, match="fixed schema"):
        spark.readStream.format("pyengine").schema(StructType(fields)).load(str(data_dir)) \
            .writeStream.format("noop").start().awaitTermination(60)


def test_committed_column_is_false_not_null_for_a_null_marker_flag(spark, tmp_path):
    """`committed_column` was `NOT is_marker AND udf(...)`: for a row whose marker flag is null
    (an exported DataFrame) it was null, not false, so `filter(~committed_column(state))` (the
    rows a consumer does not receive) left that row out too, and a `visible` column made from
    it had a third value. It is false now, as the UDF and the other filters say."""
    from pyspark.sql import functions as F

    import spark_udfs

    data_dir = tmp_path / "data"
    asyncio.run(_write(data_dir, {A: [b"x"]}))
    state = spark_udfs.capture_state(data_dir)
    raw = spark_udfs.read(spark, str(data_dir), isolation="read_uncommitted")
    rows = spark.createDataFrame(raw.collect(), raw.schema)
    assert [r[0] for r in rows.select(spark_udfs.committed_column(state)).collect()] == [True]
    nulls = rows.withColumn("is_marker", F.lit(None).cast("boolean"))
    assert [r[0] for r in nulls.select(spark_udfs.committed_column(state)).collect()] == [False]
    assert nulls.filter(~spark_udfs.committed_column(state)).count() == 1
    assert spark_udfs.committed_filter(nulls, state).count() == 0


def test_an_export_from_a_position_past_the_end_of_some_topics_exports_the_others(spark, tmp_path):
    """`--start-position LEDGER:ENTRY` applies to every topic exported, and ledger ids are the
    data dir's: a topic whose last entry comes before it has nothing to export. The export
    pinned that topic's read to start there and end at its last entry, which the source
    refuses (start after end), inside Spark: the whole export failed with Spark's traceback."""
    import pyarrow.parquet as pq

    from spark_udfs.state import open_snapshot

    data_dir = tmp_path / "data"
    asyncio.run(_write(data_dir, {A: [b"a-0", b"a-1"], B: [b"b-0", b"b-1"]}))
    with open_snapshot(data_dir) as snapshot:
        first_of_b = snapshot.view.topic(B).first_position
        assert snapshot.view.topic(A).last_position < first_of_b
    out = tmp_path / "out"
    assert main(["pipeline", "export", "--data-dir", str(data_dir), "--out", str(out), "--topics", f"{A},{B}",
                 "--start-position", f"{first_of_b.ledger_id}:{first_of_b.entry_id}", "--master", "local[2]",
                 "--no-progress"]) == 0
    assert sorted(pq.read_table(out).column("value").to_pylist()) == [b"b-0", b"b-1"]


def test_an_export_whose_planned_ledgers_are_trimmed_before_its_tasks_says_to_run_it_again(spark, tmp_path,
                                                                                          monkeypatch):
    """Entries trimmed after Spark planned the export, before a task read them, fail the task
    with PlannedEntriesGoneError (a DataDirChangedError). The export recognised only the base
    class's name in Spark's error text: it re-raised Spark's raw error and, with --mode error,
    left the empty output dir behind, in the way of the retry it should have asked for."""
    import spark_udfs.udfs
    from tests.spark.test_pipeline_export_trimmed_before_spark_plans import T, trim, write

    data_dir = tmp_path / "data"
    asyncio.run(write(data_dir, 10))
    committed_rows = spark_udfs.udfs.committed_rows

    def trimmed_once_planned(raw, state, counts):
        planned = raw.rdd                     # Spark plans the read here (partitions, per ledger)
        asyncio.run(trim(data_dir))
        return committed_rows(spark.createDataFrame(planned, raw.schema), state, counts)

    monkeypatch.setattr(spark_udfs.udfs, "committed_rows", trimmed_once_planned)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="the data dir changed during the export: .*run the export again"):
        main(["pipeline", "export", "--data-dir", str(data_dir), "--out", str(out), "--topics", T,
              "--master", "local[2]", "--no-progress"])
    assert not out.exists()
