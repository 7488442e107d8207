"""How a suite turns benchmark timings into the figures it reports.

A suite module (``bench_<suite>.py``) holds pytest-benchmark functions and a ``FIGURES``
list. Each benchmark records how many operations one round performs in
``benchmark.extra_info["ops"]``, so figures compare time per operation even when the
baseline runs on fewer rows (a Python loop over 10M rows would take minutes).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable, Mapping

# Time per operation (seconds), keyed by benchmark function name.
Timings = Mapping[str, float]


@dataclass(frozen=True)
class Target:
    op: str  # ">=" or "<="
    value: float

    def met(self, figure: float) -> bool:
        return {">=": operator.ge, "<=": operator.le}[self.op](figure, self.value)

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"


@dataclass(frozen=True)
class Figure:
    name: str
    description: str
    compute: Callable[[Timings], float]
    unit: str = "x"
    target: Target | None = None


def speedup(name: str, ours: str, baseline: str, description: str, at_least: float | None = None) -> Figure:
    """How many times faster `ours` is than `baseline` (per operation)."""
    return Figure(name, description, lambda t: t[baseline] / t[ours], "x",
                  Target(">=", at_least) if at_least is not None else None)


def slowdown(name: str, ours: str, baseline: str, description: str, at_most: float | None = None) -> Figure:
    """How many times slower `ours` is than `baseline` (per operation); lower is better."""
    return Figure(name, description, lambda t: t[ours] / t[baseline], "x",
                  Target("<=", at_most) if at_most is not None else None)


def throughput(name: str, ours: str, bytes_per_op: float, description: str,
               at_least: float | None = None) -> Figure:
    """Megabytes per second processed by `ours`."""
    return Figure(name, description, lambda t: bytes_per_op / t[ours] / 1e6, "MB/s",
                  Target(">=", at_least) if at_least is not None else None)
