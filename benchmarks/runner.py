"""Run one benchmark suite through pytest-benchmark and report its figures.

``python -m benchmarks SUITE [--quick] [--json] [--record]``: runs ``benchmarks/bench_SUITE.py``
with pytest-benchmark (or calls its ``measure(quick, record)`` when it measures whole runs
itself, as the broker suite does), turns the timings into the suite's FIGURES, prints a table and, with
``--json``, one JSON object of figures as the last line. ``--record`` rewrites the suite's
section of ``benchmarks/RESULTS.md`` with the figures, the machine and the date.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import re
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from benchmarks.figures import Figure

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
QUICK_ENV = "PYENGINE_BENCH_QUICK"


def available_suites() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def run_pytest_benchmarks(suite: str, quick: bool, json_path: Path) -> None:
    rounds = ["--benchmark-min-rounds=3", "--benchmark-max-time=0.2"] if quick else \
             ["--benchmark-min-rounds=7", "--benchmark-max-time=2"]
    args = [
        str(HERE / f"bench_{suite}.py"),
        "-q", "-p", "no:cacheprovider",
        "-o", "python_files=bench_*.py", "-o", "addopts=",
        "--benchmark-enable", "--benchmark-only", "--benchmark-warmup=on",
        f"--benchmark-json={json_path}", "--benchmark-columns=min,median,rounds",
        *rounds,
    ]
    # Suites read the flag to size their inputs; set before pytest imports the module.
    os.environ[QUICK_ENV] = "1" if quick else "0"
    # A benchmark run is never distributed, also when started from a pytest-xdist worker (whose
    # variables it inherits: pytest-benchmark would then disable itself).
    for name in [n for n in os.environ if n.startswith("PYTEST_XDIST_")]:
        del os.environ[name]
    args += ["-p", "no:xdist"]
    code = pytest.main(args)
    if code != 0:
        raise SystemExit(f"benchmark suite {suite!r} failed (pytest exit code {int(code)})")


def per_op_timings(json_path: Path) -> dict[str, float]:
    """Best (minimum) round time divided by the ops one round performs, per benchmark.

    The minimum is the least noisy estimate of a deterministic computation's cost on a
    shared machine; both sides of every ratio use the same statistic. A benchmark that runs
    as several test items (a suite that alternates the rounds of the two sides of a ratio, so
    that the machine's slow and fast spells fall on both) names its timing in
    ``extra_info["timing"]``; the items of one timing give their best round. A benchmark that
    also measured the process CPU of its round (``extra_info["cpu_s"]``, one round per item)
    gives ``NAME:cpu``, the least CPU per operation over its items.
    """
    data = json.loads(json_path.read_text())
    timings: dict[str, float] = {}
    for bench in data["benchmarks"]:
        info = bench.get("extra_info", {})
        name = info.get("timing", bench["name"])
        ops = info.get("ops", 1)
        for key, per_op in ((name, bench["stats"]["min"] / ops),
                            (f"{name}:cpu", info["cpu_s"] / ops if "cpu_s" in info else None)):
            if per_op is not None:
                timings[key] = min(per_op, timings.get(key, per_op))
    return timings


def compute_figures(figures: list[Figure], timings: dict[str, float]) -> dict[str, float]:
    return {f.name: round(f.compute(timings), 3) for f in figures}


def machine_line() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def table(figures: list[Figure], values: dict[str, float]) -> str:
    rows = ["| figure | value | target | met | what it compares |", "|---|---|---|---|---|"]
    for f in figures:
        met = "" if f.target is None else ("yes" if f.target.met(values[f.name]) else "**no**")
        rows.append(f"| `{f.name}` | {values[f.name]:g} {f.unit} | {f.target or 'report'} | {met} | "
                    f"{f.description} |")
    return "\n".join(rows)


def record(suite: str, quick: bool, figures: list[Figure], values: dict[str, float], notes: str = "") -> None:
    """Replace (or append) the `## suite` section of RESULTS.md (the suite's NOTES follow the
    table: what the baselines are, where the time goes)."""
    today = dt.date.today().isoformat()
    section = (f"## {suite}\n\nMeasured {today} on {machine_line()}; "
               f"`python -m benchmarks {suite}{' --quick' if quick else ''}`.\n\n"
               f"{table(figures, values)}\n")
    if notes.strip():
        section += "\n" + textwrap.dedent(notes).strip() + "\n"
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\n"
    pattern = re.compile(rf"^## {re.escape(suite)}\n.*?(?=^## |\Z)", re.M | re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text.rstrip("\n") + "\n")


def main(argv: list[str] | None = None) -> int:
    suites = available_suites()
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=suites)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, for CI")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line last")
    parser.add_argument("--record", action="store_true", help="write the figures into benchmarks/RESULTS.md")
    args = parser.parse_args(argv)

    os.environ[QUICK_ENV] = "1" if args.quick else "0"
    module = importlib.import_module(f"benchmarks.bench_{args.suite}")
    if hasattr(module, "measure"):
        # A suite of whole runs (processes, latency percentiles) measures its figures itself.
        values = compute_figures(module.FIGURES, module.measure(args.quick, args.record))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            json_path = Path(tmp) / "bench.json"
            run_pytest_benchmarks(args.suite, args.quick, json_path)
            values = compute_figures(module.FIGURES, per_op_timings(json_path))

    print()
    print(table(module.FIGURES, values))
    if args.record:
        record(args.suite, args.quick, module.FIGURES, values, getattr(module, "NOTES", ""))
        print(f"\nrecorded in {RESULTS.relative_to(Path.cwd()) if RESULTS.is_relative_to(Path.cwd()) else RESULTS}")
    if args.json:
        sys.stdout.flush()
        print(json.dumps(values, sort_keys=True))
    return 0
