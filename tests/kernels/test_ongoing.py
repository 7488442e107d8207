"""OngoingTxnMap and the transaction buffer's max read position."""

from __future__ import annotations

import time

import pytest
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from pyengine_kernels import OngoingTxnMap, Position, TxnId
from tests.kernels.strategies import entry_position_tuples, position_tuples, txn_tuples
from tests.reference import kernels as ref


def test_empty_map_reads_up_to_lac() -> None:
    m = OngoingTxnMap()
    assert len(m) == 0
    assert m.lowest() is None
    assert m.items() == []
    assert m.max_read_position(Position(3, 9)) == Position(3, 9)
    assert m.max_read_position(Position.EARLIEST) == Position.EARLIEST


def test_max_read_position_is_before_the_oldest_ongoing_txn() -> None:
    m = OngoingTxnMap()
    assert m.add(TxnId(1, 1), Position(4, 5))
    assert m.add(TxnId(0, 9), Position(3, 0))
    assert m.max_read_position(Position(9, 9)) == Position(3, -1)
    assert m.remove(TxnId(0, 9)) == Position(3, 0)
    assert m.max_read_position(Position(9, 9)) == Position(4, 4)


def test_first_position_wins() -> None:
    m = OngoingTxnMap()
    assert m.add(TxnId(1, 1), Position(4, 5))
    assert not m.add(TxnId(1, 1), Position(2, 0))
    assert m.first_position(TxnId(1, 1)) == Position(4, 5)
    assert len(m) == 1


def test_ties_are_ordered_by_txn() -> None:
    m = OngoingTxnMap()
    m.add(TxnId(2, 0), Position(1, 1))
    m.add(TxnId(1, 5), Position(1, 1))
    assert m.lowest() == (TxnId(1, 5), Position(1, 1))
    assert [t for t, _ in m.items()] == [TxnId(1, 5), TxnId(2, 0)]


def test_remove_unknown_and_clear() -> None:
    m = OngoingTxnMap()
    assert m.remove(TxnId(1, 1)) is None
    m.add(TxnId(1, 1), Position(0, 0))
    assert TxnId(1, 1) in m
    m.clear()
    assert TxnId(1, 1) not in m
    assert len(m) == 0


@pytest.mark.parametrize("position", [Position(3, -1), Position.EARLIEST, Position(-1, 0)])
def test_add_rejects_non_entry_positions(position: Position) -> None:
    with pytest.raises(ValueError, match="entry position"):
        OngoingTxnMap().add(TxnId(1, 1), position)


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.add((1, 1), Position(0, 0)),
        lambda m: m.add(TxnId(1, 1), (0, 0)),
        lambda m: m.remove("txn"),
        lambda m: m.first_position(None),
        lambda m: m.max_read_position((1, 2)),
        lambda m: (1, 1) in m,
    ],
)
def test_wrong_argument_types(call) -> None:
    with pytest.raises(TypeError):
        call(OngoingTxnMap())


class OngoingMachine(RuleBasedStateMachine):
    txns = Bundle("txns")

    def __init__(self) -> None:
        super().__init__()
        self.native = OngoingTxnMap()
        self.model = ref.OngoingTxnMap()

    @rule(target=txns, t=txn_tuples)
    def new_txn(self, t: tuple[int, int]) -> tuple[int, int]:
        return t

    @rule(t=txns, p=entry_position_tuples)
    def add(self, t: tuple[int, int], p: tuple[int, int]) -> None:
        assert self.native.add(TxnId(*t), Position(*p)) == self.model.add(t, p)

    @rule(t=txns)
    def remove(self, t: tuple[int, int]) -> None:
        got = self.native.remove(TxnId(*t))
        want = self.model.remove(t)
        assert got == (None if want is None else Position(*want))

    @rule(t=txns)
    def first_position(self, t: tuple[int, int]) -> None:
        want = self.model.first.get(t)
        assert self.native.first_position(TxnId(*t)) == (None if want is None else Position(*want))
        assert (TxnId(*t) in self.native) == (t in self.model.first)

    @rule(lac=position_tuples)
    def max_read_position(self, lac: tuple[int, int]) -> None:
        assert self.native.max_read_position(Position(*lac)) == Position(
            *self.model.max_read_position(lac)
        )

    @rule()
    def clear(self) -> None:
        self.native.clear()
        self.model.first.clear()

    @invariant()
    def same_contents(self) -> None:
        assert len(self.native) == len(self.model.first)
        assert self.native.items() == [(TxnId(*t), Position(*p)) for t, p in self.model.items()]
        lowest = self.model.lowest()
        assert self.native.lowest() == (
            None if lowest is None else (TxnId(*lowest[0]), Position(*lowest[1]))
        )


TestOngoingMachine = OngoingMachine.TestCase


def test_one_million_ongoing_txns() -> None:
    n = 1_000_000
    m = OngoingTxnMap()
    txns = [TxnId(i % 16, i) for i in range(n)]
    # Positions decrease with i, so the lowest changes on every add.
    positions = [Position(n - i, 0) for i in range(n)]
    # The CPU time of this thread, not the wall clock: on a loaded machine the loop below took
    # 25 s of wall time for 4 s of CPU (a fixed bound of 20 wall seconds failed).
    started = time.thread_time()
    for t, p in zip(txns, positions, strict=True):
        m.add(t, p)
    assert len(m) == n
    assert m.max_read_position(Position.LATEST) == Position(1, -1)
    assert m.lowest() == (txns[-1], positions[-1])
    for t in reversed(txns[n // 2 :]):
        m.remove(t)
    assert m.max_read_position(Position.LATEST) == Position(n - (n // 2 - 1), -1)
    for t in txns[: n // 2]:
        m.remove(t)
    assert len(m) == 0
    assert m.max_read_position(Position(7, 7)) == Position(7, 7)
    # O(log n) per operation: a linear scan per call would take minutes.
    assert time.thread_time() - started < 20

