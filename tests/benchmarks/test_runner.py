"""`python -m benchmarks SUITE --quick --json` runs and ends with one JSON object holding every
figure of the suite (the targets themselves are checked by reading RESULTS.md, not in CI:
timings on a shared machine are not pass/fail material)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_engine, bench_kernels

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("suite, module", [("kernels", bench_kernels), ("engine", bench_engine)])
def test_quick_run_prints_every_figure_as_json(suite, module, tmp_path):
    result = subprocess.run([sys.executable, "-m", "benchmarks", suite, "--quick", "--json"], cwd=ROOT,
                            capture_output=True, text=True, timeout=800,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures) == {f.name for f in module.FIGURES}
    assert all(isinstance(v, float | int) and v > 0 for v in figures.values()), figures
    assert list(tmp_path.iterdir()) == []           # every data dir it wrote is deleted


def test_unknown_suite_is_refused():
    result = subprocess.run([sys.executable, "-m", "benchmarks", "nonsense"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_quick_broker_run_measures_every_figure_over_the_network():
    """The broker suite runs `pyengine serve` and `pyengine perf` as child processes; its quick
    mode prints every figure (latencies may be 0 ms when nothing waited, never negative)."""
    from benchmarks import bench_broker

    result = subprocess.run([sys.executable, "-m", "benchmarks", "broker", "--quick", "--json"], cwd=ROOT,
                            capture_output=True, text=True, timeout=800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures) == {f.name for f in bench_broker.FIGURES}
    assert all(isinstance(v, float | int) and v >= 0 for v in figures.values()), figures
    for throughput in ("publish_msgs_per_s", "publish_msgs_per_s_no_fsync", "txn_vs_plain_throughput_100",
                       "uvloop_vs_asyncio"):
        assert figures[throughput] > 0, figures
    assert "| `publish_msgs_per_s` |" in result.stdout


def test_items_of_one_timing_give_their_best_round_per_operation(tmp_path):
    """Alternating suites run one test item per round and name the timing the items share."""
    from benchmarks.runner import per_op_timings

    def bench(name, seconds, ops=None, timing=None, cpu_s=None):
        info = {k: v for k, v in (("ops", ops), ("timing", timing), ("cpu_s", cpu_s)) if v is not None}
        return {"name": name, "stats": {"min": seconds}, "extra_info": info}

    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"benchmarks": [
        bench("test_publish[publish_plain-0]", 3.0, ops=1000, timing="test_publish_plain", cpu_s=2.5),
        bench("test_publish[publish_txn-0]", 4.0, ops=1000, timing="test_publish_txn", cpu_s=3.0),
        bench("test_publish[publish_plain-1]", 2.0, ops=1000, timing="test_publish_plain", cpu_s=3.5),
        bench("test_publish[publish_txn-1]", 5.0, ops=1000, timing="test_publish_txn", cpu_s=4.5),
        bench("test_single", 0.5),
    ]}))
    # The least CPU per operation is its own best round: not necessarily the fastest one.
    assert per_op_timings(report) == {"test_publish_plain": 0.002, "test_publish_txn": 0.004, "test_single": 0.5,
                                      "test_publish_plain:cpu": 0.0025, "test_publish_txn:cpu": 0.003}
