"""The READ_COMMITTED visibility mask."""

from __future__ import annotations

import gc

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyengine_kernels import AbortedTxnSet, Position, TxnId, visibility_mask
from tests.kernels.strategies import INT64_MAX, LAYOUTS, Layout, bool_column, int64_column
from tests.reference import kernels as ref

small_ids = st.one_of(st.none(), st.integers(-2, 4), st.just(INT64_MAX))
rows = st.lists(
    st.tuples(
        st.integers(0, 3),  # ledger
        st.one_of(st.integers(0, 4), st.just(INT64_MAX)),  # entry
        small_ids,  # most
        small_ids,  # least
        st.one_of(st.none(), st.booleans()),  # is_marker
    ),
    max_size=300,
)
aborted_txns = st.lists(st.tuples(st.integers(0, 4), st.one_of(st.integers(0, 4), st.just(INT64_MAX))), max_size=8)
max_positions = st.one_of(
    st.tuples(st.integers(-1, 4), st.integers(-1, 5)),
    st.sampled_from([(-1, -1), (INT64_MAX, INT64_MAX), (3, INT64_MAX)]),
)


def build_aborted(txns: list[tuple[int, int]]) -> tuple[AbortedTxnSet, ref.AbortedTxnSet]:
    native, model = AbortedTxnSet(), ref.AbortedTxnSet()
    for t in txns:
        native.add(TxnId(*t), Position(0, 0))
        model.add(t, (0, 0))
    return native, model


def columns(data, layouts: tuple[Layout, ...]) -> list[object]:
    ledger, entry, most, least, marker = (list(c) for c in zip(*data)) if data else ([],) * 5
    return [
        int64_column(ledger, layouts[0]),
        int64_column(entry, layouts[1]),
        int64_column(most, layouts[2]),
        int64_column(least, layouts[3]),
        bool_column(marker, layouts[4]),
    ]


def expected(data, max_position, model) -> list[bool]:
    if not data:
        return []
    ledger, entry, most, least, marker = zip(*data)
    return ref.visibility_mask(ledger, entry, most, least, marker, max_position, model)


@given(rows, aborted_txns, max_positions, st.tuples(*[st.sampled_from(LAYOUTS)] * 5))
def test_matches_reference(data, txns, max_position, layouts) -> None:
    native, model = build_aborted(txns)
    got = visibility_mask(*columns(data, layouts), Position(*max_position), native)
    if "arrow" in layouts:
        assert isinstance(got, pa.BooleanArray) and got.null_count == 0
        got = got.to_pylist()
    else:
        assert isinstance(got, np.ndarray) and got.dtype == np.bool_
        got = got.tolist()
    # NumPy layouts stand nulls in as -1 / False, which must mean the same.
    assert got == expected(data, max_position, model)


@given(st.integers(0, 700), st.integers(0, 50), st.integers(0, 50), st.booleans())
def test_block_boundaries_and_sliced_arrow(n: int, start: int, cut: int, abort: bool) -> None:
    """Lengths around 64-row blocks and Arrow arrays with non-zero offsets."""
    rng = np.random.default_rng(n * 7919 + start)
    total = start + n + cut
    ledger = rng.integers(0, 3, total)
    entry = rng.integers(0, 3, total)
    most = rng.integers(-1, 3, total)
    least = rng.integers(-1, 3, total)
    marker = rng.random(total) < 0.2
    nulls = rng.random(total) < 0.1
    native, model = build_aborted([(1, 1), (2, 0)] if abort else [])
    arrow = [
        pa.array(ledger), pa.array(entry),
        pa.array(most, mask=nulls), pa.array(least),
        pa.array(marker, mask=rng.random(total) < 0.1),
    ]
    sliced = [a.slice(start, n) for a in arrow]
    got = visibility_mask(*sliced, Position(1, 1), native)
    assert got.to_pylist() == ref.visibility_mask(
        *(a.to_pylist() for a in sliced), (1, 1), model
    )


def test_hand_computed_example() -> None:
    aborted = AbortedTxnSet()
    aborted.add(TxnId(1, 5), Position(3, 0))
    mask = visibility_mask(
        np.array([1, 1, 2, 2, 2, 3]),
        np.array([0, 1, 0, 1, 2, 0]),
        np.array([1, -1, 1, 1, 2, -1]),
        np.array([5, -1, 6, 6, 5, -1]),
        np.array([False, False, True, False, False, False]),
        Position(2, 2),
        aborted,
    )
    # aborted txn | plain | marker | committed txn | other coordinator | beyond max read
    assert mask.tolist() == [False, True, False, True, True, False]


def test_empty_inputs() -> None:
    e = np.array([], dtype=np.int64)
    assert visibility_mask(e, e, e, e, np.array([], dtype=bool), Position.LATEST, AbortedTxnSet()).tolist() == []
    ea = pa.array([], pa.int64())
    got = visibility_mask(ea, ea, ea, ea, pa.array([], pa.bool_()), Position.LATEST, AbortedTxnSet())
    assert isinstance(got, pa.BooleanArray) and len(got) == 0


def test_arrow_result_is_exported_and_released() -> None:
    n = 100_000
    aborted = AbortedTxnSet()
    aborted.add(TxnId(0, 3), Position(0, 0))
    ledger = pa.array(np.zeros(n, dtype=np.int64))
    entry = pa.array(np.arange(n, dtype=np.int64))
    most = pa.array(np.zeros(n, dtype=np.int64))
    least = pa.array(np.arange(n, dtype=np.int64) % 5)
    marker = pa.array(np.zeros(n, dtype=bool))
    gc.collect()
    before = pa.total_allocated_bytes()
    for _ in range(20):
        got = visibility_mask(ledger, entry, most, least, marker, Position(0, n), aborted)
        # Output buffers are Rust-owned, not from pyarrow's pool: no copy was made.
        assert pa.total_allocated_bytes() == before
        assert got.true_count == n - (n // 5)
        del got
    gc.collect()
    # Imported inputs were released (they would pin nothing new, but a leak of the release
    # callback would show up as pool bytes never returned for freshly built inputs).
    fresh = pa.array(np.arange(n, dtype=np.int64))
    visibility_mask(fresh, fresh, fresh, fresh, marker, Position.LATEST, aborted)
    del fresh
    gc.collect()
    assert pa.total_allocated_bytes() == before


def test_large_mask_one_million_rows() -> None:
    n = 1_000_000
    rng = np.random.default_rng(3)
    ledger = np.repeat(np.arange(10, dtype=np.int64), n // 10)
    entry = np.tile(np.arange(n // 10, dtype=np.int64), 10)
    txn = np.arange(n, dtype=np.int64) // 7
    most = txn % 4
    least = txn
    least[rng.random(n) < 0.3] = -1
    marker = rng.random(n) < 0.01
    aborted = AbortedTxnSet()
    aborted_txns = rng.choice(n // 7, 5_000, replace=False)
    for t in aborted_txns:
        aborted.add(TxnId(int(t % 4), int(t)), Position(0, 0))
    max_read = Position(8, 5_000)
    numpy_mask = (
        ((ledger < 8) | ((ledger == 8) & (entry <= 5_000)))
        & ~marker
        & ~((least >= 0) & np.isin(least, aborted_txns))
    )
    got = visibility_mask(ledger, entry, most, least, marker, max_read, aborted)
    assert np.array_equal(got, numpy_mask)
    arrow_got = visibility_mask(*map(pa.array, (ledger, entry, most, least, marker)), max_read, aborted)
    assert np.array_equal(arrow_got.to_numpy(zero_copy_only=False), numpy_mask)


E = np.zeros(3, dtype=np.int64)
B = np.zeros(3, dtype=bool)


def test_dense_and_roaring_coordinators_across_tasks() -> None:
    """Several parallel tasks of rows in 7-row txns: coordinator 1's aborted sequence numbers
    are probed in a dense array, coordinator 2's (spread too wide) in its roaring bitmap."""
    n = 300_000
    txn = np.arange(n, dtype=np.int64) // 7
    most = np.where(txn % 3 == 0, -1, txn % 3)
    least = np.where(most == 2, txn << 30, np.where(most == 1, txn, -1))
    aborted = AbortedTxnSet()
    keys = set(zip(most[::49].tolist(), least[::49].tolist())) - {(-1, -1)}
    for m, q in keys:
        aborted.add(TxnId(m, q), Position(0, 0))
    assert {m for m, _ in keys} == {1, 2}
    in_aborted = np.array([(m, q) in keys for m, q in zip(most.tolist(), least.tolist())])
    mask = visibility_mask(np.zeros(n, dtype=np.int64), np.arange(n, dtype=np.int64), most, least,
                           np.zeros(n, dtype=np.bool_), Position.LATEST, aborted)
    assert np.array_equal(mask, ~in_aborted)
    assert np.array_equal(aborted.contains_many(most, least), in_aborted)


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((E, E, E, E, np.zeros(4, dtype=bool)), ValueError, "length mismatch"),
        ((E, E[:2], E, E, B), ValueError, "length mismatch.*entry_id"),
        ((E.astype(np.int32), E, E, E, B), TypeError, "ledger_id.*int64.*int32"),
        ((E, E, E, E, B.astype(np.int64)), TypeError, "is_marker.*bool"),
        ((E, E, E, E.astype(np.uint64), B), TypeError, "txnid_least"),
        ((E, E, [0, 0, 0], E, B), TypeError, "txnid_most"),
        ((E, E, E, E, [False] * 3), TypeError, "is_marker"),
        ((E.reshape(3, 1), E, E, E, B), ValueError, "1-D"),
        ((pa.array([0, None, 0]), E, E, E, B), ValueError, "ledger_id.*nulls"),
        ((E, pa.array([0, 0, 0], pa.int32()), E, E, B), TypeError, "entry_id.*int64"),
        ((E, E, E, E, pa.array([1, 0, 1], pa.int8())), TypeError, "is_marker.*bool"),
        ((pa.chunked_array([[0, 0], [0]]), E, E, E, B), TypeError, "combine_chunks"),
    ],
)
def test_malformed_columns(args, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        visibility_mask(*args, Position.LATEST, AbortedTxnSet())


def test_malformed_position_and_set() -> None:
    with pytest.raises(TypeError):
        visibility_mask(E, E, E, E, B, (1, 2), AbortedTxnSet())
    with pytest.raises(TypeError):
        visibility_mask(E, E, E, E, B, Position.LATEST, set())


def test_foreign_arrow_producer_is_accepted() -> None:
    """Any object exposing __arrow_c_array__ works, not only pyarrow arrays."""

    class Producer:
        def __init__(self, array: pa.Array) -> None:
            self.array = array

        def __arrow_c_array__(self, requested_schema=None):
            return self.array.__arrow_c_array__(requested_schema)

    col = Producer(pa.array([0, 1, 2]))
    got = visibility_mask(col, col, col, col, Producer(pa.array([False, True, None])), Position(1, 1), AbortedTxnSet())
    assert got.to_pylist() == [True, False, False]


def test_bad_arrow_producer_is_a_type_error() -> None:
    class Liar:
        def __arrow_c_array__(self, requested_schema=None):
            return ("not", "capsules")

    with pytest.raises(TypeError, match="PyCapsules"):
        visibility_mask(Liar(), E, E, E, B, Position.LATEST, AbortedTxnSet())


def test_numpy_bools_that_are_not_zero_or_one() -> None:
    """A uint8 buffer viewed as bool may hold any byte; NumPy treats non-zero as True."""
    is_marker = np.array([0, 2, 255, 1, 0], dtype=np.uint8).view(np.bool_)
    zeros = np.zeros(5, dtype=np.int64)
    got = visibility_mask(zeros, zeros, zeros - 1, zeros - 1, is_marker, Position.LATEST, AbortedTxnSet())
    assert got.tolist() == [True, False, False, False, True]


def test_gil_is_released_and_concurrent_mutation_is_refused() -> None:
    """While the kernel runs on one thread, another thread runs Python code; mutating the
    aborted set the kernel is reading raises RuntimeError rather than racing."""
    import threading

    n = 4_000_000
    zeros = np.zeros(n, dtype=np.int64)
    least = np.arange(n, dtype=np.int64)
    aborted = AbortedTxnSet()
    for i in range(0, 300_000, 3):
        aborted.add(TxnId(0, i), Position(0, 0))
    done = threading.Event()

    def work() -> None:
        for _ in range(4):
            visibility_mask(zeros, least, zeros, least, np.zeros(n, dtype=bool), Position.LATEST, aborted)
        done.set()

    worker = threading.Thread(target=work)
    worker.start()
    refused = 0
    while not done.is_set():
        try:
            aborted.remove(TxnId(9, 1))  # a no-op, but it needs exclusive access
        except RuntimeError as e:
            assert "borrow" in str(e)
            refused += 1
    worker.join()
    assert refused > 0  # only possible if Python code ran during a kernel call
    assert len(aborted) == 100_000
