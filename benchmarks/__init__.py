"""Benchmarks: pytest-benchmark suites (bench_<suite>.py) and the runner (`python -m benchmarks SUITE`).

Every figure is a ratio against a baseline measured in the same run, or a throughput
measured next to one, so that it holds on a noisy machine.
"""
