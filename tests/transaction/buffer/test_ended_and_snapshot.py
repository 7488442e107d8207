"""EndedTxns against a plain dict model; snapshot records round-trip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pyengine.storage import CorruptRecordError
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer.ended import EndedTxns
from pyengine.transaction.buffer.records_pb2 import TransactionBufferSnapshotRecord
from pyengine.transaction.buffer.snapshot import TransactionBufferSnapshot
from pyengine_kernels import AbortedTxnSet, Position, TxnId

coordinators = st.integers(0, 3)
sequences = st.integers(0, 40)
outcomes = st.sampled_from([TxnAction.COMMIT, TxnAction.ABORT])


class EndedMachine(RuleBasedStateMachine):
    """Model: the set of (txn, first outcome) above each coordinator's highest watermark."""

    def __init__(self) -> None:
        super().__init__()
        self.ended = EndedTxns()
        self.outcomes: dict[tuple[int, int], TxnAction] = {}
        self.watermarks: dict[int, int] = {}

    def below(self, most: int, least: int) -> bool:
        return least <= self.watermarks.get(most, -1)

    @rule(most=coordinators, least=sequences, outcome=outcomes)
    def add(self, most, least, outcome):
        self.ended.add(TxnId(most, least), outcome)
        if not self.below(most, least):
            self.outcomes.setdefault((most, least), outcome)

    @rule(most=coordinators, leasts=st.lists(sequences, max_size=8), outcome=outcomes)
    def add_many(self, most, leasts, outcome):
        self.ended.add_many(most, leasts, outcome)
        for least in leasts:
            if not self.below(most, least):
                self.outcomes.setdefault((most, least), outcome)

    @rule(most=coordinators, watermark=st.integers(-1, 45))
    def advance(self, most, watermark):
        moved = self.ended.advance_low_watermark(most, watermark)
        assert moved == (watermark > self.watermarks.get(most, -1))
        if moved:
            self.watermarks[most] = watermark
        self.outcomes = {t: o for t, o in self.outcomes.items() if not self.below(*t)}

    @invariant()
    def agrees(self):
        for most in range(4):
            assert self.ended.low_watermark(most) == self.watermarks.get(most, -1)
            for least in range(41):
                txn = TxnId(most, least)
                assert self.ended.outcome(txn) == self.outcomes.get((most, least))
                assert self.ended.is_below_low_watermark(txn) == self.below(most, least)
        assert len(self.ended) == len(self.outcomes)
        assert self.ended.low_watermarks() == {m: w for m, w in self.watermarks.items()}


TestEndedMachine = EndedMachine.TestCase


@settings(max_examples=200)
@given(aborted=st.lists(st.tuples(coordinators, sequences, st.integers(0, 9), st.integers(0, 99))),
       ended=st.lists(st.tuples(coordinators, sequences, outcomes)),
       watermarks=st.dictionaries(coordinators, st.integers(-1, 40)),
       position=st.tuples(st.integers(-1, 9), st.integers(-1, 99)), taken=st.integers(0, 2**62))
def test_snapshot_round_trip(aborted, ended, watermarks, position, taken):
    aborted_set = AbortedTxnSet()
    for most, least, ledger_id, entry_id in aborted:
        aborted_set.add(TxnId(most, least), Position(ledger_id, entry_id))
    ended_txns = EndedTxns()
    for most, watermark in watermarks.items():
        ended_txns.advance_low_watermark(most, watermark)
    for most, least, outcome in ended:
        ended_txns.add(TxnId(most, least), outcome)
    snapshot = TransactionBufferSnapshot(Position(*position), aborted_set, ended_txns, taken)
    loaded = TransactionBufferSnapshot.decode(snapshot.encode())
    assert loaded.max_read_position == Position(*position)
    assert loaded.aborted == aborted_set
    assert loaded.taken_ms == taken
    assert list(loaded.ended.items()) == list(ended_txns.items())


@pytest.mark.parametrize("record", [
    b"not a protobuf \xff\xff",
    TransactionBufferSnapshotRecord(max_read_ledger_id=1, max_read_entry_id=2, aborted=b"PEAB?").SerializeToString(),
    TransactionBufferSnapshotRecord(max_read_ledger_id=-5, max_read_entry_id=2,
                                    aborted=AbortedTxnSet().to_bytes()).SerializeToString(),
])
def test_corrupt_snapshot_records_are_reported(record):
    with pytest.raises(CorruptRecordError):
        TransactionBufferSnapshot.decode(record)
