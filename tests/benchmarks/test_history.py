"""The soak test's history checker (`benchmarks.history`): each anomaly class is found in a
hand-made history, a clean history has none, and (hypothesis) a generated valid history of a
model broker has none while a single corruption of it is always found."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.history import (
    ABORT, COMMIT, FAIL, INFO, OK, SEND, History, Op, check,
)


def txn(h: History, w: str, t: str, sends: list[tuple[str, str, tuple]], end: str | None = COMMIT,
        outcome: str = OK) -> None:
    """A transaction of worker `w`: its sends (topic, value, acked id), then its end."""
    for topic, value, msg_id in sends:
        h.invoke(w, SEND, txn=t, topic=topic, value=value)
        h.complete(w, SEND, OK, txn=t, topic=topic, value=value, msg_id=msg_id)
    if end is not None:
        h.invoke(w, end, txn=t)
        h.complete(w, end, outcome, txn=t)


def clean() -> History:
    h = History()
    txn(h, "w1", "t1", [("a", "a1", (1, 0)), ("b", "b1", (1, 0)), ("a", "a2", (1, 1))])
    txn(h, "w2", "t2", [("a", "x1", (1, 2))], end=ABORT)
    txn(h, "w1", "t3", [("a", "a3", (1, 4)), ("b", "b2", (1, 2))])
    for r in ("r1", "r2"):
        h.read(r, "a", (1, 0), "a1")
        h.read(r, "a", (1, 1), "a2")
        h.read(r, "a", (1, 4), "a3")
        h.read(r, "b", (1, 0), "b1")
        h.read(r, "b", (1, 2), "b2")
        h.drained(r, "a")
        h.drained(r, "b")
    return h


def test_a_clean_history_has_no_anomaly():
    result = check(clean())
    assert result.valid, result.summary()
    assert result.stats["txns_committed"] == 2 and result.stats["txns_aborted"] == 1
    assert result.stats["values_read"] == 5


def test_aborted_read_of_an_aborted_txn():
    h = clean()
    h.read("r1", "a", (1, 2), "x1")
    assert "aborted_read" in check(h).found()


def test_aborted_read_of_a_failed_commit():
    h = History()
    txn(h, "w", "t", [("a", "v", (1, 0))], outcome=FAIL)
    h.read("r", "a", (1, 0), "v")
    found = check(h).found()
    assert "aborted_read" in found and "precommitted_read" not in found


def test_precommitted_read():
    h = History()
    txn(h, "w", "t", [("a", "v", (1, 0))], end=None)
    h.read("r", "a", (1, 0), "v")
    h.invoke("w", COMMIT, txn="t")
    h.complete("w", COMMIT, OK, txn="t")
    assert check(h).found() == {"precommitted_read"}


def test_lost_write_by_reading_past_it():
    h = History()
    txn(h, "w", "t1", [("a", "v1", (1, 0))])
    txn(h, "w", "t2", [("a", "v2", (1, 1))])
    h.read("r", "a", (1, 1), "v2")
    assert check(h).found() == {"lost_write"}


def test_lost_write_by_draining_after_the_commit():
    h = History()
    txn(h, "w", "t1", [("a", "v1", (1, 0))])
    h.drained("r", "a")
    assert check(h).found() == {"lost_write"}


def test_no_lost_write_when_drained_before_the_commit():
    h = History()
    h.drained("r", "a")
    txn(h, "w", "t1", [("a", "v1", (1, 0))])
    assert check(h).valid


def interleaved(h: History, sends: list[tuple[str, str, str, str, tuple]], commits: list[tuple[str, str]]) -> None:
    """Sends (worker, txn, topic, value, acked id) one after the other, then the commits."""
    for w, t, topic, value, msg_id in sends:
        h.invoke(w, SEND, txn=t, topic=topic, value=value)
        h.complete(w, SEND, OK, txn=t, topic=topic, value=value, msg_id=msg_id)
    for w, t in commits:
        h.invoke(w, COMMIT, txn=t)
        h.complete(w, COMMIT, OK, txn=t)


def test_torn_transaction():
    h = History()
    interleaved(h, [("w", "t1", "a", "v1", (1, 0)), ("u", "t2", "a", "u1", (1, 1)),
                    ("w", "t1", "a", "v2", (1, 2)), ("u", "t2", "a", "u2", (1, 3))], [("w", "t1"), ("u", "t2")])
    h.read("r", "a", (1, 0), "v1")
    h.read("r", "a", (1, 1), "u1")
    h.read("r", "a", (1, 3), "u2")
    assert check(h).found() == {"torn_transaction"}


def test_reading_part_of_a_txn_then_stopping_is_no_anomaly():
    h = History()
    interleaved(h, [("w", "t1", "a", "v1", (1, 0)), ("u", "t2", "a", "u1", (1, 1)), ("w", "t1", "a", "v2", (1, 2))],
                [("w", "t1"), ("u", "t2")])
    h.read("r", "a", (1, 0), "v1")
    h.read("r", "a", (1, 1), "u1")
    assert check(h).valid


def test_unknown_commit_may_go_either_way_but_all_or_nothing():
    h = History()
    txn(h, "w", "t1", [("a", "v1", (1, 0)), ("b", "w1", (1, 0))], outcome=INFO)
    txn(h, "w", "t2", [("a", "v2", (1, 1)), ("b", "w2", (1, 1))], outcome=INFO)
    for r in ("r1", "r2"):                       # t1 committed, t2 aborted: both fine
        h.read(r, "a", (1, 0), "v1")
        h.read(r, "b", (1, 0), "w1")
        h.drained(r, "a")
        h.drained(r, "b")
    result = check(h)
    assert result.valid, result.summary()
    assert result.stats["txns_unknown"] == 2 and result.stats["txns_unknown_seen"] == 1
    h.drained("r3", "b")                         # r3 saw nothing of t1 in b after its commit ended
    assert check(h).found() == {"torn_transaction"}


def test_duplicate_at_two_ids():
    h = clean()
    h.read("r3", "a", (1, 0), "a1")
    h.read("r3", "a", (1, 7), "a1")
    assert "duplicate" in check(h).found()


def test_a_value_sent_twice_is_a_duplicate():
    h = History()
    txn(h, "w", "t1", [("a", "v", (1, 0))])
    txn(h, "w", "t2", [("a", "v", (1, 1))])
    assert check(h).found() == {"duplicate"}


def test_order_disagreement_between_readers():
    h = History()
    txn(h, "w", "t1", [("a", "v1", None)])          # ids unknown: only the readers' orders speak
    txn(h, "w", "t2", [("a", "v2", None)])
    h.read("r1", "a", (1, 0), "v1")
    h.read("r1", "a", (1, 1), "v2")
    h.read("r2", "a", (2, 0), "v2")
    h.read("r2", "a", (2, 1), "v1")
    assert "order_disagreement" in check(h).found()


def test_order_disagreement_one_id_two_values():
    h = History()
    txn(h, "w", "t1", [("a", "v1", None), ("a", "v2", None)])
    h.read("r1", "a", (1, 0), "v1")
    h.read("r2", "a", (1, 0), "v2")
    assert "order_disagreement" in check(h).found()


def test_non_contiguous_read():
    h = History()
    txn(h, "w", "t1", [("a", "v1", None), ("a", "v2", None)])
    h.read("r1", "a", (1, 0), "v2")
    h.read("r1", "a", (1, 1), "v1")
    assert check(h).found() == {"non_contiguous"}


def test_non_contiguous_write():
    h = History()
    txn(h, "w", "t1", [("a", "v1", (1, 1)), ("a", "v2", (1, 0))])
    assert "non_contiguous" in check(h).found()


def test_nonmonotonic_send_below_an_acknowledged_id():
    h = History()
    txn(h, "w", "t1", [("a", "v1", (2, 5))])
    txn(h, "u", "t2", [("a", "u1", (2, 3))])       # sent after v1 was stored, stored before it
    assert check(h).found() == {"nonmonotonic_send"}


def test_nonmonotonic_send_below_an_id_read():
    h = History()
    txn(h, "w", "t1", [("a", "v1", None)])          # a resend answered by de-duplication: no id
    h.read("r", "a", (2, 5), "v1")
    txn(h, "u", "t2", [("a", "u1", (2, 5))])       # an id already read: reused
    found = check(h).found()
    assert "nonmonotonic_send" in found


def test_concurrent_sends_may_be_stored_in_any_order():
    h = History()
    for w, t, v in (("w", "t1", "v1"), ("u", "t2", "u1")):
        h.invoke(w, SEND, txn=t, topic="a", value=v)
    h.complete("w", SEND, OK, txn="t1", topic="a", value="v1", msg_id=(2, 5))
    h.complete("u", SEND, OK, txn="t2", topic="a", value="u1", msg_id=(2, 3))
    txn(h, "w", "t3", [("a", "v2", (2, 6)), ("b", "v3", (1, 0))])   # later, other topics: no floor
    for t, w in (("t1", "w"), ("t2", "u")):
        h.invoke(w, COMMIT, txn=t)
        h.complete(w, COMMIT, OK, txn=t)
    assert check(h).valid, check(h).summary()


def test_nonmonotonic_read_of_a_non_durable_reader():
    h = History()
    txn(h, "w", "t1", [("a", "v1", (1, 0)), ("a", "v2", (1, 1))])
    h.opened("r", "a", durable=False)
    h.read("r", "a", (1, 0), "v1")
    h.read("r", "a", (1, 1), "v2")
    h.opened("r", "a", durable=False)              # resumed after v2: v2 must not come again
    h.read("r", "a", (1, 1), "v2")
    assert check(h).found() == {"nonmonotonic_read"}


def test_a_durable_consumer_may_receive_again():
    h = History()
    txn(h, "w", "t1", [("a", "v1", (1, 0)), ("a", "v2", (1, 1))])
    h.opened("c", "a", durable=True)
    h.opened("r", "a", durable=False)
    for op in ((1, 0), "v1"), ((1, 1), "v2"), ((1, 1), "v2"):
        h.read("c", "a", *op)                      # unacknowledged, redelivered: allowed
    h.read("r", "a", (1, 0), "v1")
    h.read("r", "a", (1, 1), "v2")
    assert check(h).valid, check(h).summary()


def test_a_value_passed_is_missing_where_the_other_readers_read_it():
    """t1's commit never completed (unknown) and its send's receipt had no id (a resend found
    stored by de-duplication): r1 saw v1 at (1, 0), so t1 committed; r2 read past (1, 0)
    without it."""
    h = History()
    txn(h, "w", "t1", [("a", "v1", None)], end=None)
    h.invoke("w", COMMIT, txn="t1")
    txn(h, "u", "t2", [("a", "u1", (1, 1))])
    h.read("r1", "a", (1, 0), "v1")
    h.read("r1", "a", (1, 1), "u1")
    h.read("r2", "a", (1, 1), "u1")
    assert check(h).found() == {"torn_transaction"}
    h.read("r2", "a", (1, 0), "v1")                # r2 had it after all (out of order)
    assert "torn_transaction" not in check(h).found()


def test_a_reader_stuck_before_the_end_is_found():
    """Every value read, yet the reader never reaches the end (a marker counted as a message,
    reference B1): no value is missing, so only `stuck` tells."""
    h = clean()
    for msg_id, value in (((1, 0), "a1"), ((1, 1), "a2"), ((1, 4), "a3")):
        h.read("r3", "a", msg_id, value)
    h.stuck("r3", "a", "has_message_available stays true, nothing is delivered")
    h.drained("r3", "a")
    result = check(h)
    assert result.found() == {"stuck_read"} and result.anomalies["stuck_read"][0]["reader"] == "r3"


# ---- property-based: a model broker's histories, and single corruptions of them ----

def simulate(seed: int, steps: int = 120) -> History:
    """A valid history of a model of the broker: per topic a log; an entry becomes readable
    when its transaction commits, a reader never passes an entry of an open transaction, and
    aborted entries are skipped. Commits may complete `info` (then they really committed or
    not, at random); at the end open transactions time out and readers drain every topic."""
    rnd = random.Random(seed)
    topics, workers, readers = ["a", "b", "c"], ["w1", "w2", "w3"], ["r1", "r2"]
    h = History()
    logs: dict[str, list[tuple[str, str]]] = {t: [] for t in topics}      # (value, txn)
    state: dict[str, str] = {}                                             # txn -> open/committed/aborted
    open_txn: dict[str, str | None] = dict.fromkeys(workers)
    pos = {(r, t): 0 for r in readers for t in topics}
    counter = iter(range(10**9))
    for r, t in pos:
        h.opened(r, t, durable=False)

    def read(r: str, t: str) -> None:
        log = logs[t]
        while pos[r, t] < len(log):
            value, tx = log[pos[r, t]]
            if state[tx] == "open":
                return
            if state[tx] == "committed":
                h.read(r, t, (1, pos[r, t]), value)
            pos[r, t] += 1
            if rnd.random() < 0.3:
                return

    for _ in range(steps):
        w = rnd.choice(workers)
        action = rnd.random()
        if action < 0.35:
            r, t = rnd.choice(readers), rnd.choice(topics)
            read(r, t)
            continue
        tx = open_txn[w]
        if tx is None:
            tx = open_txn[w] = f"{w}-t{next(counter)}"
            state[tx] = "open"
        if action < 0.75:
            t, v = rnd.choice(topics), f"v{next(counter)}"
            h.invoke(w, SEND, txn=tx, topic=t, value=v)
            logs[t].append((v, tx))
            h.complete(w, SEND, OK, txn=tx, topic=t, value=v, msg_id=(1, len(logs[t]) - 1))
        else:
            end = COMMIT if rnd.random() < 0.7 else ABORT
            h.invoke(w, end, txn=tx)
            kind = rnd.choice([OK, OK, OK, FAIL, INFO])
            committed = end == COMMIT and (kind == OK or (kind == INFO and rnd.random() < 0.5))
            state[tx] = "committed" if committed else "aborted"
            if rnd.random() < 0.5:
                read(rnd.choice(readers), rnd.choice(topics))      # something in between
            h.complete(w, end, kind, txn=tx)
            open_txn[w] = None
    for tx, s in state.items():
        if s == "open":
            state[tx] = "aborted"
    for r in readers:
        for t in topics:
            while pos[r, t] < len(logs[t]):
                read(r, t)
            h.drained(r, t)
    return h


def corrupt(h: History, rnd: random.Random) -> tuple[list[Op], str] | None:
    """One corruption of a valid history and the anomaly class it must be found as (None when
    the history has nothing to corrupt that way)."""
    ops = list(h.ops)
    reads = [op for op in ops if op.f == "read"]
    result = check(h)
    outcomes: dict[str, str] = {}
    commit_invoke: dict[str, int] = {}
    for op in ops:
        if op.f == COMMIT and op.type == "invoke":
            commit_invoke[op.txn] = op.index
    sends = {op.value: op for op in ops if op.f == SEND and op.type == OK}
    read_values = {op.value for op in reads}
    kind = rnd.choice(["aborted", "lost", "duplicate", "swap", "precommitted", "reread", "reused_id"])
    if kind == "reused_id":
        # a send acknowledged at the id of one acknowledged before it was invoked
        invoked = {op.value: op.index for op in ops if op.f == SEND and op.type == "invoke"}
        pairs = [(a, b) for a in sends.values() for b in sends.values()
                 if a.topic == b.topic and a.index < invoked[b.value]]
        if not pairs:
            return None
        a, b = rnd.choice(pairs)
        ops[ops.index(b)] = dataclasses.replace(b, msg_id=a.msg_id)
        return ops, "nonmonotonic_send"
    if kind == "aborted":
        ended = {op.txn: op for op in ops if op.f in (COMMIT, ABORT) and op.type != "invoke"}
        aborted = [v for v, s in sends.items() if v not in read_values and (
            s.txn not in commit_invoke or (s.txn in ended and ended[s.txn].type == FAIL))]
        if not aborted:
            return None
        s = sends[rnd.choice(aborted)]
        ops.append(Op(len(ops) + 10, OK, "read", "r1", topic=s.topic, value=s.value, msg_id=s.msg_id))
        return ops, "aborted_read"
    if not reads:
        return None
    victim = rnd.choice(reads)
    if kind == "lost":
        ops.remove(victim)
        return ops, ("lost_write", "torn_transaction")
    if kind == "reread":
        ops.append(dataclasses.replace(victim, index=len(ops) + 10))
        return ops, "nonmonotonic_read"
    if kind == "duplicate":
        ops.append(Op(len(ops) + 10, OK, "read", "r3", topic=victim.topic, value=victim.value, msg_id=(2, 0)))
        return ops, "duplicate"
    if kind == "swap":
        same = [op for op in reads if op.process == victim.process and op.topic == victim.topic]
        i = same.index(victim)
        if i + 1 >= len(same):
            return None
        a, b = same[i], same[i + 1]
        ops[ops.index(a)] = dataclasses.replace(a, index=b.index)
        ops[ops.index(b)] = dataclasses.replace(b, index=a.index)
        return ops, ("order_disagreement", "non_contiguous")
    tx = sends[victim.value].txn
    ops[ops.index(victim)] = dataclasses.replace(victim, index=commit_invoke[tx] - 0.5)
    assert result.valid
    return ops, "precommitted_read"


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32))
def test_a_valid_generated_history_has_no_anomaly(seed):
    result = check(simulate(seed))
    assert result.valid, result.summary()


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 2**32))
def test_a_single_corruption_is_always_found(seed, corruption_seed):
    corrupted = corrupt(simulate(seed), random.Random(corruption_seed))
    if corrupted is None:
        return
    ops, expected = corrupted
    found = check(ops).found()
    expected = (expected,) if isinstance(expected, str) else expected
    assert found & set(expected), (expected, found)


@pytest.mark.parametrize("seed", range(20))
def test_the_model_exercises_every_outcome(seed):
    stats = check(simulate(seed, steps=400)).stats
    assert stats["txns_committed"] and stats["txns_aborted"] and stats["values_read"]
