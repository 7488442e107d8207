"""Hypothesis strategies and column builders shared by the kernel tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st

import pyengine_kernels as k

INT64_MAX = 2**63 - 1

Layout = Literal["numpy", "strided", "arrow"]
LAYOUTS: tuple[Layout, ...] = ("numpy", "strided", "arrow")

# Small values collide often (duplicate txns, equal positions); the extremes catch overflow.
ids = st.one_of(st.integers(0, 6), st.just(INT64_MAX), st.integers(0, INT64_MAX))
entry_ids = st.one_of(st.integers(-1, 6), st.just(INT64_MAX), st.integers(-1, INT64_MAX))

txn_tuples = st.tuples(ids, ids)
entry_position_tuples = st.tuples(ids, ids)  # real entries: both ids >= 0
position_tuples = st.one_of(
    st.tuples(entry_ids, entry_ids),
    st.sampled_from([(-1, -1), (INT64_MAX, INT64_MAX), (0, -1), (0, 0)]),
)

# A signed 64-bit word, biased to all-ones, zero and single bits.
words = st.one_of(
    st.sampled_from([0, -1, 1, INT64_MAX, -(2**63)]),
    st.integers(0, 63).map(lambda b: (1 << b) - (2**64 if b == 63 else 0)),
    st.integers(-(2**63), INT64_MAX),
)
ack_sets = st.lists(words, max_size=5)
batch_sizes = st.integers(0, 64 * 6 + 3)


def position(p: tuple[int, int]) -> k.Position:
    return k.Position(*p)


def txn(t: tuple[int, int]) -> k.TxnId:
    return k.TxnId(*t)


def int64_column(values: Sequence[int | None], layout: Layout, null_as: int = -1) -> object:
    """NumPy layouts have no nulls: they stand for ``null_as`` there."""
    if layout == "arrow":
        return pa.array(values, type=pa.int64())
    filled = np.array([null_as if v is None else v for v in values], dtype=np.int64)
    return strided(filled) if layout == "strided" else filled


def bool_column(values: Sequence[bool | None], layout: Layout) -> object:
    """NumPy layouts have no nulls: they stand for True there (an unknown flag is set)."""
    if layout == "arrow":
        return pa.array(values, type=pa.bool_())
    filled = np.array([True if v is None else bool(v) for v in values], dtype=np.bool_)
    return strided(filled) if layout == "strided" else filled


def strided(array: np.ndarray) -> np.ndarray:
    """The same values as a non-contiguous view (every other element of a doubled array)."""
    doubled = np.repeat(array, 2)
    view = doubled[::2]
    assert not view.flags.c_contiguous or len(view) <= 1
    return view
