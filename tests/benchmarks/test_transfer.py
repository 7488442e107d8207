"""The exactly-once check of the soaks' consume-transform-produce workload finds each of its
anomaly classes, and nothing in a clean run."""

from __future__ import annotations

import asyncio
import random

from benchmarks.transfer import ABORTED, COMMITTED, UNKNOWN, Transfer, check_transfer
from pyengine.client import MessageId

FED = {"x1": True, "x2": True, "x3": False}


def test_a_clean_run_has_no_anomaly():
    txns = {"p0:1": (["x1"], ABORTED), "p0:2": (["x1", "x2"], COMMITTED), "p1:1": (["x3"], UNKNOWN)}
    result = check_transfer(FED, txns, ["x1|p0:2", "x2|p0:2"])
    assert result.count == 0, result.summary()
    assert result.stats["transfer_txns_committed"] == 1 and result.stats["transfer_txns_aborted"] == 1


def test_an_unknown_commit_may_have_committed_and_an_unacknowledged_value_may_be_missing():
    txns = {"p0:1": (["x1", "x2", "x3"], UNKNOWN)}
    assert check_transfer(FED, txns, ["x1|p0:1", "x2|p0:1", "x3|p0:1"]).count == 0


def test_a_value_output_by_two_committed_transactions_is_a_duplicate():
    txns = {"p0:1": (["x1", "x2"], COMMITTED), "p1:1": (["x1"], COMMITTED)}
    result = check_transfer(FED, txns, ["x1|p0:1", "x2|p0:1", "x1|p1:1"])
    assert result.found() == {"duplicate_output"}
    assert result.anomalies["duplicate_output"][0]["by"] == ["p0:1", "p1:1"]


def test_an_output_of_an_aborted_transaction_is_found():
    txns = {"p0:1": (["x1"], ABORTED), "p0:2": (["x2"], COMMITTED)}
    assert check_transfer(FED, txns, ["x1|p0:1", "x2|p0:2"]).found() == {"aborted_output"}


def test_an_acknowledged_value_never_output_is_lost():
    txns = {"p0:1": (["x1"], COMMITTED)}
    assert check_transfer(FED, txns, ["x1|p0:1"]).found() == {"lost_input"}


def test_a_missing_output_of_a_committed_transaction_is_found():
    txns = {"p0:1": (["x1", "x2"], COMMITTED), "p1:1": (["x2"], UNKNOWN)}
    result = check_transfer(FED, txns, ["x1|p0:1", "x2|p1:1"])
    assert result.found() == {"lost_output"}
    assert result.anomalies["lost_output"][0] == {"txn": "p0:1", "missing": ["x2"]}


def test_outputs_of_unknown_values_or_transactions_are_phantoms():
    txns = {"p0:1": (["x1", "x2"], COMMITTED)}
    result = check_transfer(FED, txns, ["x1|p0:1", "x2|p0:1", "x9|p0:1", "x2|p7:7"])
    assert result.found() == {"phantom_output", "duplicate_output"}
    assert len(result.anomalies["phantom_output"]) == 2


def test_a_lost_values_story_is_that_of_the_transactions_that_touched_its_entry():
    """A lost value's report carries what the processors did with its entry's messages: who
    took which copy, who acked cumulatively into it, and how their transactions ended."""
    transfer = Transfer("pulsar://127.0.0.1:1", "in", "out", scalable=False, rnd=random.Random(0),
                        stop=asyncio.Event(), drain_now=asyncio.Event(), error=lambda *_: None, cumulative=True)
    transfer.stored_at.update({"x2": MessageId(4, 127, -1, 2), "x9": MessageId(5, 1, -1, 0)})
    transfer.trace("c0:(1,1)", "got x1 at (4,127,-1,1) redelivery 0")
    transfer.trace("c1:(2,2)", "got x9 at (5,1,-1,0) redelivery 0")
    transfer.trace("c0:(1,1)", "acked cumulatively up to (4,127,-1,1)")
    transfer.trace("c1:(3,3)", "got x4 at (4,127,-1,4) redelivery 0")
    transfer.trace("c1:(3,3)", "ends committed (client state committed)")
    story = transfer.story_of("x2")
    assert [line.split(maxsplit=1)[1] for line in story] == [
        "c0:(1,1) got x1 at (4,127,-1,1) redelivery 0",
        "c0:(1,1) acked cumulatively up to (4,127,-1,1)",
        "c1:(3,3) got x4 at (4,127,-1,4) redelivery 0",
        "c1:(3,3) ends committed (client state committed)"]
