"""AbortedTxnSet: roaring bitmaps per coordinator, marker positions, serialisation."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pyarrow as pa
import pyroaring
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from pyengine_kernels import AbortedTxnSet, Position, TxnId
from tests.kernels.strategies import (
    INT64_MAX,
    LAYOUTS,
    Layout,
    entry_position_tuples,
    int64_column,
    position_tuples,
    txn_tuples,
)
from tests.reference import kernels as ref

aborts = st.lists(st.tuples(txn_tuples, entry_position_tuples), max_size=30)


def build(entries: list[tuple[tuple[int, int], tuple[int, int]]]) -> tuple[AbortedTxnSet, ref.AbortedTxnSet]:
    native, model = AbortedTxnSet(), ref.AbortedTxnSet()
    for t, p in entries:
        assert native.add(TxnId(*t), Position(*p)) == model.add(t, p)
    return native, model


def as_pairs(items: list[tuple[tuple[int, int], tuple[int, int]]]) -> list[tuple[TxnId, Position]]:
    return [(TxnId(*t), Position(*p)) for t, p in items]


def test_basic_membership() -> None:
    s = AbortedTxnSet()
    assert s.add(TxnId(1, 5), Position(2, 3))
    assert not s.add(TxnId(1, 5), Position(9, 9))
    assert TxnId(1, 5) in s and TxnId(1, 6) not in s
    assert s.contains(1, 5) and not s.contains(2, 5)
    assert s.items() == [(TxnId(1, 5), Position(2, 3))]
    assert s.coordinator_ids() == [1]
    assert s.remove(TxnId(1, 5)) and not s.remove(TxnId(1, 5))
    assert len(s) == 0 and s.coordinator_ids() == []


@pytest.mark.parametrize("most, least", [(-1, 5), (1, -1), (-1, -1), (-(2**63), 0)])
def test_negative_ids_are_never_aborted(most: int, least: int) -> None:
    s = AbortedTxnSet()
    s.add(TxnId(1, 5), Position(0, 0))
    assert not s.contains(most, least)


def test_trim_before_drops_markers_strictly_below() -> None:
    s = AbortedTxnSet()
    s.add(TxnId(0, 1), Position(1, 0))
    s.add(TxnId(0, 2), Position(2, 0))
    s.add(TxnId(1, 1), Position(2, 5))
    assert s.trim_before(Position(2, 0)) == 1
    assert s.items() == [(TxnId(0, 2), Position(2, 0)), (TxnId(1, 1), Position(2, 5))]
    assert s.trim_before(Position.LATEST) == 2
    assert not s.contains(1, 1) and s.coordinator_ids() == []


@pytest.mark.parametrize("position", [Position(3, -1), Position.EARLIEST])
def test_add_rejects_non_entry_marker(position: Position) -> None:
    with pytest.raises(ValueError, match="entry position"):
        AbortedTxnSet().add(TxnId(1, 1), position)


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda s: s.add((1, 1), Position(0, 0)), TypeError),
        (lambda s: s.remove((1, 1)), TypeError),
        (lambda s: s.contains("1", 2), TypeError),
        (lambda s: s.contains(2**63, 0), OverflowError),
        (lambda s: s.trim_before(5), TypeError),
        (lambda s: s.since((1, 2)), TypeError),
        (lambda s: s.update([(TxnId(1, 1), Position(0, 0))]), TypeError),
        (lambda s: s.update(s), RuntimeError),              # itself: borrowed while it changes
        (lambda s: s.bitmap_bytes(-1), ValueError),
        (lambda s: s.bitmap_bytes("1"), TypeError),
        (lambda s: AbortedTxnSet.from_bytes("text"), TypeError),
        (lambda s: s.contains_many([1, 2], [1, 2]), TypeError),
        (lambda s: s.contains_many(np.array([1.0]), np.array([1])), TypeError),
        (lambda s: s.contains_many(np.array([1], dtype=np.int32), np.array([1])), TypeError),
        (lambda s: s.contains_many(np.array([1]), np.array([1, 2])), ValueError),
        (lambda s: s.contains_many(np.zeros((2, 2), dtype=np.int64), np.zeros(4, dtype=np.int64)), ValueError),
        (lambda s: s.contains_many(pa.array([1], pa.int32()), pa.array([1])), TypeError),
        (lambda s: s.contains_many(pa.chunked_array([[1]]), pa.array([1])), TypeError),
    ],
)
def test_malformed_arguments(call, error: type[Exception]) -> None:
    with pytest.raises(error):
        call(AbortedTxnSet())


def test_dtype_error_names_expected_dtype() -> None:
    with pytest.raises(TypeError, match="int64.*float64"):
        AbortedTxnSet().contains_many(np.array([1.0]), np.array([1]))


def test_chunked_array_error_suggests_combine_chunks() -> None:
    with pytest.raises(TypeError, match="combine_chunks"):
        AbortedTxnSet().contains_many(pa.chunked_array([[1], [2]]), pa.array([1, 2]))


class AbortedMachine(RuleBasedStateMachine):
    txns = Bundle("txns")

    def __init__(self) -> None:
        super().__init__()
        self.native = AbortedTxnSet()
        self.model = ref.AbortedTxnSet()

    @rule(target=txns, t=txn_tuples)
    def new_txn(self, t: tuple[int, int]) -> tuple[int, int]:
        return t

    @rule(t=txns, p=entry_position_tuples)
    def add(self, t: tuple[int, int], p: tuple[int, int]) -> None:
        assert self.native.add(TxnId(*t), Position(*p)) == self.model.add(t, p)

    @rule(t=txns)
    def remove(self, t: tuple[int, int]) -> None:
        assert self.native.remove(TxnId(*t)) == self.model.remove(t)

    @rule(t=txns)
    def contains(self, t: tuple[int, int]) -> None:
        assert self.native.contains(*t) == self.model.contains(*t)
        assert (TxnId(*t) in self.native) == self.model.contains(*t)

    @rule(probes=st.lists(txns, max_size=8))
    def contains_many(self, probes: list[tuple[int, int]]) -> None:
        """Bulk probes use arrays cached by the set: every change above must reset them."""
        most = np.array([m for m, _ in probes], dtype=np.int64)
        least = np.array([q for _, q in probes], dtype=np.int64)
        assert self.native.contains_many(most, least).tolist() == [self.model.contains(*t) for t in probes]

    @rule(p=position_tuples)
    def trim_before(self, p: tuple[int, int]) -> None:
        assert self.native.trim_before(Position(*p)) == self.model.trim_before(p)

    @rule(p=position_tuples)
    def since(self, p: tuple[int, int]) -> None:
        """The part a trim before `p` keeps, as a new set; this one unchanged."""
        before = self.native.items()
        kept = self.native.since(Position(*p))
        assert kept.items() == as_pairs(self.model.since(p).items())
        assert self.native.items() == before
        copy = AbortedTxnSet.from_bytes(self.native.to_bytes())
        copy.trim_before(Position(*p))
        assert kept == copy

    @rule(others=aborts)
    def update(self, others: list[tuple[tuple[int, int], tuple[int, int]]]) -> None:
        native_other, model_other = build(others)
        assert self.native.update(native_other) == self.model.update(model_other)
        assert native_other.items() == as_pairs(model_other.items())     # the argument unchanged

    @rule()
    def last_marker_position(self) -> None:
        last = self.model.last_marker_position()
        assert self.native.last_marker_position() == (None if last is None else Position(*last))

    @rule()
    def round_trip(self) -> None:
        copy = AbortedTxnSet.from_bytes(self.native.to_bytes())
        assert copy == self.native
        assert copy.items() == self.native.items()

    @invariant()
    def same_contents(self) -> None:
        assert len(self.native) == len(self.model.markers)
        assert self.native.items() == as_pairs(self.model.items())
        assert self.native.coordinator_ids() == self.model.coordinator_ids()
        for most in self.model.coordinator_ids():
            bitmap = pyroaring.BitMap64.deserialize(self.native.bitmap_bytes(most))
            assert list(bitmap) == self.model.members(most)


TestAbortedMachine = AbortedMachine.TestCase


@given(aborts, st.lists(st.tuples(st.one_of(st.none(), st.integers(-3, 7), st.just(INT64_MAX)),
                                  st.one_of(st.none(), st.integers(-3, 7), st.just(INT64_MAX))),
                        max_size=40),
       st.sampled_from(LAYOUTS))
def test_contains_many_matches_reference(entries, probes, layout: Layout) -> None:
    native, model = build(entries)
    most = [m for m, _ in probes]
    least = [q for _, q in probes]
    got = native.contains_many(int64_column(most, layout), int64_column(least, layout))
    assert isinstance(got, np.ndarray) and got.dtype == np.bool_
    # NumPy layouts encode nulls as -1, which must mean the same thing.
    assert got.tolist() == [model.contains(m, q) for m, q in probes]


# Bulk probes read a dense bit array per coordinator when its span of aborted sequence
# numbers is at most 2**26, and the roaring bitmap otherwise (or past a 64 MiB total).
COORDINATORS = {
    0: [1_000 + 7 * i for i in range(5_000)],    # dense
    3: [5, 2**40],                                # span too wide: roaring
    2_000: [1, 2, 3],                             # dense, id beyond the directly indexed ones
    INT64_MAX: [0, INT64_MAX],                    # roaring, id beyond the directly indexed ones
}


def probe_columns() -> tuple[np.ndarray, np.ndarray]:
    """Members, their neighbours, the span ends and the extremes of every coordinator and of
    the coordinators next to them; several rows per txn, as in a topic."""
    pairs = []
    for most, members in COORDINATORS.items():
        for m in {most - 1, most, most + 1} - {INT64_MAX + 1}:
            for q in members[:50] + members[-50:] + [-1, 0, 4, 999, 2**26, 2**40 - 1, 2**40 + 1, INT64_MAX]:
                pairs += [(m, q), (m, q + 1), (m, q + 1)] if q < INT64_MAX else [(m, q)]
    pairs += [(-1, -1)] * 70
    most, least = np.array(pairs, dtype=np.int64).T
    return most.copy(), least.copy()


def test_bulk_probes_agree_with_scalar_ones_on_dense_and_roaring_coordinators() -> None:
    s = AbortedTxnSet()
    for most, members in COORDINATORS.items():
        for least in members:
            s.add(TxnId(most, least), Position(0, 0))
    most, least = probe_columns()
    expected = [s.contains(m, q) for m, q in zip(most.tolist(), least.tolist())]
    assert sum(expected) > 100
    assert s.contains_many(most, least).tolist() == expected
    assert s.contains_many(pa.array(most), pa.array(least)).tolist() == expected


def test_bulk_probes_see_every_change() -> None:
    s = AbortedTxnSet()
    s.add(TxnId(0, 10), Position(1, 0))
    s.add(TxnId(0, 20), Position(2, 0))
    most, least = np.zeros(4, dtype=np.int64), np.array([10, 15, 20, 25], dtype=np.int64)
    assert s.contains_many(most, least).tolist() == [True, False, True, False]
    s.add(TxnId(0, 15), Position(3, 0))           # inside the cached span
    s.add(TxnId(0, 25), Position(4, 0))           # beyond it
    assert s.contains_many(most, least).tolist() == [True, True, True, True]
    s.remove(TxnId(0, 20))
    assert s.contains_many(most, least).tolist() == [True, True, False, True]
    assert s.trim_before(Position(3, 0)) == 1
    assert s.contains_many(most, least).tolist() == [False, True, False, True]
    copy = AbortedTxnSet.from_bytes(s.to_bytes())
    assert copy.contains_many(most, least).tolist() == [False, True, False, True]
    s.add(TxnId(0, 2**40), Position(5, 0))        # the span outgrows its dense array
    least[0] = 2**40
    assert s.contains_many(most, least).tolist() == [True, True, False, True]


def test_bulk_probes_beyond_the_total_dense_budget() -> None:
    """Nine coordinators of 8 MiB spans: eight get dense arrays (64 MiB), one stays roaring."""
    s = AbortedTxnSet()
    for most in range(9):
        for least in (most, 2**26 - 1 - most):
            s.add(TxnId(most, least), Position(0, 0))
    most = np.repeat(np.arange(9, dtype=np.int64), 4)
    least = np.array([q for m in range(9) for q in (m, m + 1, 2**26 - 2 - m, 2**26 - 1 - m)], dtype=np.int64)
    assert s.contains_many(most, least).tolist() == [True, False, False, True] * 9


def test_contains_many_on_sliced_arrow_arrays() -> None:
    s = AbortedTxnSet()
    s.add(TxnId(1, 3), Position(0, 0))
    most = pa.array([9, None, 1, 1, 1])[1:]
    least = pa.array([9, 3, 3, None, 3])[1:]
    assert s.contains_many(most, least).tolist() == [False, True, False, True]


def test_contains_many_empty_inputs() -> None:
    s = AbortedTxnSet()
    s.add(TxnId(0, 0), Position(0, 0))
    assert s.contains_many(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).tolist() == []
    assert s.contains_many(pa.array([], pa.int64()), pa.array([], pa.int64())).tolist() == []


@given(aborts)
def test_bitmap_bytes_read_by_pyroaring(entries) -> None:
    native, model = build(entries)
    for most in model.coordinator_ids() + [12345]:
        bitmap = pyroaring.BitMap64.deserialize(native.bitmap_bytes(most))
        assert list(bitmap) == model.members(most)


def test_bitmap_bytes_equal_pyroaring_serialisation() -> None:
    s = AbortedTxnSet()
    members = [0, 1, 70_000, 2**32 + 5, INT64_MAX]
    for least in members:
        s.add(TxnId(3, least), Position(0, 0))
    assert s.bitmap_bytes(3) == pyroaring.BitMap64(members).serialize()


@given(aborts)
def test_serialisation_round_trip(entries) -> None:
    native, _ = build(entries)
    data = native.to_bytes()
    copy = AbortedTxnSet.from_bytes(data)
    assert copy == native
    assert copy.items() == native.items()
    assert copy.to_bytes() == data
    assert pickle.loads(pickle.dumps(native)) == native


def test_equality_ignores_insertion_order_but_not_markers() -> None:
    a, b = AbortedTxnSet(), AbortedTxnSet()
    a.add(TxnId(1, 1), Position(0, 1))
    a.add(TxnId(2, 2), Position(0, 2))
    b.add(TxnId(2, 2), Position(0, 2))
    b.add(TxnId(1, 1), Position(0, 1))
    assert a == b
    c = AbortedTxnSet()
    c.add(TxnId(1, 1), Position(0, 9))
    c.add(TxnId(2, 2), Position(0, 2))
    assert a != c
    assert a != "not a set"


def test_documented_format() -> None:
    s = AbortedTxnSet()
    s.add(TxnId(7, 2), Position(10, 20))
    data = s.to_bytes()
    bitmap = s.bitmap_bytes(7)
    assert data == (
        b"PEAB" + bytes([1]) + struct.pack("<Q", 1)
        + struct.pack("<qQ", 7, len(bitmap)) + bitmap + struct.pack("<qq", 10, 20)
    )
    assert AbortedTxnSet().to_bytes() == b"PEAB\x01" + bytes(8)


def _valid_serialisation() -> bytes:
    s = AbortedTxnSet()
    for i in range(20):
        s.add(TxnId(i % 3, i * 1000), Position(i, i))
    s.add(TxnId(5, INT64_MAX), Position(1, 1))
    return s.to_bytes()


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "truncated"),
        (b"XXXX\x01" + bytes(8), "magic"),
        (b"PEAB\x02" + bytes(8), "version"),
        (b"PEAB\x01" + bytes(8) + b"\x00", "trailing"),
        (b"PEAB\x01" + struct.pack("<Q", 2**64 - 1), "truncated"),
        (b"PEAB\x01" + struct.pack("<Qq", 1, -1), "negative or out of order"),
        (b"PEAB\x01" + struct.pack("<QqQ", 1, 0, 2**63), "truncated"),
    ],
)
def test_from_bytes_rejects_corrupt_input(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AbortedTxnSet.from_bytes(data)


def test_from_bytes_rejects_every_truncation() -> None:
    data = _valid_serialisation()
    for cut in range(len(data)):
        with pytest.raises(ValueError):
            AbortedTxnSet.from_bytes(data[:cut])


def test_from_bytes_rejects_negative_marker_and_empty_bitmap() -> None:
    s = AbortedTxnSet()
    s.add(TxnId(0, 1), Position(3, 4))
    data = bytearray(s.to_bytes())
    data[-8:] = struct.pack("<q", -1)
    with pytest.raises(ValueError, match="marker position"):
        AbortedTxnSet.from_bytes(bytes(data))
    empty = pyroaring.BitMap64().serialize()
    with pytest.raises(ValueError, match="empty bitmap"):
        AbortedTxnSet.from_bytes(b"PEAB\x01" + struct.pack("<QqQ", 1, 0, len(empty)) + empty)


def test_from_bytes_rejects_least_bits_beyond_int64() -> None:
    bitmap = pyroaring.BitMap64([2**63]).serialize()
    data = b"PEAB\x01" + struct.pack("<QqQ", 1, 0, len(bitmap)) + bitmap + struct.pack("<qq", 0, 0)
    with pytest.raises(ValueError, match="exceeds"):
        AbortedTxnSet.from_bytes(data)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(st.data())
def test_mutated_bytes_only_raise_value_error(data: st.DataObject) -> None:
    original = bytearray(_valid_serialisation())
    mutated = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "set", "insert", "delete"]))
        index = data.draw(st.integers(0, len(mutated) - 1))
        if kind == "flip":
            mutated[index] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set":
            mutated[index] = data.draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80]))
        elif kind == "insert":
            mutated[index:index] = data.draw(st.binary(min_size=1, max_size=9))
        else:
            del mutated[index : index + data.draw(st.integers(1, 9))]
    try:
        parsed = AbortedTxnSet.from_bytes(bytes(mutated))
    except ValueError:
        return
    # Accepted input must be canonical: it serialises back to itself.
    assert parsed.to_bytes() == bytes(mutated)


@given(st.binary(max_size=200))
def test_random_bytes_only_raise_value_error(data: bytes) -> None:
    for candidate in (data, b"PEAB\x01" + data):
        try:
            parsed = AbortedTxnSet.from_bytes(candidate)
        except ValueError:
            continue
        assert parsed.to_bytes() == candidate


def test_one_million_aborts_scale() -> None:
    s = AbortedTxnSet()
    for i in range(1_000_000):
        s.add(TxnId(i & 3, i), Position(i >> 10, i & 1023))
    probes = np.arange(2_000_000, dtype=np.int64)
    hits = s.contains_many(probes & 3, probes)
    assert hits.sum() == 1_000_000 and hits[:1_000_000].all()
    copy = AbortedTxnSet.from_bytes(s.to_bytes())
    assert len(copy) == 1_000_000
    assert s.trim_before(Position(500, 0)) == 500 * 1024
    assert len(s) == 1_000_000 - 500 * 1024
