"""The v5 benchmark suite's measurements run end to end at a tiny size (the full quick run takes
minutes: `python -m benchmarks v5 --quick --json`), and its figures are named as the issue asks."""

from __future__ import annotations

from benchmarks import bench_v5


async def test_v5_measurements_run_at_a_tiny_size(monkeypatch):
    monkeypatch.setattr(bench_v5, "PARTICIPANTS", 4)
    v5, v4 = await bench_v5.end_txn_latencies(2)
    assert len(v5) == len(v4) == 2 and min(v5 + v4) > 0
    sealed = await bench_v5.sealed_commit(2)
    assert len(sealed) == 2 and all(s < 5 for s in sealed)
    v5_start, v4_start = await bench_v5.cold_start(50, 1)
    assert 0 < v5_start and 0 < v4_start
    visible = await bench_v5.commit_to_visible(3, "lmdb")
    assert len(visible) == 3


def test_figures_are_the_issues():
    assert {f.name for f in bench_v5.FIGURES} == {
        "end_txn_v5_over_v4_64_participants", "end_txn_sealed_segment_ms", "cold_start_v5_over_v4",
        "commit_to_visible_p99_ms", "commit_to_visible_p99_ms_etcd"}
