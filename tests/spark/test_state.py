"""The captured transaction state (no Spark): equal to what the broker's transaction buffers
held, its bytes, and PreparedState's visibility and drop reasons against a reference model."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyengine_kernels import AbortedTxnSet, Position, TxnId
from spark_udfs.state import TopicState, TxnState, capture_state
from tests.spark.workload import ALL_TOPICS, SEGMENTS, TOPICS


def test_capture_equals_the_running_brokers_transaction_buffers(workload):
    state = capture_state(workload.data_dir)
    assert set(state.topics) == set(ALL_TOPICS)
    for topic, (horizon, aborted, ongoing) in workload.buffers.items():
        captured = state[topic]
        assert captured.max_read_position == horizon
        assert sorted(captured.aborted_set().items()) == sorted(aborted)
        assert list(captured.ongoing) == list(ongoing)
        # v5 (segment://): from the metadata store; the workload's late write is hidden.
        assert captured.design == (5 if topic in SEGMENTS else 4)
        assert len(captured.hidden) == (len(workload.late) if topic == SEGMENTS[1] else 0)
    assert TxnState.from_bytes(state.to_bytes()) == state
    assert state.select([TOPICS[1]]).topics == {TOPICS[1]: state[TOPICS[1]]}


@pytest.mark.parametrize("garbage", [b"", b"PETS", b"NOPE\x01\x00\x00\x00\x00", b"PETS\x01\x05\x00\x00\x00{bad}"])
def test_state_bytes_that_are_not_a_state_are_refused(garbage):
    with pytest.raises(ValueError, match="not a pyengine transaction state"):
        TxnState.from_bytes(garbage)


def test_trailing_bytes_are_refused(workload):
    with pytest.raises(ValueError, match="bytes follow"):
        TxnState.from_bytes(capture_state(workload.data_dir).to_bytes() + b"x")


# --- PreparedState against a reference model --------------------------------------------------

@st.composite
def states_and_rows(draw):
    """Two topics owning disjoint ledgers (1..3 and 4..6), horizons, aborted txns, v5 hidden
    positions (late writes); rows of both topics, transactional or not, markers, and rows of a
    ledger newer than the capture; marker flags may be null (exported rows)."""
    topics = {}
    for index, ledgers in enumerate(((1, 2, 3), (4, 5, 6))):
        horizon = Position(draw(st.sampled_from(ledgers)), draw(st.integers(0, 9)))
        aborted = AbortedTxnSet()
        for most, least in draw(st.sets(st.tuples(st.integers(0, 2), st.integers(0, 9)), max_size=6)):
            aborted.add(TxnId(most, least), Position(ledgers[-1], 10))
        hidden = draw(st.sets(st.tuples(st.sampled_from(ledgers), st.integers(0, 9)), max_size=3))
        topics[f"t{index}"] = TopicState(f"t{index}", index + 1, Position(ledgers[-1], 9), horizon,
                                         aborted.to_bytes(), (), ledgers, 5 if hidden else 4,
                                         tuple(sorted(Position(*p) for p in hidden)))
    state = TxnState("/nowhere", topics, max_ledger_id=6)
    rows = draw(st.lists(st.tuples(st.integers(1, 7), st.integers(0, 9), st.none() | st.tuples(
        st.integers(0, 2), st.integers(0, 9)), st.none() | st.booleans()), max_size=40))
    return state, rows


def reference(state: TxnState, rows) -> tuple[list[bool], dict[str, int]]:
    visible, counts = [], {"visible": 0, "marker": 0, "aborted": 0, "uncommitted": 0}
    for ledger, entry, txn, marker in rows:
        marker = marker is None or marker      # a null flag may be a marker: never visible
        topic = next((t for t in state.topics.values() if ledger in t.ledgers), None)
        aborted = topic is not None and (txn is not None and TxnId(*txn) in {t for t, _ in topic.aborted_set().items()}
                                         or Position(ledger, entry) in topic.hidden)
        ok = (topic is not None and not marker and Position(ledger, entry) <= topic.max_read_position
              and not aborted)
        visible.append(ok)
        reason = "visible" if ok else "marker" if marker else "aborted" if aborted else "uncommitted"
        counts[reason] += 1
    return visible, counts


@settings(max_examples=150)
@given(states_and_rows())
def test_mask_and_classify_match_the_reference(case):
    state, rows = case
    columns = [pa.array([r[0] for r in rows], pa.int64()), pa.array([r[1] for r in rows], pa.int64()),
               pa.array([r[2][0] if r[2] else None for r in rows], pa.int64()),
               pa.array([r[2][1] if r[2] else None for r in rows], pa.int64()),
               pa.array([r[3] for r in rows], pa.bool_())]
    prepared = TxnState.from_bytes(state.to_bytes()).prepared()
    want_visible, want_counts = reference(state, rows)
    assert prepared.mask(*columns).to_pylist() == want_visible
    visible, counts = prepared.classify(*columns)
    assert visible.tolist() == want_visible and counts == want_counts


def test_rows_of_a_stored_topic_left_out_of_the_capture_are_refused():
    state = TxnState("/nowhere", {"t": TopicState("t", 1, Position(2, 0), Position(2, 0), AbortedTxnSet().to_bytes(),
                                                  (), (2,))}, max_ledger_id=3, other_ledgers=(1,))
    ids = np.array([2, 1], dtype=np.int64)
    none = np.array([-1, -1], dtype=np.int64)
    with pytest.raises(ValueError, match="ledger 1, which a stored topic the captured state leaves out holds"):
        state.prepared().mask(ids, ids, none, none, np.zeros(2, dtype=np.bool_))
    round_trip = TxnState.from_bytes(state.to_bytes())
    assert round_trip.other_ledgers == (1,)
    assert TxnState.from_bytes(round_trip.select([]).to_bytes()).other_ledgers == (1, 2)


def test_rows_of_ledgers_gone_by_the_capture_are_not_visible():
    """Rows exported before retention trimmed their ledger (or their topic was deleted):
    no consumer can receive them any more. Before, they failed the filter with an error
    that blamed the capture (found by an audit)."""
    state = TxnState("/nowhere", {"t": TopicState("t", 1, Position(3, 0), Position(3, 0), AbortedTxnSet().to_bytes(),
                                                  (), (3,))}, max_ledger_id=3)
    ids = np.array([1, 3, 2], dtype=np.int64)
    entries = np.zeros(3, dtype=np.int64)
    none = np.array([-1, -1, -1], dtype=np.int64)
    prepared = state.prepared()
    assert prepared.mask(ids, entries, none, none, np.zeros(3, dtype=np.bool_)).to_pylist() == [False, True, False]
    visible, counts = prepared.classify(ids, entries, none, none, np.zeros(3, dtype=np.bool_))
    assert visible.tolist() == [False, True, False] and counts["uncommitted"] == 2


def test_a_capture_names_the_ledgers_of_the_topics_it_leaves_out(workload):
    everything = capture_state(workload.data_dir)
    assert everything.other_ledgers == ()
    first, *rest = sorted(everything.topics)
    one = capture_state(workload.data_dir, [first])
    assert one.other_ledgers == tuple(sorted(l for name in rest for l in everything.topics[name].ledgers))
    assert everything.select([first]).other_ledgers == one.other_ledgers
