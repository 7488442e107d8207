"""Cumulative acknowledgements against a reference model (hypothesis, stateful).

tests/broker/test_read_committed_model.py covers a Shared subscription with individual acks.
This one covers what only Exclusive/Failover subscriptions do: plain and transactional
cumulative acks (with individual ones beside them), interleaved with plain and transactional
sends, commits, aborts, timeouts and restarts. The engine decides the conflicts (its rules
depend on the cursor's mark-delete position, markers included); the model follows what it
decided and says, after every step, exactly which messages the consumer may receive: visible,
not acknowledged, not held by an open transaction (individually or under its cumulative ack).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from pyengine.errors import InvalidTxnStatusError, TransactionConflictError
from tests.broker.helpers import EmbeddedBrokerMachine

TOPIC = "persistent://public/default/cumulative-model"
SUB = "s"


@dataclass
class Model:
    messages: list[tuple[int, int | None]] = field(default_factory=list)    # (label, txn label)
    txns: dict[int, str] = field(default_factory=dict)       # open / committed / aborted
    acked: set[int] = field(default_factory=set)
    reserved: dict[int, int] = field(default_factory=dict)   # message label -> txn holding it
    cumulative: dict[int, int] = field(default_factory=dict)  # txn -> label it acked up to
    doomed: set[int] = field(default_factory=set)

    def visible(self) -> list[int]:
        out = []
        for label, txn in self.messages:
            state = "plain" if txn is None else self.txns[txn]
            if state == "open":
                break
            if state != "aborted":
                out.append(label)
        return out

    def up_to(self, label: int) -> list[int]:
        visible = self.visible()
        return visible[:visible.index(label) + 1]

    def held(self) -> set[int]:
        held = set(self.reserved)
        for txn, label in self.cumulative.items():
            if self.txns[txn] == "open":
                held.update(self.up_to(label))
        return held

    def deliverable(self) -> list[int]:
        held = self.held()
        return [m for m in self.visible() if m not in self.acked and m not in held]

    def end(self, txn: int, commit: bool) -> None:
        self.txns[txn] = "committed" if commit else "aborted"
        for label, owner in list(self.reserved.items()):
            if owner == txn:
                del self.reserved[label]
                if commit:
                    self.acked.add(label)
        label = self.cumulative.pop(txn, None)
        if label is not None and commit:
            self.acked.update(self.up_to(label))


class CumulativeAckMachine(EmbeddedBrokerMachine):
    topic = TOPIC

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()

    @initialize(sub_type=st.sampled_from(["exclusive", "failover"]))
    def start(self, sub_type) -> None:
        self.consumer_type = sub_type
        self.run(self._open())

    # --- rules ----------------------------------------------------------------------------

    @rule()
    def send(self) -> None:
        label = self.next_label
        self.next_label += 1
        self.ids[label] = self.run(self.producer.send(str(label).encode()))
        self.model.messages.append((label, None))

    @precondition(lambda self: len(self.open_txns()) < 3)
    @rule(timeout=st.sampled_from([60_000, 60_000, 1_000]))
    def begin(self, timeout) -> None:
        label = len(self.model.txns)
        self.handles[label] = self.run(self.broker.new_transaction(timeout_ms=timeout))
        self.model.txns[label] = "open"

    @precondition(lambda self: self.open_txns())
    @rule(data=st.data())
    def txn_send(self, data) -> None:
        txn = data.draw(st.sampled_from(self.open_txns()))
        label = self.next_label
        self.next_label += 1
        self.ids[label] = self.run(self.producer.send(str(label).encode(), txn=self.handles[txn]))
        self.model.messages.append((label, txn))

    @precondition(lambda self: self.model.deliverable())
    @rule(data=st.data())
    def ack_cumulative(self, data) -> None:
        label = data.draw(st.sampled_from(self.model.deliverable()))
        self.run(self.consumer.acknowledge_cumulative(self.ids[label]))
        self.model.acked.update(self.model.up_to(label))

    @precondition(lambda self: self.open_txns() and self.model.visible())
    @rule(data=st.data(), cumulative=st.booleans())
    def txn_ack(self, data, cumulative) -> None:
        txn = data.draw(st.sampled_from(self.open_txns()))
        # Latest first: what hypothesis draws most (and shrinks to) is the ack covering most.
        label = data.draw(st.sampled_from(self.model.visible()[::-1]))
        handle = self.handles[txn]
        ack = self.consumer.acknowledge_cumulative if cumulative else self.consumer.acknowledge
        others_hold = self.model.held() - {m for m, owner in self.model.reserved.items() if owner == txn}
        if txn in self.model.cumulative:
            others_hold -= set(self.model.up_to(self.model.cumulative[txn]))
        try:
            self.run(ack(self.ids[label], txn=handle))
        except TransactionConflictError:
            self.model.doomed.add(txn)
            return
        # Whatever the engine's exact rules, it never gives a transaction what another
        # transaction holds or a message acknowledged already. A cumulative ack is refused at or
        # below the mark-delete position (everything up to it acknowledged), as in Apache; above
        # it, its target may be acknowledged individually already, and stays so whatever becomes
        # of the transaction.
        taken = self.model.up_to(label) if cumulative else [label]
        assert label not in others_hold, (label, txn, self.model)
        assert not set(taken) <= self.model.acked if cumulative else label not in self.model.acked, \
            (label, txn, self.model)
        if cumulative:
            assert not set(taken) & others_hold, (label, txn, self.model)
            self.model.cumulative[txn] = label
        else:
            self.model.reserved[label] = txn

    @precondition(lambda self: self.open_txns())
    @rule(data=st.data(), commit=st.booleans())
    def end(self, data, commit) -> None:
        txn = data.draw(st.sampled_from(self.open_txns()))
        handle = self.handles[txn]
        if commit and txn in self.model.doomed:
            try:
                self.run(handle.commit())
            except TransactionConflictError:
                self.model.end(txn, False)
                return
            raise AssertionError("a transaction with a failed ack committed")
        self.run(handle.commit() if commit else handle.abort())
        self.model.end(txn, commit)

    @precondition(lambda self: self.open_txns())
    @rule()
    def time_passes(self) -> None:
        self.now_ms += 2_000
        coordinator = self.broker.service.coordinator

        async def expire():
            coordinator.poll_timeouts()
            await coordinator.wait_for_endings()

        self.run(expire())
        for txn in self.open_txns():
            handle = self.handles[txn]
            if coordinator.get(handle.txn_id).status.outcome is not None:
                self.model.end(txn, False)
                expected = TransactionConflictError if txn in self.model.doomed else InvalidTxnStatusError
                try:
                    self.run(handle.commit())
                except expected:
                    pass
                else:
                    raise AssertionError("a timed-out transaction committed")

    # --- what the engine must agree on ------------------------------------------------------

    @invariant()
    def the_consumer_gets_exactly_the_deliverable_messages(self) -> None:
        if self.stack is None:
            return

        async def redeliver_and_drain():
            await self.consumer.redeliver_unacknowledged_messages()
            got = []
            while True:
                try:
                    got.append(await self.consumer.receive(timeout=0.02))
                except TimeoutError:
                    return got

        received = [int(m.data) for m in self.run(redeliver_and_drain())]
        assert sorted(received) == sorted(self.model.deliverable()), (received, self.model)
        assert len(received) == len(set(received)), received
        cursor = self.broker.service.topics[TOPIC].subscriptions[SUB].cursor
        for label, _txn in self.model.messages:
            if label in self.model.visible():
                assert cursor.is_acked(self.ids[label].position) == (label in self.model.acked), (label, self.model)


CumulativeAckMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("MODEL_EXAMPLES", 25)), stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_cumulative_ack_model = CumulativeAckMachine.TestCase
