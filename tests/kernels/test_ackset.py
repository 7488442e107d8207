"""Batch-index ack sets (Java BitSet words, a set bit = still unacked)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pyengine_kernels as k
from tests.kernels.strategies import INT64_MAX, LAYOUTS, Layout, ack_sets, batch_sizes, int64_column, strided
from tests.reference import kernels as ref

MERGES = {"and": (k.ackset_and, ref.ackset_and), "or": (k.ackset_or, ref.ackset_or),
          "andnot": (k.ackset_andnot, ref.ackset_andnot)}


def test_new() -> None:
    assert k.ackset_new(0) == []
    assert k.ackset_new(1) == [1]
    assert k.ackset_new(64) == [-1]
    assert k.ackset_new(65) == [-1, 1]
    assert k.ackset_new(130) == [-1, -1, 3]


def test_java_bitset_semantics_for_different_lengths() -> None:
    assert k.ackset_and([-1, 5], [3]) == [3]
    assert k.ackset_or([1], [0, 2]) == [1, 2]
    assert k.ackset_andnot([3, 4], [1]) == [2, 4]
    assert k.ackset_andnot([1], [1, 7]) == []
    # Trailing zero words are trimmed like BitSet.toLongArray().
    assert k.ackset_and([1, 2], [1, 4]) == [1]
    assert k.ackset_or([0, 0], []) == []


def test_fully_acked() -> None:
    assert k.ackset_is_fully_acked([])
    assert k.ackset_is_fully_acked([0, 0])
    assert not k.ackset_is_fully_acked([0, 1])
    # Bits at or above the batch size do not count.
    assert k.ackset_is_fully_acked([1 << 5], batch_size=5)
    assert not k.ackset_is_fully_acked([1 << 5], batch_size=6)


def test_conflicts_ignore_padding_bits_unlike_pulsar() -> None:
    # Batch of 10: a acks 0-4, b acks 5-9. Above index 9 both have clear (padding) bits,
    # which Pulsar's isAckSetOverlap reports as an overlap; there is none.
    a = k.ackset_andnot(k.ackset_new(10), [0b11111])
    b = k.ackset_andnot(k.ackset_new(10), [0b1111100000])
    assert not k.ackset_conflicts(a, b, 10)
    assert k.ackset_conflicts(a, k.ackset_andnot(k.ackset_new(10), [0b10000]), 10)


def test_conflicts_with_trimmed_fully_acked_set() -> None:
    # A fully acked entry is [] after trimming; acking index 3 again is a conflict
    # (Pulsar's word-wise AND over zero words misses it).
    partial = k.ackset_andnot(k.ackset_new(8), [1 << 3])
    assert k.ackset_conflicts([], partial, 8)
    assert not k.ackset_conflicts([], k.ackset_new(8), 8)
    assert not k.ackset_conflicts([], [], 0)


def test_acked_indexes_and_unacked_count() -> None:
    a = [0b1010]
    assert k.ackset_acked_indexes(a, 5) == [0, 2, 4]
    assert k.ackset_unacked_count(a, 5) == 2
    assert k.ackset_acked_indexes([], 3) == [0, 1, 2]
    assert k.ackset_unacked_count([-1, -1], 70) == 70


@given(st.sampled_from(sorted(MERGES)), ack_sets, ack_sets)
def test_merges_match_reference(op: str, a: list[int], b: list[int]) -> None:
    native, model = MERGES[op]
    assert native(a, b) == model(a, b)


@given(batch_sizes)
def test_new_matches_reference(size: int) -> None:
    assert k.ackset_new(size) == ref.ackset_new(size)
    assert k.ackset_unacked_count(k.ackset_new(size), size) == size


@given(ack_sets, st.one_of(st.none(), batch_sizes))
def test_fully_acked_matches_reference(a: list[int], size: int | None) -> None:
    assert k.ackset_is_fully_acked(a, size) == ref.ackset_is_fully_acked(a, size)


@given(ack_sets, ack_sets, batch_sizes)
def test_conflicts_match_reference(a: list[int], b: list[int], size: int) -> None:
    assert k.ackset_conflicts(a, b, size) == ref.ackset_conflicts(a, b, size)


@given(ack_sets, batch_sizes)
def test_indexes_and_counts_match_reference(a: list[int], size: int) -> None:
    assert k.ackset_acked_indexes(a, size) == ref.ackset_acked_indexes(a, size)
    assert k.ackset_unacked_count(a, size) == ref.ackset_unacked_count(a, size)


@given(ack_sets, ack_sets)
def test_numpy_arrow_and_tuple_words_accepted(a: list[int], b: list[int]) -> None:
    want = ref.ackset_and(a, b)
    assert k.ackset_and(np.array(a, dtype=np.int64), tuple(b)) == want
    assert k.ackset_and(strided(np.array(a, dtype=np.int64)), pa.array(b, pa.int64())) == want


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: k.ackset_new(-1), ValueError),
        (lambda: k.ackset_new(2**31), ValueError),
        (lambda: k.ackset_new("3"), TypeError),
        (lambda: k.ackset_and([2**63], []), ValueError),
        (lambda: k.ackset_and([-(2**63) - 1], []), ValueError),
        (lambda: k.ackset_and(["1"], []), TypeError),
        (lambda: k.ackset_and(5, []), TypeError),
        (lambda: k.ackset_and("abc", []), TypeError),
        (lambda: k.ackset_or([1], np.array([1], dtype=np.uint64)), TypeError),
        (lambda: k.ackset_or([1], np.array([1.0])), TypeError),
        (lambda: k.ackset_or([1], pa.array([1, None])), ValueError),
        (lambda: k.ackset_andnot([1], np.zeros((1, 1), dtype=np.int64)), ValueError),
        (lambda: k.ackset_is_fully_acked([1], batch_size=-1), ValueError),
        (lambda: k.ackset_conflicts([1], [1], -5), ValueError),
        (lambda: k.ackset_acked_indexes([1], 2**40), ValueError),
        (lambda: k.ackset_unacked_count(None, 3), TypeError),
    ],
)
def test_malformed_scalar_arguments(call, error: type[Exception]) -> None:
    with pytest.raises(error):
        call()


def test_dtype_error_names_int64() -> None:
    with pytest.raises(TypeError, match="int64"):
        k.ackset_and(np.array([1], dtype=np.int32), [])


# Vectorised, ragged layout.

rows_of_sets = st.lists(st.tuples(ack_sets, ack_sets, batch_sizes), max_size=25)


def ragged_args(rows: list[list[int]], layout: Layout) -> tuple[object, object]:
    offsets, words = ref.ragged(rows)
    return int64_column(offsets, layout), int64_column(words, layout)


@given(st.sampled_from(sorted(MERGES)), rows_of_sets, st.sampled_from(LAYOUTS))
def test_merge_many_matches_reference(op: str, rows, layout: Layout) -> None:
    a_rows = [a for a, _, _ in rows]
    b_rows = [b for _, b, _ in rows]
    offsets, words = k.ackset_merge_many(op, *ragged_args(a_rows, layout), *ragged_args(b_rows, layout))
    assert offsets.dtype == np.int64 and words.dtype == np.int64
    model = MERGES[op][1]
    assert ref.ragged_rows(offsets.tolist(), words.tolist()) == [model(a, b) for a, b in zip(a_rows, b_rows)]
    assert offsets.tolist() == ref.ragged([model(a, b) for a, b in zip(a_rows, b_rows)])[0]


@given(rows_of_sets, st.booleans(), st.sampled_from(LAYOUTS))
def test_fully_acked_many_matches_reference(rows, with_sizes: bool, layout: Layout) -> None:
    sets = [a for a, _, _ in rows]
    sizes = [s for _, _, s in rows] if with_sizes else None
    got = k.ackset_fully_acked_many(
        *ragged_args(sets, layout), None if sizes is None else int64_column(sizes, layout)
    )
    assert got.dtype == np.bool_
    assert got.tolist() == [
        ref.ackset_is_fully_acked(a, None if sizes is None else sizes[i]) for i, a in enumerate(sets)
    ]


@given(rows_of_sets, st.sampled_from(LAYOUTS))
def test_conflicts_many_matches_reference(rows, layout: Layout) -> None:
    a_rows = [a for a, _, _ in rows]
    b_rows = [b for _, b, _ in rows]
    sizes = [s for _, _, s in rows]
    got = k.ackset_conflicts_many(
        *ragged_args(a_rows, layout), *ragged_args(b_rows, layout), int64_column(sizes, layout)
    )
    assert got.tolist() == [ref.ackset_conflicts(a, b, s) for a, b, s in rows]


@pytest.mark.parametrize("op", sorted(MERGES))
def test_merge_many_across_parallel_tasks_matches_reference(op: str) -> None:
    """Enough rows for several parallel tasks (4096 rows each): the outer thirds have equal
    lengths on both sides (merged as flat runs of words, the last third from different
    offsets), the middle third does not (merged row by row); frequent zero words make rows
    trim, leaving gaps between the tasks' outputs to close."""
    rng = np.random.default_rng(5)
    n = 30_000
    a_lengths = rng.integers(0, 4, n)
    b_lengths = a_lengths.copy()
    b_lengths[n // 3 : 2 * n // 3] = rng.integers(0, 4, 2 * n // 3 - n // 3)
    pool = np.array([0, 0, -1, 1, 2**62, -(2**63)], dtype=np.int64)
    a_rows = [rng.choice(pool, size).tolist() for size in a_lengths]
    b_rows = [rng.choice(pool, size).tolist() for size in b_lengths]
    offsets, words = k.ackset_merge_many(op, *ragged_args(a_rows, "numpy"), *ragged_args(b_rows, "numpy"))
    model = MERGES[op][1]
    expected = [model(a, b) for a, b in zip(a_rows, b_rows)]
    assert any(len(e) < max(len(a), len(b)) for a, b, e in zip(a_rows, b_rows, expected))
    assert ref.ragged_rows(offsets.tolist(), words.tolist()) == expected
    assert offsets.tolist() == ref.ragged(expected)[0]


def test_many_on_empty_inputs() -> None:
    zero = np.array([0], dtype=np.int64)
    none = np.array([], dtype=np.int64)
    offsets, words = k.ackset_merge_many("or", zero, none, zero, none)
    assert offsets.tolist() == [0] and words.tolist() == []
    assert k.ackset_fully_acked_many(zero, none).tolist() == []
    assert k.ackset_conflicts_many(zero, none, zero, none, none).tolist() == []


OK = np.array([0, 1, 2], dtype=np.int64)
W = np.array([1, 2], dtype=np.int64)
S = np.array([3, 3], dtype=np.int64)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: k.ackset_merge_many("xor", OK, W, OK, W), ValueError, "op must be one of"),
        (lambda: k.ackset_merge_many("and", [0, 1, 2], W, OK, W), TypeError, "a_offsets"),
        (lambda: k.ackset_merge_many("and", OK, W.astype(np.float64), OK, W), TypeError, "a_words.*int64"),
        (lambda: k.ackset_merge_many("and", OK, W, np.array([0, 2], dtype=np.int64), W), ValueError, "length mismatch"),
        (lambda: k.ackset_merge_many("and", np.array([], dtype=np.int64), W, OK, W), ValueError, "empty"),
        (lambda: k.ackset_merge_many("and", np.array([1, 1, 2], dtype=np.int64), W, OK, W), ValueError, "start with 0"),
        (lambda: k.ackset_merge_many("and", np.array([0, 2, 1], dtype=np.int64), W, OK, W), ValueError, "non-decreasing"),
        (lambda: k.ackset_merge_many("and", OK, W, np.array([0, 1, 3], dtype=np.int64), W), ValueError, "last offset"),
        (lambda: k.ackset_merge_many("and", OK, W, np.array([0, -1, 2], dtype=np.int64), W), ValueError, "b_offsets"),
        (lambda: k.ackset_merge_many("and", pa.array([0, None, 2]), W, OK, W), ValueError, "nulls"),
        (lambda: k.ackset_fully_acked_many(OK, W, np.array([1], dtype=np.int64)), ValueError, "length mismatch"),
        (lambda: k.ackset_fully_acked_many(OK, W, np.array([1, -1], dtype=np.int64)), ValueError, "batch_size"),
        (lambda: k.ackset_fully_acked_many(OK, W, [1, 1]), TypeError, "batch_sizes"),
        (lambda: k.ackset_fully_acked_many(np.array([0, 5], dtype=np.int64), W), ValueError, "last offset"),
        (lambda: k.ackset_conflicts_many(OK, W, OK, W, S.astype(np.int32)), TypeError, "batch_sizes"),
        (lambda: k.ackset_conflicts_many(OK, W, OK, W, np.array([3, 2**31], dtype=np.int64)), ValueError, "batch_size"),
        (lambda: k.ackset_conflicts_many(OK, W, OK, pa.chunked_array([[1, 2]]), S), TypeError, "combine_chunks"),
    ],
)
def test_malformed_vector_arguments(call, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()


def test_merge_many_scale_and_max_words() -> None:
    n = 1_000_000
    rng = np.random.default_rng(7)
    a_words = rng.integers(-(2**63), INT64_MAX, size=2 * n, dtype=np.int64, endpoint=True)
    b_words = rng.integers(-(2**63), INT64_MAX, size=n, dtype=np.int64, endpoint=True)
    a_offsets = np.arange(0, 2 * n + 1, 2, dtype=np.int64)
    b_offsets = np.arange(0, n + 1, dtype=np.int64)
    offsets, words = k.ackset_merge_many("and", a_offsets, a_words, b_offsets, b_words)
    assert len(offsets) == n + 1
    # Each result is (a0 & b0), trimmed when zero.
    expected = a_words[::2] & b_words
    assert words.tolist() == expected[expected != 0].tolist()
    assert np.array_equal(np.diff(offsets), (expected != 0).astype(np.int64))
