"""The engine against a reference model of READ_COMMITTED semantics (hypothesis, stateful).

Random interleavings of plain sends, transactional sends, plain acks, transactional acks,
commits, aborts, timeouts and restarts. After every step the model says which messages a
consumer may receive (committed or plain, before the first message of any open transaction,
not acknowledged, not reserved by an open transaction's ack) and which are acknowledged; the
engine must agree exactly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from pyengine.broker.embedded import EmbeddedTransaction
from pyengine.errors import InvalidTxnStatusError, TransactionConflictError
from tests.broker.helpers import EmbeddedBrokerMachine

TOPIC = "persistent://public/default/model"
SUB = "s"


@dataclass
class ModelMessage:
    label: int
    txn: int | None


@dataclass
class Model:
    messages: list[ModelMessage] = field(default_factory=list)
    txns: dict[int, str] = field(default_factory=dict)          # txn label -> open/committed/aborted
    acked: set[int] = field(default_factory=set)
    reserved: dict[int, int] = field(default_factory=dict)      # message label -> txn label
    doomed: set[int] = field(default_factory=set)               # txns with a failed op: commit aborts them

    def visible(self) -> list[int]:
        out = []
        for message in self.messages:
            state = self.txns.get(message.txn) if message.txn is not None else "plain"
            if state == "open":
                break                       # the read horizon: nothing at or after an open txn's first message
            if state in ("plain", "committed"):
                out.append(message.label)
        return out

    def horizon(self) -> int:
        """Index of the first message of an open transaction (len(messages) if none)."""
        return next((i for i, m in enumerate(self.messages)
                     if m.txn is not None and self.txns[m.txn] == "open"), len(self.messages))

    def deliverable(self) -> list[int]:
        return [m for m in self.visible() if m not in self.acked and m not in self.reserved]

    def end(self, txn: int, commit: bool) -> None:
        self.txns[txn] = "committed" if commit else "aborted"
        for label, owner in list(self.reserved.items()):
            if owner == txn:
                del self.reserved[label]
                if commit:
                    self.acked.add(label)


class ReadCommittedMachine(EmbeddedBrokerMachine):
    """Subclasses run the same model against another transaction design (v5 in
    tests/transaction/v5/test_read_committed_model.py) through the hooks below."""

    topic = TOPIC

    async def new_txn(self, timeout: int) -> EmbeddedTransaction:
        return await self.broker.new_transaction(timeout_ms=timeout)

    async def settle(self) -> None:
        """Wait until the decisions taken so far are applied by every participant."""

    async def expire(self) -> None:
        """The coordinator aborts the txns whose timeout has passed."""
        coordinator = self.broker.service.coordinator
        coordinator.poll_timeouts()
        await coordinator.wait_for_endings()

    async def ended(self, handle: EmbeddedTransaction) -> bool:
        return self.broker.service.coordinator.get(handle.txn_id).status.outcome is not None

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()

    @initialize()
    def start(self) -> None:
        self.run(self._open())

    # --- rules ----------------------------------------------------------------------------

    @rule()
    def send(self) -> None:
        label = self.next_label
        self.next_label += 1
        self.ids[label] = self.run(self.producer.send(str(label).encode()))
        self.model.messages.append(ModelMessage(label, None))

    @precondition(lambda self: len(self.open_txns()) < 3)
    @rule(timeout=st.sampled_from([60_000, 60_000, 1_000]))
    def begin(self, timeout) -> None:
        handle = self.run(self.new_txn(timeout))
        label = len(self.model.txns)
        self.model.txns[label] = "open"
        self.handles[label] = handle

    @precondition(lambda self: self.open_txns())
    @rule(data=st.data())
    def txn_send(self, data) -> None:
        txn = data.draw(st.sampled_from(self.open_txns()))
        label = self.next_label
        self.next_label += 1
        self.ids[label] = self.run(self.producer.send(str(label).encode(), txn=self.handles[txn]))
        self.model.messages.append(ModelMessage(label, txn))

    @precondition(lambda self: self.model.deliverable())
    @rule(data=st.data())
    def ack(self, data) -> None:
        label = data.draw(st.sampled_from(self.model.deliverable()))
        self.run(self.consumer.acknowledge(self.ids[label]))
        self.model.acked.add(label)

    @precondition(lambda self: self.open_txns() and self.model.visible())
    @rule(data=st.data())
    def txn_ack(self, data) -> None:
        txn = data.draw(st.sampled_from(self.open_txns()))
        label = data.draw(st.sampled_from(self.model.visible()))
        conflict = label in self.model.acked or label in self.model.reserved
        try:
            self.run(self.consumer.acknowledge(self.ids[label], txn=self.handles[txn]))
        except TransactionConflictError:
            assert conflict, f"unexpected conflict acking {label} in txn {txn}"
            self.model.doomed.add(txn)      # the client aborts a txn whose ack failed when it commits
            return
        assert not conflict, f"acking {label} in txn {txn} should have conflicted"
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
        """Two seconds pass: transactions opened with a 1 s timeout are aborted by their
        coordinator, the 60 s ones stay open; a commit of a timed-out one is refused."""
        self.now_ms += 2_000
        self.run(self.expire())
        for txn in self.open_txns():
            handle = self.handles[txn]
            if self.run(self.ended(handle)):
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
    def engine_agrees_with_the_model(self) -> None:
        if self.stack is None:
            return
        self.run(self.settle())

        async def redeliver_and_drain():
            await self.consumer.redeliver_unacknowledged_messages()
            got = []
            while True:
                try:
                    got.append(await self.consumer.receive(timeout=0.02))
                except TimeoutError:
                    return got

        # What a consumer may see: exactly the deliverable messages.
        received = [int(m.data) for m in self.run(redeliver_and_drain())]
        assert sorted(received) == sorted(self.model.deliverable()), (received, self.model)
        # What is acknowledged: the model's acks; entries of aborted txns before the read horizon
        # are acknowledged by the dispatcher (never backlog), beyond it they are not yet known.
        subscription = self.broker.service.topics[self.topic].subscriptions[SUB]
        horizon = self.model.horizon()
        for index, message in enumerate(self.model.messages):
            acked = subscription.cursor.is_acked(self.ids[message.label].position)
            if message.txn is not None and self.model.txns[message.txn] == "aborted":
                assert acked or index > horizon, message
            else:
                assert acked == (message.label in self.model.acked), message


ReadCommittedMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("MODEL_EXAMPLES", 25)), stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_read_committed_model = ReadCommittedMachine.TestCase
