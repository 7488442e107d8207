"""NumPy int64 columns whose stride is not a whole number of elements, or whose data is not
aligned, give the same results as their contiguous copies, in every kernel taking columns.

Such arrays are ordinary NumPy: a field of a packed structured array (`rec["ledger_id"]` of a
`[("flag", "i1"), ("ledger_id", "<i8")]` array has a 9-byte stride), views made with explicit strides, a
`frombuffer` at an odd offset. The kernels viewed them in whole elements (the byte stride
divided by 8, rounded down) and read the wrong values, silently: `ackset_and` of words at a
12-byte stride returned `[7, 34359738368]` for `[7, 8, 9]`, `contains_many` missed aborted rows.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyengine_kernels as k
from pyengine_kernels import AbortedTxnSet, Position, TxnId
from tests.kernels.strategies import INT64_MAX

KINDS = ("packed_field", "stride_12", "unaligned", "reversed_packed_field")


def odd(values, kind: str) -> np.ndarray:
    """An int64 array holding `values`, laid out as `kind` (never aligned to 8 bytes)."""
    values = np.asarray(values, dtype=np.int64)
    n = len(values)
    if kind in ("packed_field", "reversed_packed_field"):
        packed = np.zeros(n, dtype=np.dtype([("flag", "i1"), ("v", "<i8")]))
        packed["v"] = values[::-1] if kind.startswith("reversed") else values
        column = packed["v"][::-1] if kind.startswith("reversed") else packed["v"]
    elif kind == "stride_12":
        raw = np.zeros(12 * n + 12, dtype=np.uint8)
        column = np.ndarray(shape=(n,), dtype=np.int64, buffer=raw.data, offset=4, strides=(12,))
        column[:] = values
    else:
        raw = np.zeros(8 * n + 1, dtype=np.uint8)
        column = np.ndarray(shape=(n,), dtype=np.int64, buffer=raw.data, offset=1)
        column[:] = values
    assert column.tolist() == values.tolist() and not column.flags.aligned
    return column


small = st.integers(0, 5)
rows = st.lists(st.tuples(small, small, st.integers(-1, 4), st.integers(-1, 4), st.booleans()), min_size=1,
                max_size=200)


@settings(max_examples=60, deadline=None)
@given(rows=rows, aborted=st.sets(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=6),
       kind=st.sampled_from(KINDS))
def test_visibility_and_membership_read_every_row(rows, aborted, kind):
    native = AbortedTxnSet()
    for most, least in aborted:
        native.add(TxnId(most, least), Position(9, 9))
    ledger, entry, most, least, marker = (np.array(c) for c in zip(*rows))
    marker = marker.astype(np.bool_)
    want = k.visibility_mask(ledger, entry, most, least, marker, Position(3, 3), native)
    got = k.visibility_mask(odd(ledger, kind), odd(entry, kind), odd(most, kind), odd(least, kind), marker,
                            Position(3, 3), native)
    assert got.tolist() == want.tolist()
    assert native.contains_many(odd(most, kind), odd(least, kind)).tolist() == \
        native.contains_many(most, least).tolist() == [(m, s) in aborted for m, s in zip(most, least)]


@pytest.mark.parametrize("kind", KINDS)
def test_ack_sets_read_every_word(kind):
    a = [7, 8, 9, INT64_MAX]
    b = [-1, -1, 5, 1]
    assert k.ackset_and(odd(a, kind), odd(b, kind)) == k.ackset_and(a, b) == [7, 8, 1, 1]
    assert k.ackset_or(odd(a, kind), b) == k.ackset_or(a, b)
    assert k.ackset_andnot(a, odd(b, kind)) == k.ackset_andnot(a, b)
    assert k.ackset_unacked_count(odd(a, kind), 256) == k.ackset_unacked_count(a, 256)
    assert k.ackset_acked_indexes(odd(a, kind), 256) == k.ackset_acked_indexes(a, 256)
    assert k.ackset_is_fully_acked(odd([0, 0, 1], kind)) is False


@pytest.mark.parametrize("kind", KINDS)
def test_ragged_ack_sets_read_every_offset_and_word(kind):
    offsets, words = [0, 1, 1, 3, 4], [7, 0, 9, 0]
    other_offsets, other_words = [0, 2, 3, 3, 4], [-1, -1, 5, 6]
    sizes = [64, 0, 128, 64]
    contiguous = [np.array(v, dtype=np.int64) for v in (offsets, words, other_offsets, other_words)]
    strange = [odd(v, kind) for v in (offsets, words, other_offsets, other_words)]
    for op in ("and", "or", "andnot"):
        want = k.ackset_merge_many(op, *contiguous)
        got = k.ackset_merge_many(op, *strange)
        assert [g.tolist() for g in got] == [w.tolist() for w in want], op
    assert k.ackset_fully_acked_many(strange[0], strange[1], odd(sizes, kind)).tolist() == \
        k.ackset_fully_acked_many(contiguous[0], contiguous[1], np.array(sizes)).tolist() == [False, True, False, True]
    assert k.ackset_conflicts_many(*strange, odd(sizes, kind)).tolist() == \
        k.ackset_conflicts_many(*contiguous, np.array(sizes)).tolist()
