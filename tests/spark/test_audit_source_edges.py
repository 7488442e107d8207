"""Edges of the data source found by an audit:

* A read that plans no partition (the topic's first entry is an open transaction's,
  `startPosition=latest`, nothing stored, filters that admit nothing) failed in the worker:
  PySpark reads one placeholder partition of its own then, which `read()` took for ours
  (AttributeError 'ledger_id'). It is an empty DataFrame.
* A chunk of entries whose payloads decode past a column's 2 GiB (compressed payloads grow)
  failed the whole read; the chunk is read again in halves.
* A topic named exactly with `?`, `*` or `[` (valid in topic names) was taken for a glob.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest

import core_ext.records
from pyengine.broker import Broker
from spark_udfs.options import OptionError, parse_options, resolve_topics
from spark_udfs.source import PyengineReader, read_partition
from tests.spark.workload import read_directly

T = "persistent://public/default/edges"


async def _write(data_dir: Path) -> None:
    async with Broker.embedded(data_dir) as broker:
        producer = await broker.create_producer(T)
        pending = await broker.new_transaction()
        await producer.send(b"open", txn=pending)            # the first entry: an open txn's
        await producer.send(b"behind-it")
        plain = await broker.create_producer(T + "-plain")
        for i in range(40):
            await plain.send(b"m%d" % i)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("edges") / "data"
    asyncio.run(_write(path))
    return path


@pytest.mark.parametrize("options", [{"topics": T}, {"topics": T + "-plain", "startPosition": "latest"}])
def test_a_read_that_plans_nothing_is_empty(spark, data_dir, options):
    reader = PyengineReader(parse_options({"path": str(data_dir), **options}))
    assert reader.partitions() == []
    frame = spark.read.format("pyengine").options(**options).load(str(data_dir))
    assert frame.count() == 0
    everything = spark.read.format("pyengine").option("topics", T + "-plain").load(str(data_dir))
    assert everything.filter("entry_id > 1000").count() == 0            # pushed down: nothing planned


def test_a_chunk_that_decodes_too_large_is_read_in_halves(data_dir, monkeypatch):
    decode = core_ext.records.decode_entries
    sizes = []

    def small_columns(ledger_ids, entry_ids, values, keep):
        sizes.append(len(values))
        if len(values) > 5:                                  # as if they decoded past 2 GiB
            raise core_ext.records.ChunkTooLargeError("a column of one chunk holds more than 2 GiB")
        return decode(ledger_ids, entry_ids, values, keep)

    expected = read_directly(data_dir, topics=T + "-plain")
    monkeypatch.setattr(core_ext.records, "decode_entries", small_columns)
    reader = PyengineReader(parse_options({"path": str(data_dir), "topics": T + "-plain"}))
    batches = [b for p in reader.partitions() for b in read_partition(reader.options, reader.state, p)]
    assert pa.Table.from_batches(batches).column("value").to_pylist() == expected.column("value").to_pylist()
    assert len(expected) == 40 and max(sizes[sizes.index(5):]) <= 5      # no chunk as large again


def test_a_single_entry_too_large_still_fails_clearly(data_dir, monkeypatch):
    def too_large(*args):
        raise core_ext.records.ChunkTooLargeError("a column of one chunk holds more than 2 GiB")

    monkeypatch.setattr(core_ext.records, "decode_entries", too_large)
    reader = PyengineReader(parse_options({"path": str(data_dir), "topics": T + "-plain",
                                           "maxPartitionEntries": "1"}))
    with pytest.raises(core_ext.records.ChunkTooLargeError):
        list(read_partition(reader.options, reader.state, reader.partitions()[0]))


def test_names_with_glob_characters_are_exact_when_stored():
    stored = ["persistent://public/default/t[1]", "persistent://public/default/x?y",
              "persistent://public/default/xzy", "persistent://public/default/p*-partition-0"]
    assert resolve_topics(("persistent://public/default/x?y",), stored) == [stored[1]]
    assert resolve_topics(("public/default/t[1]",), stored) == [stored[0]]
    assert resolve_topics(("persistent://public/default/p*",), stored) == [stored[3]]   # its partitions
    assert resolve_topics(("persistent://public/default/x?z",), stored + ["persistent://public/default/xqz"]) \
        == ["persistent://public/default/xqz"]                                         # not stored: a glob
    with pytest.raises(OptionError, match="no stored topic matches"):
        resolve_topics(("persistent://public/default/q?",), stored)
