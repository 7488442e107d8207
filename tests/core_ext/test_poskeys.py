"""core_ext.poskeys against the pure-Python reference, and the ordering property."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_ext.poskeys import pack_i64, pack_position, pack_positions, unpack_i64, unpack_position
from tests.reference import poskeys as ref

PROPERTY = settings(max_examples=300, deadline=None)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
EDGES = [INT64_MIN, INT64_MIN + 1, -(2**32), -1, 0, 1, 2**32, INT64_MAX - 1, INT64_MAX]
int64s = st.one_of(st.sampled_from(EDGES), st.integers(INT64_MIN, INT64_MAX))
positions = st.tuples(int64s, int64s)


def test_known_encodings():
    assert pack_i64(0) == bytes.fromhex("8000000000000000")
    assert pack_i64(-1) == bytes.fromhex("7fffffffffffffff")
    assert pack_i64(INT64_MIN) == bytes(8)
    assert pack_i64(INT64_MAX) == b"\xff" * 8
    assert pack_position(7, -1) == bytes.fromhex("8000000000000007 7fffffffffffffff")


@given(positions)
@PROPERTY
def test_position_round_trip_matches_reference(position):
    key = pack_position(*position)
    assert key == ref.pack_position(*position)
    assert len(key) == 16
    assert unpack_position(key) == position == ref.unpack_position(key)
    assert unpack_position(bytearray(key)) == unpack_position(memoryview(key)) == position


@given(int64s)
@PROPERTY
def test_i64_round_trip_matches_reference(value):
    key = pack_i64(value)
    assert key == ref.pack_i64(value)
    assert unpack_i64(key) == value == ref.unpack_i64(key)


@given(st.lists(positions, max_size=50))
@PROPERTY
def test_key_order_is_position_order(items):
    assert sorted(items, key=lambda p: pack_position(*p)) == sorted(items)
    values = [ledger for ledger, _ in items]
    assert sorted(values, key=pack_i64) == sorted(values)


@given(st.lists(positions, max_size=50))
@PROPERTY
def test_pack_positions_from_sequences_and_arrays(items):
    ledgers = [ledger for ledger, _ in items]
    entries = [entry for _, entry in items]
    expected = ref.pack_positions(ledgers, entries)
    assert pack_positions(ledgers, entries) == expected
    assert pack_positions(tuple(ledgers), iter(entries)) == expected
    ledger_array = np.array(ledgers, dtype=np.int64)
    entry_array = np.array(entries, dtype=np.int64)
    assert pack_positions(ledger_array, entry_array) == expected
    assert pack_positions(ledger_array, entries) == expected


def test_pack_positions_reads_any_int64_array_layout():
    ledgers = np.arange(-5, 15, dtype=np.int64)
    entries = ledgers * -3
    pairs = zip(ledgers[::3], entries[::3], strict=True)
    expected = [pack_position(int(ledger), int(entry)) for ledger, entry in pairs]
    assert pack_positions(ledgers[::3], entries[::3]) == expected                # strided
    assert pack_positions(ledgers[::3].astype(">i8"), entries[::3]) == expected  # big-endian
    assert pack_positions(ledgers[::3].astype(np.int32), entries[::3]) == expected
    unaligned = np.frombuffer(b"\x00" + ledgers[::3].tobytes(), dtype=np.int64, offset=1)
    assert pack_positions(unaligned, entries[::3]) == expected


def test_pack_positions_rejects_unsigned_values_out_of_range():
    with pytest.raises(OverflowError, match=r"ledger_ids\[1\]"):
        pack_positions(np.array([1, 2**63], dtype=np.uint64), [1, 2])
    assert pack_positions(np.array([1, 2], dtype=np.uint64), [3, 4]) == [
        pack_position(1, 3), pack_position(2, 4)]


def test_pack_positions_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="3 values but entry_ids has 2"):
        pack_positions([1, 2, 3], [1, 2])
    with pytest.raises(ValueError):
        pack_positions(np.zeros(2, dtype=np.int64), np.zeros(3, dtype=np.int64))


@pytest.mark.parametrize("ledgers, entries", [
    ([2**63], [0]),
    ([0], [INT64_MIN - 1]),
    ([0, 1], [0, 2**100]),
])
def test_pack_positions_rejects_values_outside_int64(ledgers, entries):
    with pytest.raises(OverflowError, match="outside the signed 64-bit range"):
        pack_positions(ledgers, entries)


@pytest.mark.parametrize("ledgers, entries", [
    ([1.5], [0]),
    (["1"], [0]),
    (np.array([1.0]), [0]),
    (5, [0]),
    ([0], None),
    (np.int64(3), [0]),
])
def test_pack_positions_rejects_non_integers(ledgers, entries):
    with pytest.raises(TypeError):
        pack_positions(ledgers, entries)


@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1, 2**64, -(2**100)])
def test_values_outside_int64_are_rejected_clearly(value):
    with pytest.raises(OverflowError, match="outside the signed 64-bit range"):
        pack_i64(value)
    with pytest.raises(OverflowError, match="ledger_id="):
        pack_position(value, 0)
    with pytest.raises(OverflowError, match="entry_id="):
        pack_position(0, value)


@pytest.mark.parametrize("value", [1.0, "1", None, b"\x01"])
def test_non_integers_are_rejected(value):
    with pytest.raises(TypeError):
        pack_i64(value)
    with pytest.raises(TypeError):
        pack_position(value, 0)
    with pytest.raises(TypeError):
        pack_position(0, value)


def test_integer_likes_are_accepted():
    assert pack_i64(np.int64(-3)) == pack_i64(-3)
    assert pack_position(np.uint32(5), True) == pack_position(5, 1)


@pytest.mark.parametrize("size", [0, 7, 8, 15, 17, 32])
def test_unpack_position_needs_16_bytes(size):
    with pytest.raises(ValueError, match="16 bytes"):
        unpack_position(bytes(size))


@pytest.mark.parametrize("size", [0, 7, 9, 16])
def test_unpack_i64_needs_8_bytes(size):
    with pytest.raises(ValueError, match="8 bytes"):
        unpack_i64(bytes(size))


@pytest.mark.parametrize("function", [unpack_position, unpack_i64])
def test_unpack_rejects_non_bytes(function):
    for bad in ("x" * 16, None, 12345):
        with pytest.raises(TypeError):
            function(bad)
