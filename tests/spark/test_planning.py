"""How the `pyengine` source plans a read: one input partition per ledger per topic, ledgers
split into exact entry ranges by `maxPartitionEntries`. Mostly the reader's own `partitions()`
and `read()`, without Spark (what Spark calls when it plans and runs the scan), checked against
the entries stored in the data dir; one read through Spark."""

from __future__ import annotations

from collections import defaultdict

import pytest

from pyengine.storage.reader import StoreReader
from pyengine_kernels import Position
from spark_udfs.options import parse_options
from spark_udfs.source import PyengineReader
from spark_udfs.state import capture_state
from tests.spark.test_source import CONSUMER_COLUMNS, expected, rows_of
from tests.spark.workload import ALL_TOPICS, TOPICS, read_directly


def make_reader(workload, **options: str) -> PyengineReader:
    return PyengineReader(parse_options({"path": str(workload.data_dir), **options}))


def planned(reader: PyengineReader) -> list[tuple[str, int, int, int]]:
    """(topic, ledger, first entry, last entry) of each planned partition, in plan order."""
    return [(p.topic, p.ledger_id, p.first_entry, p.last_entry) for p in reader.partitions()]


def read_all(reader: PyengineReader) -> list[tuple]:
    """Every row `read()` yields over the planned partitions (duplicates kept), sorted."""
    return sorted((row["topic"], row["ledger_id"], row["entry_id"], row["batch_index"], row["value"])
                  for partition in reader.partitions() for batch in reader.read(partition)
                  for row in batch.to_pylist())


@pytest.fixture(scope="module")
def stored(workload) -> dict[tuple[str, int], list[int]]:
    """(topic, ledger) -> the entry ids stored in it, read straight from LMDB (not planned)."""
    entries: dict[tuple[str, int], list[int]] = defaultdict(list)
    with StoreReader(workload.data_dir) as store, store.view() as view:
        for name in ALL_TOPICS:
            info = view.topic(name)
            for ledgers, entry_ids, _ in view.iter_raw(info.topic_id, Position.EARLIEST, info.last_position):
                for ledger, entry in zip(ledgers, entry_ids):
                    entries[(name, ledger)].append(entry)
    return dict(entries)


def test_one_partition_per_ledger_per_topic(workload, stored):
    # The workload's ledgers hold 64 entries at most: every topic has several.
    assert all(sum(1 for topic, _ in stored if topic == name) >= 2 for name in ALL_TOPICS)
    assert all(entries == list(range(entries[0], entries[-1] + 1)) for entries in stored.values())
    # READ_UNCOMMITTED plans every stored entry: one partition per ledger, the whole ledger.
    plan = planned(make_reader(workload, isolation="read_uncommitted", includeMarkers="true"))
    assert sorted(plan) == sorted((topic, ledger, entries[0], entries[-1])
                                  for (topic, ledger), entries in stored.items())
    assert len({(topic, ledger) for topic, ledger, _, _ in plan}) == len(plan)
    # READ_COMMITTED stops at each topic's read horizon: the ledgers before it whole, the
    # horizon's ledger up to it, none after it; still one partition per ledger.
    horizons = {name: state.max_read_position for name, state in capture_state(workload.data_dir).topics.items()}
    want = []
    for (topic, ledger), entries in sorted(stored.items()):
        horizon = horizons[topic]
        if ledger < horizon.ledger_id:
            want.append((topic, ledger, entries[0], entries[-1]))
        elif ledger == horizon.ledger_id and horizon.entry_id >= entries[0]:
            want.append((topic, ledger, entries[0], horizon.entry_id))
    assert sorted(planned(make_reader(workload))) == want
    assert any(horizon < Position(ledger, entries[-1]) for (topic, ledger), entries in stored.items()
               for horizon in [horizons[topic]])           # the horizon cuts some ledger short


def check_ranges(plan: list[tuple[str, int, int, int]], whole: list[tuple[str, int, int, int]], step: int) -> None:
    """`plan` splits each partition of `whole` into consecutive ranges of `step` entries (the
    last one shorter), with nothing left out or planned twice."""
    by_ledger: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for topic, ledger, first, last in plan:
        by_ledger[(topic, ledger)].append((first, last))
    assert sorted(by_ledger) == sorted((topic, ledger) for topic, ledger, _, _ in whole)
    for topic, ledger, first, last in whole:
        ranges = by_ledger[(topic, ledger)]
        assert ranges[0][0] == first and ranges[-1][1] == last
        assert all(this[1] + 1 == following[0] for this, following in zip(ranges, ranges[1:]))
        sizes = [high - low + 1 for low, high in ranges]
        assert all(size == step for size in sizes[:-1]) and 1 <= sizes[-1] <= step


@pytest.mark.parametrize("step", [1, 5, 63, 64, 65])
@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_max_partition_entries_splits_ledgers_into_exact_ranges(workload, step, isolation):
    options = {"isolation": isolation} | ({"includeMarkers": "true"} if isolation == "read_uncommitted" else {})
    whole = make_reader(workload, **options)
    split = make_reader(workload, maxPartitionEntries=str(step), **options)
    check_ranges(planned(split), planned(whole), step)
    if step < 64:
        assert len(planned(split)) > len(planned(whole))
    # The rows read over the ranges are the rows of the unsplit read: none lost at a range
    # boundary, none read twice.
    assert read_all(split) == read_all(whole)


def test_ranges_start_and_end_at_the_positions_read(workload, stored):
    """With a start and an end position inside a ledger, the ranges start at the start
    position (not at the ledger's first entry) and stop at the end position."""
    ledger = min(ledger for topic, ledger in stored if topic == TOPICS[0])
    options = {"topics": TOPICS[0], "isolation": "read_uncommitted", "includeMarkers": "true",
               "startPosition": f"{ledger}:10", "endPosition": f"{ledger}:40"}
    plan = planned(make_reader(workload, maxPartitionEntries="7", **options))
    assert plan == [(TOPICS[0], ledger, first, min(first + 6, 40)) for first in range(10, 41, 7)]
    rows = read_all(make_reader(workload, maxPartitionEntries="7", **options))
    assert rows == read_all(make_reader(workload, **options))
    assert {row[2] for row in rows} == set(range(10, 41))


def test_split_ledgers_read_through_spark_equal_the_consumers_rows(spark, workload):
    df = spark.read.format("pyengine").option("maxPartitionEntries", 13).load(str(workload.data_dir))
    plan = planned(make_reader(workload, maxPartitionEntries="13"))
    assert df.rdd.getNumPartitions() == len(plan) > len(planned(make_reader(workload)))
    assert df.count() == len(expected(workload))
    assert [{c: r[c] for c in CONSUMER_COLUMNS} for r in rows_of(df)] == expected(workload)
    assert rows_of(read_directly(workload.data_dir, maxPartitionEntries="13")) == rows_of(df)
