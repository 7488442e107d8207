"""The engine against a reference model of READ_COMMITTED semantics (hypothesis, stateful).

Random interleavings of plain sends (single messages and batch entries), transactional sends,
plain acks, transactional acks (a batch's messages one by one: batch-index acks), commits,
aborts, timeouts and restarts. After every step the model says which messages a
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
from pyengine.client import MessageId
from pyengine.errors import InvalidTxnStatusError, TransactionConflictError
from tests.broker.helpers import EmbeddedBrokerMachine, publish_batch

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

    @rule(size=st.integers(2, 4))
    def send_batch(self, size) -> None:
        labels = list(range(self.next_label, self.next_label + size))
        self.next_label += size
        position = self.run(publish_batch(self.broker, self.producer, [str(label).encode() for label in labels]))
        for index, label in enumerate(labels):
            self.ids[label] = MessageId(position.ledger_id, position.entry_id, index, batch_size=size)
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
            message_id = self.ids[message.label]
            acked = subscription.cursor.is_acked(message_id.position)
            if not acked and message_id.batch_index >= 0:
                ack_set = subscription.cursor.batch_ack_set(message_id.position)
                acked = ack_set is not None and not ack_set[0] >> message_id.batch_index & 1
            if message.txn is not None and self.model.txns[message.txn] == "aborted":
                assert acked or index > horizon, message
            else:
                assert acked == (message.label in self.model.acked), message


ReadCommittedMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("MODEL_EXAMPLES", 25)), stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_read_committed_model = ReadCommittedMachine.TestCase


@dataclass
class BatchModel:
    """Batch entries on a Shared subscription, acknowledged message by message in txns."""

    messages: list[int] = field(default_factory=list)
    txns: dict[int, str] = field(default_factory=dict)          # txn label -> open/committed/aborted
    acked: set[int] = field(default_factory=set)
    reserved: dict[int, int] = field(default_factory=dict)      # message label -> txn label

    def deliverable(self) -> list[int]:
        return [m for m in self.messages if m not in self.acked and m not in self.reserved]

    def end(self, txn: int, commit: bool) -> None:
        self.txns[txn] = "committed" if commit else "aborted"
        for label, owner in list(self.reserved.items()):
            if owner == txn:
                del self.reserved[label]
                if commit:
                    self.acked.add(label)


class SharedBatchTxnMachine(EmbeddedBrokerMachine):
    """The soak's consume-transform-produce in small: batch entries, two Shared consumers that
    acknowledge single messages of them in transactions (conflicting over a batch's indexes),
    commits, aborts, a consumer closed and subscribed again, restarts. Every message not
    acknowledged by a committed txn nor held by an open one must be delivered again, once; a
    message is never acknowledged twice. Subclasses run it on another design."""

    topic = "persistent://public/default/batch-model"

    async def new_txn(self) -> EmbeddedTransaction:
        return await self.broker.new_transaction()

    async def settle(self) -> None:
        """Wait until the decisions taken so far are applied by every participant."""

    def __init__(self) -> None:
        super().__init__()
        self.model = BatchModel()

    async def _open(self) -> None:
        await super()._open()
        self.consumers = [self.consumer, await self._subscribe()]

    async def _subscribe(self):
        return await self.broker.subscribe(self.topic, self.subscription, consumer_type="shared",
                                           initial_position="earliest", receiver_queue_size=100_000)

    @initialize()
    def start(self) -> None:
        self.run(self._open())

    @rule(size=st.integers(1, 4))
    def send_batch(self, size) -> None:
        labels = list(range(self.next_label, self.next_label + size))
        self.next_label += size
        position = self.run(publish_batch(self.broker, self.producer, [str(label).encode() for label in labels]))
        for index, label in enumerate(labels):
            self.ids[label] = MessageId(position.ledger_id, position.entry_id, index, batch_size=size)
            self.model.messages.append(label)

    @precondition(lambda self: len(self.open_txns()) < 3)
    @rule()
    def begin(self) -> None:
        handle = self.run(self.new_txn())
        label = len(self.model.txns)
        self.model.txns[label] = "open"
        self.handles[label] = handle

    @precondition(lambda self: self.open_txns() and self.model.messages)
    @rule(data=st.data(), by=st.integers(0, 1))
    def txn_ack(self, data, by) -> None:
        txn = data.draw(st.sampled_from(self.open_txns()))
        label = data.draw(st.sampled_from(self.model.messages))
        conflict = label in self.model.acked or label in self.model.reserved
        try:
            self.run(self.consumers[by].acknowledge(self.ids[label], txn=self.handles[txn]))
        except TransactionConflictError:
            assert conflict, f"unexpected conflict acking {label} in txn {txn}"
            # As the soak's processors: a failed ack, so abort.
            self.run(self.handles[txn].abort())
            self.model.end(txn, False)
            return
        assert not conflict, f"acking {label} in txn {txn} should have conflicted"
        self.model.reserved[label] = txn

    @precondition(lambda self: self.open_txns())
    @rule(data=st.data(), commit=st.booleans())
    def end(self, data, commit) -> None:
        txn = data.draw(st.sampled_from(self.open_txns()))
        handle = self.handles[txn]
        self.run(handle.commit() if commit else handle.abort())
        self.model.end(txn, commit)

    @rule(which=st.integers(0, 1))
    def reopen(self, which) -> None:
        """A consumer leaves (what it held goes back) and subscribes again."""
        self.run(self.consumers[which].close())
        self.consumers[which] = self.run(self._subscribe())

    @invariant()
    def every_free_message_comes_again_once(self) -> None:
        if self.stack is None:
            return
        self.run(self.settle())

        async def redeliver_and_drain():
            for consumer in self.consumers:
                await consumer.redeliver_unacknowledged_messages()
            got = []
            for consumer in self.consumers:
                while True:
                    try:
                        got.append(await consumer.receive(timeout=0.02))
                    except TimeoutError:
                        break
            return got

        received = [int(m.data) for m in self.run(redeliver_and_drain())]
        assert sorted(received) == sorted(self.model.deliverable()), (received, self.model)
        subscription = self.broker.service.topics[self.topic].subscriptions[SUB]
        # What an ended txn's acks took from the consumers is not kept: kept after a commit,
        # the next abort gave it back (a committed message delivered again).
        open_ids = {self.handles[label].txn_id for label in self.open_txns()}
        assert set(subscription._reserved_by_txn) <= open_ids, (subscription._reserved_by_txn, self.model)
        cursor = subscription.cursor
        for label in self.model.messages:
            message_id = self.ids[label]
            acked = cursor.is_acked(message_id.position)
            if not acked:
                ack_set = cursor.batch_ack_set(message_id.position)
                acked = ack_set is not None and not ack_set[0] >> message_id.batch_index & 1
            assert acked == (label in self.model.acked), (label, self.model)


SharedBatchTxnMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("MODEL_EXAMPLES", 25)), stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_shared_batch_txn_model = SharedBatchTxnMachine.TestCase
