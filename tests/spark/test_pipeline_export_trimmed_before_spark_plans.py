"""`pyengine pipeline export` captures the transaction state and the read's end positions in
one snapshot, and Spark plans the read in another. Found by an audit: ledgers trimmed by
retention in between were silently left out (the export wrote 0 of 10 rows, exit 0). The
export now pins the read's start to the first entry of its capture, with `failOnDataLoss`, so
such a trim fails it (DataDirChangedError, as a trim after planning does), and says so."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.cli import main, pipeline
from pyengine.storage import ManagedLedgerConfig
from spark_udfs.options import OptionError, parse_options
from spark_udfs.source import DataDirChangedError, PyengineReader, read_partition

T = "persistent://public/default/trimmed-before-spark-plans"
CONFIG = dict(sync=False, ledger=ManagedLedgerConfig(max_entries_per_ledger=4))


async def write(data_dir, messages: int) -> None:
    async with Broker.embedded(data_dir, **CONFIG) as broker:
        producer = await broker.create_producer(T)
        for i in range(messages):
            await producer.send(b"m%d" % i)


async def trim(data_dir) -> None:
    async with Broker.embedded(data_dir, **CONFIG) as broker:
        topic = await broker.service.get_topic(T)
        topic.ledger.set_retention(0, 0)
        assert await topic.ledger.trim(now_ms=1 << 62)        # no subscription: closed ledgers go


def rows(reader: PyengineReader) -> int:
    return sum(b.num_rows for p in reader.partitions() for b in read_partition(reader.options, reader.state, p))


def test_fail_on_data_loss_refuses_a_start_before_the_first_entry_left(tmp_path):
    data_dir = tmp_path / "data"
    asyncio.run(write(data_dir, 10))
    options = {"path": str(data_dir), "topics": T, "startPosition": "earliest", "failOnDataLoss": "true"}
    first = PyengineReader(parse_options(options)).topics[T].first_position
    pinned = {**options, "startPosition": f"{first.ledger_id}:{first.entry_id}"}
    assert rows(PyengineReader(parse_options(pinned))) == 10
    asyncio.run(trim(data_dir))
    with pytest.raises(DataDirChangedError, match=f"startPosition {first} of {T} is before"):
        PyengineReader(parse_options(pinned))
    # without it (the default), what is left is read, as a Pulsar reader starts at the earliest left
    assert rows(PyengineReader(parse_options({**pinned, "failOnDataLoss": "false"}))) == 0
    assert rows(PyengineReader(parse_options({**options, "failOnDataLoss": "true"}))) == 0    # earliest
    with pytest.raises(OptionError, match="failOnDataLoss must be true or false"):
        parse_options({**options, "failOnDataLoss": "maybe"})


def test_an_export_whose_entries_are_trimmed_before_spark_plans_fails(spark, tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    asyncio.run(write(data_dir, 10))
    captured = pipeline._plan

    def plan_then_trim(args):
        planned = captured(args)
        asyncio.run(trim(data_dir))          # after the capture, before Spark plans the read
        return planned

    monkeypatch.setattr(pipeline, "_plan", plan_then_trim)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="trimmed by retention.*run the export again"):
        main(["pipeline", "export", "--data-dir", str(data_dir), "--out", str(out), "--topics", T,
              "--master", "local[2]", "--no-progress"])
    assert not out.exists()


def test_an_export_pins_its_starts_and_refuses_a_start_of_a_topic_it_does_not_read(tmp_path, monkeypatch):
    """The pinned starts name the topics read only: a `--start-position` of another topic is
    refused before Spark starts, as the source refuses it."""
    import spark_udfs

    data_dir = tmp_path / "data"
    asyncio.run(write(data_dir, 10))

    def no_spark(*args, **kwargs):
        raise AssertionError("Spark started")

    monkeypatch.setattr(spark_udfs, "session", no_spark)
    argv = ["pipeline", "export", "--data-dir", str(data_dir), "--out", str(tmp_path / "out"), "--topics", T]
    with pytest.raises(SystemExit, match="'persistent://public/default/other'.* not among the topics exported"):
        main([*argv, "--start-position", '{"persistent://public/default/other": "0:0"}'])
    args = argparse.Namespace(data_dir=data_dir, topics=T, out=tmp_path / "out", mode="error", start_position="0:0")
    names, _state, ends, starts = pipeline._plan(args)
    assert names == [T] and starts == {T: "1:0"} and ends == {T: "3:1"}     # the first and last entries stored
