"""`pyengine pipeline export`: Parquet with the READ_COMMITTED rows, the counts, bad input."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.parquet as pq
import pytest

from pyengine.cli import main
from pyengine.cli.pipeline import _Progress
from tests.spark.workload import ALL_TOPICS, TOPICS


def _export(workload, out, *extra: str) -> int:
    return main(["pipeline", "export", "--data-dir", str(workload.data_dir), "--out", str(out),
                 "--master", "local[2]", *extra])


def test_export_writes_what_the_consumers_received_and_counts_what_it_dropped(spark, workload, tmp_path, capsys):
    out = tmp_path / "export"
    assert _export(workload, out, "--json") == 0
    captured = capsys.readouterr()
    counts = json.loads(captured.out.strip().splitlines()[-1])
    table = pq.read_table(out)
    rows = sorted((r["topic"], r["ledger_id"], r["entry_id"], r["batch_index"], r["value"])
                  for r in table.select(["topic", "ledger_id", "entry_id", "batch_index", "value"]).to_pylist())
    want = sorted((r["topic"], r["ledger_id"], r["entry_id"], r["batch_index"], r["value"]) for r in workload.delivered)
    assert rows == want
    assert table.schema.names[:3] == ["topic", "ledger_id", "entry_id"] and not any(table["is_marker"].to_pylist())
    # The counts, against the workload's own bookkeeping.
    by_outcome = Counter(workload.outcome[txn] if txn else "plain" for _, txn in workload.labels.values())
    delivered = {int(r["value"]) for r in workload.delivered}
    behind_horizon = sum(1 for label, (_, txn) in workload.labels.items() if txn is None and label not in delivered)
    assert counts["rows_written"] == len(want)
    assert counts["markers_dropped"] == workload.markers
    assert counts["aborted_dropped"] == by_outcome["aborted"] + len(workload.late)     # v5 late writes too
    assert counts["uncommitted_dropped"] == by_outcome["open"] + behind_horizon
    assert behind_horizon >= 2            # the plain messages behind the two open txns at the end
    assert counts["rows_read"] == len(workload.labels) + workload.markers
    assert counts["topics"] == len(ALL_TOPICS)


def test_export_read_uncommitted_of_one_namespace_with_the_text_report(spark, workload, tmp_path, capsys):
    out = tmp_path / "refunds"
    assert _export(workload, out, "--topics", "acme/sales", "--isolation", "read_uncommitted",
                   "--no-progress") == 0
    report = capsys.readouterr().out
    stored = sum(1 for topic, _ in workload.labels.values() if topic == TOPICS[2])
    assert pq.read_table(out).num_rows == stored
    assert f"rows written: {stored:,}" in report and "topics: 1" in report and "0 aborted" in report
    # The output exists now: refused without --mode, replaced with --mode overwrite.
    with pytest.raises(SystemExit, match="exists"):
        _export(workload, out, "--topics", "acme/sales")
    assert _export(workload, out, "--topics", "acme/sales", "--mode", "overwrite", "--no-progress") == 0
    assert pq.read_table(out).num_rows == sum(1 for r in workload.delivered if r["topic"] == TOPICS[2])


def test_export_as_delta_without_its_jars_says_what_is_needed(spark, workload, tmp_path):
    """This machine has no Delta Lake jars (they come from Maven Central, out of reach here)."""
    with pytest.raises(SystemExit, match="--format delta needs Delta Lake's JVM jars on Spark's classpath"):
        _export(workload, tmp_path / "delta", "--format", "delta", "--no-progress")
    assert not (tmp_path / "delta").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--topics", "public/default/nope*"], "no stored topic matches"),
    (["--topics", "persistent://public/default/ghost"], "unknown topic"),
    (["--start-position", "x:y"], "startPosition must be"),
])
def test_export_refuses_bad_input_before_starting_spark(workload, tmp_path, argv, message):
    with pytest.raises(SystemExit, match=message):
        _export(workload, tmp_path / "out", *argv)
    assert not (tmp_path / "out").exists()


class _SessionAsked(Exception):
    pass


def test_export_master_defaults_to_local_all_cores(workload, tmp_path, monkeypatch):
    """What master `export` starts Spark with, stopped right there (no second JVM session)."""
    import spark_udfs

    asked = []

    def session(master, **kwargs):
        asked.append(master)
        raise _SessionAsked

    monkeypatch.setattr(spark_udfs, "session", session)
    for extra in ([], ["--master", "spark://head:7077"]):
        with pytest.raises(_SessionAsked):
            main(["pipeline", "export", "--data-dir", str(workload.data_dir), "--out", str(tmp_path / "o"), *extra])
    assert asked == ["local[*]", "spark://head:7077"]
    assert not (tmp_path / "o").exists()


def test_export_of_a_missing_data_dir_and_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit, match="not a pyengine data dir|no LMDB|data dir"):
        main(["pipeline", "export", "--data-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")])
    for argv in (["--isolation", "dirty"], ["--format", "csv"], ["--mode", "ignore"]):
        with pytest.raises(SystemExit) as exc:
            main(["pipeline", "export", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o"), *argv])
        assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_progress_bar_renders_tasks_done(capsys):
    class Tracker:
        def getActiveStageIds(self):
            return []

    class Context:
        def statusTracker(self):
            return Tracker()

    with _Progress(Context(), interval=60) as progress:
        progress.render(3, 12)
    err = capsys.readouterr().err
    assert "[#######.......................] 3/12 tasks" in err
    assert err.endswith(f"[{'#' * 30}] 12/12 tasks\n")             # finished: full bar, new line
