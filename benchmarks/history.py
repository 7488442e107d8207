"""A history of a transactional streaming workload, and a checker of it (pure Python).

The analyses of Jepsen's `jepsen.tests.kafka` workload, ported to Pulsar-style transactions
(reference section D3). A *history* is a list of operations `Op`, in real-time order (the
recorder numbers them as they happen; in one asyncio event loop that order is the real order).
As in Jepsen, an operation is invoked (`invoke`) and completes as `ok`, `fail` (it definitely
did not happen) or `info` (its outcome is unknown: a timeout, a broken connection, a crash).

Operations (`Op.f`):

- `send`: a transactional send of a unique `value` to `topic` within `txn`; its `ok` carries
  the message id the broker acknowledged (`msg_id`, a comparable tuple).
- `commit` / `abort`: the end of `txn`.
- `read`: a READ_COMMITTED reader or consumer (`process`) received `value` at `msg_id` of
  `topic` (recorded as one `ok` operation: a read that happened).
- `drained`: `process` has read `topic` to its end (the end known when the drain began is
  reached), so every transaction committed before this op must have been seen. Only sound
  when no transaction of the topic is still open then: READ_COMMITTED readers stop before an
  open transaction's first entry, and what was committed behind it is not visible yet (the
  soak drains once every transaction has ended, committed, aborted or timed out).
- `opened`: `process` opened a reader of `topic`; `value` is `durable` (a subscription: what
  it did not acknowledge may come again) or `non_durable` (a Reader: it resumes after the last
  message it handed out, so it never receives one twice, nor one before it).
- `stuck`: `process` could not read `topic` to its end (`error` says how): the broker kept
  saying more was available and delivered nothing, or the drain did not end in time.
- anything else (the nemesis' `kill` / `start`, ...) is kept for the record and ignored.

Outcome of a transaction, as the checker infers it:

- *committed*: its commit completed `ok`;
- *aborted*: its commit was never invoked (whatever came of an abort or a timeout: only a
  commit can make it visible), or its commit completed `fail`;
- *unknown*: its commit was invoked and completed `info` (or never completed). It may have
  committed or aborted, but all or nothing: if any reader saw one of its values, it counts as
  committed from then on.

Anomaly classes reported by `check` (keys of `Result.anomalies`):

- `aborted_read`: a value of an aborted transaction was read.
- `precommitted_read`: a value was read before its transaction's commit was invoked (a
  transaction never committed counts too: its values are never readable).
- `lost_write`: a value of a committed transaction that a reader should have read (it read the
  topic past the value's message id, or drained the topic after the commit's `ok`) but never did.
  A value's id is its send's acknowledged one, or else the one the other readers read it at
  (a resend answered by de-duplication has no id; nor has a send of unknown outcome).
- `torn_transaction`: a transaction's values were visible in part: a reader saw some of its
  values in a topic, then went on to later messages while the rest was missing; or an
  unknown-outcome transaction was seen by some reader while another reader read past (or
  drained after the commit completed) one of its values without seeing it.
- `duplicate`: a value read at two different message ids of one topic, or sent twice.
- `order_disagreement`: readers disagree on a topic's order: two readers saw two values in
  opposite orders, one message id held different values, a value was read at another id than
  its send was acknowledged with, or a reader read a topic's message ids out of order.
- `non_contiguous`: a transaction's values in one topic were stored (acknowledged ids) or read
  out of their send order.
- `nonmonotonic_send`: a send was acknowledged at a message id at or below one already known in
  its topic (acknowledged or read) before the send was invoked. A topic is an append-only log:
  what is appended after an entry was stored (and acknowledged or read) lands after it. A
  broker that lost acknowledged entries in a crash and reused their ids shows up here.
- `nonmonotonic_read`: a non-durable reader (see `opened`) received a message id at or below
  one it had received before in that topic (a redelivery, or a resume before its position).
- `stuck_read`: a reader could not reach the end of a topic once every transaction had ended
  (a `stuck` op): a read horizon that does not move, or a reader held on a marker or an aborted
  entry (reference B1). The soak then records the topic drained as far as it went, so what
  was committed behind is a lost write too; this class tells a reader stuck with nothing lost.

Not checked: Elle's write-write cycles. A topic's order is the order of appends, not of
commits, so two transactions writing to two topics in opposite orders form a ww "cycle" that
Pulsar's (and Kafka's) model allows; the checks above are the ones it forbids. Nor wr cycles
(G1c): the writers here read nothing; the consume-transform-produce processors that do are
checked for exactly-once by `benchmarks.transfer`.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
SEND, COMMIT, ABORT, READ, DRAINED, OPENED, STUCK = "send", "commit", "abort", "read", "drained", "opened", "stuck"
DURABLE, NON_DURABLE = "durable", "non_durable"
COMMITTED, ABORTED, UNKNOWN = "committed", "aborted", "unknown"

ANOMALY_CLASSES = ("aborted_read", "precommitted_read", "lost_write", "torn_transaction", "duplicate",
                   "order_disagreement", "non_contiguous", "nonmonotonic_send", "nonmonotonic_read",
                   "stuck_read")

MsgId = tuple[int, ...]


@dataclass(frozen=True)
class Op:
    index: int                       # position in real-time order
    type: str                        # invoke | ok | fail | info
    f: str                           # send | commit | abort | read | drained
    process: str                     # the worker, reader or consumer that did it
    txn: Hashable | None = None
    topic: str | None = None
    value: Hashable | None = None
    msg_id: MsgId | None = None
    error: str | None = None         # what a fail / info completion raised
    time: float | None = None        # time.monotonic() when recorded


class History:
    """Records operations in the order they happen (not thread-safe: one event loop).

        h = History()
        h.invoke("w1", SEND, txn="t1", topic="a", value="v1")
        h.complete("w1", SEND, OK, txn="t1", topic="a", value="v1", msg_id=(3, 0, -1))
        h.invoke("w1", COMMIT, txn="t1"); h.complete("w1", COMMIT, INFO, txn="t1", error="timeout")
        h.read("r1", "a", (3, 0, -1), "v1")
        h.drained("r1", "a", (3, 5, -1))
        h.opened("r1", "a", durable=False)
    """

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._index = itertools.count()

    def _add(self, type_: str, f: str, process: str, **fields: Any) -> Op:
        fields.setdefault("time", time.monotonic())
        op = Op(next(self._index), type_, f, process, **fields)
        self.ops.append(op)
        return op

    def invoke(self, process: str, f: str, **fields: Any) -> Op:
        return self._add(INVOKE, f, process, **fields)

    def complete(self, process: str, f: str, type_: str, **fields: Any) -> Op:
        assert type_ in (OK, FAIL, INFO), type_
        return self._add(type_, f, process, **fields)

    def read(self, process: str, topic: str, msg_id: MsgId, value: Hashable) -> Op:
        return self._add(OK, READ, process, topic=topic, msg_id=msg_id, value=value)

    def drained(self, process: str, topic: str, msg_id: MsgId | None = None) -> Op:
        return self._add(OK, DRAINED, process, topic=topic, msg_id=msg_id)

    def opened(self, process: str, topic: str, durable: bool) -> Op:
        return self._add(OK, OPENED, process, topic=topic, value=DURABLE if durable else NON_DURABLE)

    def stuck(self, process: str, topic: str, why: str) -> Op:
        return self._add(OK, STUCK, process, topic=topic, error=why)

    def __len__(self) -> int:
        return len(self.ops)


@dataclass
class Result:
    anomalies: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {c: [] for c in ANOMALY_CLASSES})
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.anomalies.values())

    @property
    def valid(self) -> bool:
        return self.count == 0

    def found(self) -> set[str]:
        return {c for c, v in self.anomalies.items() if v}

    def add(self, kind: str, **details: Any) -> None:
        self.anomalies[kind].append(details)

    def summary(self, per_class: int = 3) -> str:
        lines = [f"{self.count} anomalies; {self.stats}"]
        for kind, found in self.anomalies.items():
            if found:
                lines.append(f"  {kind}: {len(found)}")
                lines.extend(f"    {d}" for d in found[:per_class])
        return "\n".join(lines)


@dataclass
class _Txn:
    values: dict[str, list[Hashable]] = field(default_factory=lambda: defaultdict(list))   # topic -> send order
    commit_invoke: int | None = None
    commit_done: Op | None = None

    @property
    def outcome(self) -> str:
        if self.commit_invoke is None:
            return ABORTED
        if self.commit_done is None or self.commit_done.type == INFO:
            return UNKNOWN
        return COMMITTED if self.commit_done.type == OK else ABORTED


def check(ops: Iterable[Op] | History) -> Result:
    """Every anomaly of the history, by class (see the module's doc)."""
    ops = sorted(ops.ops if isinstance(ops, History) else ops, key=lambda op: op.index)
    result = Result()
    txns: dict[Hashable, _Txn] = defaultdict(_Txn)
    value_txn: dict[Hashable, Hashable] = {}
    value_topic: dict[Hashable, str] = {}
    sent_id: dict[Hashable, MsgId] = {}
    # reader -> topic -> [read op] in read order; drains: reader -> topic -> [drained op]
    reads: dict[str, dict[str, list[Op]]] = defaultdict(lambda: defaultdict(list))
    drains: dict[str, dict[str, list[Op]]] = defaultdict(lambda: defaultdict(list))
    non_durable: set[tuple[str, str]] = set()             # (reader, topic) that never reads back
    # the highest id known stored in each topic so far (acknowledged or read), and that
    # highest id as it stood when each send was invoked: the send must land above it
    known_max: dict[str, MsgId] = {}
    floor: dict[Hashable, MsgId] = {}

    for op in ops:
        if op.f == SEND:
            if op.type == INVOKE:
                if op.value in value_txn:
                    result.add("duplicate", value=op.value, why="the value was sent twice")
                    continue
                value_txn[op.value] = op.txn
                value_topic[op.value] = op.topic  # type: ignore[assignment]
                txns[op.txn].values[op.topic].append(op.value)  # type: ignore[index]
                if op.topic in known_max:
                    floor[op.value] = known_max[op.topic]
            elif op.type == OK and op.msg_id is not None:
                msg_id = sent_id[op.value] = tuple(op.msg_id)
                below = floor.get(op.value)
                if below is not None and msg_id <= below:
                    result.add("nonmonotonic_send", topic=op.topic, value=op.value, txn=op.txn, msg_id=msg_id,
                               known_before=below, why="acknowledged at or below an id known before its send")
                if op.topic not in known_max or msg_id > known_max[op.topic]:
                    known_max[op.topic] = msg_id  # type: ignore[index]
        elif op.f == COMMIT:
            txn = txns[op.txn]
            if op.type == INVOKE:
                txn.commit_invoke = op.index if txn.commit_invoke is None else txn.commit_invoke
            elif txn.commit_done is None or txn.commit_done.type == INFO:
                txn.commit_done = op
        elif op.f == READ:
            reads[op.process][op.topic].append(op)  # type: ignore[index]
            if op.topic not in known_max or tuple(op.msg_id) > known_max[op.topic]:  # type: ignore[arg-type]
                known_max[op.topic] = tuple(op.msg_id)  # type: ignore[arg-type,index]
        elif op.f == OPENED and op.value == NON_DURABLE:
            non_durable.add((op.process, op.topic))  # type: ignore[arg-type]
        elif op.f == STUCK:
            result.add("stuck_read", reader=op.process, topic=op.topic, why=op.error)
        elif op.f == DRAINED:
            drains[op.process][op.topic].append(op)  # type: ignore[index]

    # Values any reader saw (an unknown transaction seen anywhere counts as committed).
    seen_values = {op.value for per_topic in reads.values() for rs in per_topic.values() for op in rs}
    seen_txns = {value_txn[v] for v in seen_values if v in value_txn}
    outcome = {t: txn.outcome for t, txn in txns.items()}

    # aborted / precommitted reads, unknown values
    for reader, per_topic in reads.items():
        for topic, rs in per_topic.items():
            for op in rs:
                t = value_txn.get(op.value)
                if t is None:
                    result.add("aborted_read", reader=reader, topic=topic, value=op.value, msg_id=op.msg_id,
                               why="a value never sent")
                    continue
                txn = txns[t]
                if outcome[t] == ABORTED:
                    result.add("aborted_read", reader=reader, topic=topic, value=op.value, txn=t, msg_id=op.msg_id,
                               why="commit never invoked" if txn.commit_invoke is None else "commit failed")
                if txn.commit_invoke is None or op.index < txn.commit_invoke:
                    result.add("precommitted_read", reader=reader, topic=topic, value=op.value, txn=t,
                               read_at=op.index, commit_invoked_at=txn.commit_invoke)
                if value_topic.get(op.value) != topic:
                    result.add("order_disagreement", reader=reader, topic=topic, value=op.value,
                               why=f"value sent to {value_topic.get(op.value)!r}")

    # duplicates and ids: one value, one message id per topic; one id, one value
    read_id: dict[tuple[str, Hashable], MsgId] = {}          # (topic, value) -> the one id readers saw it at
    for topic in {t for per_topic in reads.values() for t in per_topic}:
        ids_of: dict[Hashable, set[MsgId]] = defaultdict(set)
        values_at: dict[MsgId, set[Hashable]] = defaultdict(set)
        for reader, per_topic in reads.items():
            for op in per_topic.get(topic, ()):
                ids_of[op.value].add(tuple(op.msg_id))  # type: ignore[arg-type]
                values_at[tuple(op.msg_id)].add(op.value)  # type: ignore[arg-type]
        for value, ids in ids_of.items():
            if len(ids) > 1:
                result.add("duplicate", topic=topic, value=value, msg_ids=sorted(ids))
            else:
                read_id[topic, value] = next(iter(ids))
            acked = sent_id.get(value)
            if acked is not None and any(i != acked for i in ids):
                result.add("order_disagreement", topic=topic, value=value, sent_at=acked, read_at=sorted(ids),
                           why="read at another message id than its send's")
        for msg_id, values in values_at.items():
            if len(values) > 1:
                result.add("order_disagreement", topic=topic, msg_id=msg_id, values=sorted(map(str, values)),
                           why="one message id, several values")

    # a non-durable reader only moves forward: each id above every one it received before
    for reader, topic in sorted(non_durable):
        highest: Op | None = None
        for op in reads[reader].get(topic, ()):
            if highest is not None and tuple(op.msg_id) <= tuple(highest.msg_id):  # type: ignore[arg-type]
                result.add("nonmonotonic_read", reader=reader, topic=topic, value=op.value, msg_id=op.msg_id,
                           after=highest.value, after_id=highest.msg_id,
                           why="received again" if op.msg_id == highest.msg_id else "received below its position")
            else:
                highest = op

    # order: each reader reads a topic in message-id order; readers agree pairwise
    firsts: dict[str, dict[str, dict[Hashable, int]]] = defaultdict(dict)    # topic -> reader -> value -> rank
    for reader, per_topic in reads.items():
        for topic, rs in per_topic.items():
            rank: dict[Hashable, int] = {}
            last: Op | None = None
            for op in rs:
                if op.value in rank:
                    continue                                  # a redelivery (same id: duplicates above)
                if last is not None and tuple(op.msg_id) < tuple(last.msg_id):  # type: ignore[arg-type]
                    result.add("order_disagreement", reader=reader, topic=topic, value=op.value, msg_id=op.msg_id,
                               after=last.value, after_id=last.msg_id, why="read out of message-id order")
                rank[op.value] = len(rank)
                last = op
            firsts[topic][reader] = rank
    for topic, ranks in firsts.items():
        for a, b in itertools.combinations(sorted(ranks), 2):
            common = sorted((v for v in ranks[a] if v in ranks[b]), key=ranks[a].__getitem__)
            for x, y in itertools.pairwise(common):
                if ranks[b][x] > ranks[b][y]:
                    result.add("order_disagreement", topic=topic, readers=(a, b), values=(x, y),
                               why="two readers saw two values in opposite orders")
                    break

    # contiguity: a transaction's values in a topic keep their send order, stored and read
    for t, txn in txns.items():
        for topic, values in txn.values.items():
            ids = [sent_id[v] for v in values if v in sent_id]
            if ids != sorted(ids):
                result.add("non_contiguous", txn=t, topic=topic, why="acknowledged ids out of send order")
            order = {v: i for i, v in enumerate(values)}
            for reader, per_topic in reads.items():
                got = [op.value for op in per_topic.get(topic, ()) if op.value in order]
                got = list(dict.fromkeys(got))
                if [order[v] for v in got] != sorted(order[v] for v in got):
                    result.add("non_contiguous", txn=t, topic=topic, reader=reader, read=got,
                               why="read out of send order")

    # lost writes and torn transactions
    for reader in set(reads) | set(drains):
        for topic in set(reads[reader]) | set(drains[reader]):
            rs = reads[reader].get(topic, [])
            read_here = {op.value for op in rs}
            max_read = max((tuple(op.msg_id) for op in rs), default=None)  # type: ignore[arg-type]
            last_drain = max((op.index for op in drains[reader].get(topic, ())), default=-1)
            for t, txn in txns.items():
                values = txn.values.get(topic)
                if not values or outcome[t] == ABORTED:
                    continue
                if outcome[t] == UNKNOWN and t not in seen_txns:
                    continue                                    # aborted, as far as anyone saw
                done = txn.commit_done.index if txn.commit_done is not None else None
                missing = [v for v in values if v not in read_here]
                if not missing:
                    continue
                # where a value is stored: its acknowledged id, else where the other readers read it
                # (a resend answered by de-duplication, a send or commit of unknown outcome)
                stored_at = {v: sent_id.get(v, read_id.get((topic, v))) for v in missing}
                passed = [v for v in missing
                          if max_read is not None and stored_at[v] is not None and max_read > stored_at[v]]
                should = [v for v in missing if v in passed or (done is not None and last_drain > done)]
                if should:
                    partial = [v for v in values if v in read_here]
                    if partial:
                        kind = "torn_transaction"
                    else:
                        kind = "lost_write" if outcome[t] == COMMITTED else "torn_transaction"
                    result.add(kind, reader=reader, topic=topic, txn=t, outcome=outcome[t], seen=partial,
                               missing=should, why="read past them" if passed else "drained after the commit")

    result.stats = {
        "txns": len(txns),
        "txns_committed": sum(1 for o in outcome.values() if o == COMMITTED),
        "txns_aborted": sum(1 for o in outcome.values() if o == ABORTED),
        "txns_unknown": sum(1 for o in outcome.values() if o == UNKNOWN),
        "txns_unknown_seen": sum(1 for t, o in outcome.items() if o == UNKNOWN and t in seen_txns),
        "values_sent": len(value_txn),
        "values_read": len(seen_values),
        "reads": sum(len(rs) for per_topic in reads.values() for rs in per_topic.values()),
    }
    return result
