"""Position and TxnId: Pulsar's value types."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyengine_kernels import Position, TxnId
from tests.kernels.strategies import INT64_MAX, ids, position_tuples, txn_tuples
from tests.reference import kernels as ref


class TestPosition:
    def test_fields_repr_str(self) -> None:
        p = Position(1, 2)
        assert (p.ledger_id, p.entry_id) == (1, 2)
        assert repr(p) == "Position(1, 2)"
        assert str(p) == "1:2"
        assert str(Position(-1, -1)) == "-1:-1"

    def test_earliest_latest(self) -> None:
        assert Position.EARLIEST == Position(-1, -1)
        assert Position.LATEST == Position(INT64_MAX, INT64_MAX)
        assert Position.EARLIEST < Position(0, 0) < Position.LATEST

    def test_prev_at_ledger_start_is_minus_one(self) -> None:
        assert Position(5, 0).prev() == Position(5, -1)
        assert Position(5, 7).prev() == Position(5, 6)

    @pytest.mark.parametrize("p", [Position(5, -1), Position.EARLIEST])
    def test_prev_of_minus_one_raises(self, p: Position) -> None:
        with pytest.raises(ValueError, match="no previous position"):
            p.prev()

    def test_next(self) -> None:
        assert Position(5, -1).next() == Position(5, 0)
        assert Position(5, 7).next() == Position(5, 8)
        with pytest.raises(ValueError):
            Position.LATEST.next()

    @pytest.mark.parametrize("args", [(-2, 0), (0, -2), (-(2**63), 0)])
    def test_below_minus_one_rejected(self, args: tuple[int, int]) -> None:
        with pytest.raises(ValueError, match=">= -1"):
            Position(*args)

    @pytest.mark.parametrize("args", [(2**63, 0), (0, 2**64)])
    def test_beyond_int64_rejected(self, args: tuple[int, int]) -> None:
        with pytest.raises((OverflowError, ValueError)):
            Position(*args)

    @pytest.mark.parametrize("args", [("1", 2), (1.0, 2), (None, 2), ((1, 2),)])
    def test_wrong_types_rejected(self, args: tuple[object, ...]) -> None:
        with pytest.raises(TypeError):
            Position(*args)  # type: ignore[arg-type]

    def test_immutable(self) -> None:
        p = Position(1, 2)
        with pytest.raises(AttributeError):
            p.ledger_id = 3  # type: ignore[misc]

    def test_not_equal_to_tuples(self) -> None:
        assert Position(1, 2) != (1, 2)
        with pytest.raises(TypeError):
            _ = Position(1, 2) < (1, 3)  # type: ignore[operator]

    @given(position_tuples, position_tuples)
    def test_order_is_lexicographic(self, a: tuple[int, int], b: tuple[int, int]) -> None:
        pa_, pb = Position(*a), Position(*b)
        assert (pa_ < pb) == (a < b)
        assert (pa_ <= pb) == (a <= b)
        assert (pa_ == pb) == (a == b)
        assert (pa_ > pb) == (a > b)
        assert (pa_ >= pb) == (a >= b)
        if a == b:
            assert hash(pa_) == hash(pb)

    @given(position_tuples)
    def test_prev_next_match_reference(self, t: tuple[int, int]) -> None:
        p = Position(*t)
        if t[1] == -1:
            with pytest.raises(ValueError):
                p.prev()
        else:
            assert p.prev() == Position(*ref.prev(t))
            assert p.prev().next() == p

    @given(position_tuples)
    def test_pickle_and_copy_round_trip(self, t: tuple[int, int]) -> None:
        p = Position(*t)
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            assert pickle.loads(pickle.dumps(p, protocol=proto)) == p
        assert copy.deepcopy(p) == p

    def test_usable_as_dict_key(self) -> None:
        d = {Position(1, 2): "a"}
        assert d[Position(1, 2)] == "a"


class TestTxnId:
    def test_fields_repr_str(self) -> None:
        t = TxnId(1, 2)
        assert (t.most_bits, t.least_bits) == (1, 2)
        assert repr(t) == "TxnId(1, 2)"
        assert str(t) == "(1,2)"

    @pytest.mark.parametrize("args", [(-1, 0), (0, -1), (-5, -5)])
    def test_negative_rejected(self, args: tuple[int, int]) -> None:
        with pytest.raises(ValueError, match=">= 0"):
            TxnId(*args)

    def test_beyond_int64_rejected(self) -> None:
        with pytest.raises((OverflowError, ValueError)):
            TxnId(2**63, 0)

    def test_wrong_types_rejected(self) -> None:
        with pytest.raises(TypeError):
            TxnId("1", 2)  # type: ignore[arg-type]

    def test_max_ids(self) -> None:
        t = TxnId(INT64_MAX, INT64_MAX)
        assert str(t) == f"({INT64_MAX},{INT64_MAX})"

    def test_immutable(self) -> None:
        with pytest.raises(AttributeError):
            TxnId(1, 2).most_bits = 3  # type: ignore[misc]

    @given(txn_tuples, txn_tuples)
    def test_order_eq_hash(self, a: tuple[int, int], b: tuple[int, int]) -> None:
        ta, tb = TxnId(*a), TxnId(*b)
        assert (ta < tb) == (a < b)
        assert (ta == tb) == (a == b)
        assert (ta >= tb) == (a >= b)
        if a == b:
            assert hash(ta) == hash(tb)

    @given(st.tuples(ids, ids))
    def test_pickle_round_trip(self, t: tuple[int, int]) -> None:
        txn = TxnId(*t)
        assert pickle.loads(pickle.dumps(txn)) == txn
        assert pickle.loads(pickle.dumps(txn, protocol=0)) == txn

    def test_distinct_from_position(self) -> None:
        assert TxnId(1, 2) != Position(1, 2)
