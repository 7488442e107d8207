"""Exactly-once consume-transform-produce on a Failover subscription, as the application sees it
(hypothesis, stateful).

The application (benchmarks/transfer.py's cumulative mode): messages m0..mN are published
(plain sends, some as batches); two or three consumers share ONE Failover subscription (or an
Exclusive one: a second consumer is refused); each consumer runs "processors", one at a time:
a processor opens a transaction, takes 1..6 messages from its consumer, acks the last one
cumulatively in the transaction, then commits or aborts. A commit that succeeds means the
messages the processor took are processed, by that transaction. The rules interleave the steps
of processors of different consumers, the coordinator aborting a transaction as on its timeout
(the application is not told: it hears of it when its ack or commit fails), consumers asking
for redelivery, closing, subscribing again (with another priority: the active consumer
switches), with a Failover delay, the delay passing (the handover fired by the test:
deterministic), and (network) the broker restarting on its data dir while transactions are
open (`ExactlyOnceMachine.broker_restarts`), also while a processor commits.

An ack or commit that fails (TransactionConflictError, or any PulsarError) fails the
transaction: the application aborts it (the client's abort rewinds a consumer that acked
cumulatively in it) and, when the transaction did not end aborted here (the coordinator had
aborted it already), asks for redelivery, as transfer.py does. Conflicts are legal; losses and
duplicates are not. At the end, every transaction is ended, the consumers close and a fresh
processor drains the subscription, committing all it takes; then every message must have been
processed by exactly one committed transaction, once: never by two (or twice by one), never by
none. The subscription and its cursor are only looked at, never used to drive the application
(the broker's view of the active consumer only helps choose which consumer a step uses).

The same machine runs through the embedding API and through the network client (against an
in-process broker). `MODEL_EXAMPLES` (environment) sets the examples of the embedded machine
(25 by default; the network one runs a fifth of them, at least 5). The engine bugs the model
found (a Failover consumer active again committed its old copies of messages another one had
committed; the network client's abort did not rewind a consumer whose cumulative ack failed
at the registration) are regression tests at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field

import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from pyengine.broker import Broker
from pyengine.client import Client
from pyengine.errors import PulsarError
from pyengine.transaction import TxnAction
from tests.broker.exactly_once import MAX_RESTARTS, NAMES, ExactlyOnceMachine, model_settings
from tests.broker.helpers import drain, publish_batch
from tests.client.conftest import NetworkBroker

TOPIC = "persistent://public/default/failover-exactly-once"
SUB = "s"
MAX_TAKE = 6
RECEIVE_S = 0.02            # only to learn that nothing is queued
DRAIN_S = 0.05            # the drainer: nothing more comes
HELD_DELAY_MS = 600_000     # "the default delay": the handover waits until a rule lets it go
EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", 25))


@dataclass(eq=False)
class Processor:
    name: str
    slot: int
    consumer: object
    txn: object
    taken: list[tuple[int, object]] = field(default_factory=list)    # (label, message)
    acked: bool = False
    ack_tried: bool = False         # it asked for its cumulative ack (the client's abort rewinds then)
    killed: bool = False            # the coordinator aborted it; the application does not know

    def __repr__(self) -> str:
        return self.name


class FailoverExactlyOnceMachine(ExactlyOnceMachine):
    """Drives the application through the embedding API; `NetworkMachine` through the client."""

    topic = TOPIC

    def __init__(self) -> None:
        super().__init__("pyengine-failover-eo-")
        self.procs: list[Processor] = []

    # --- plumbing -------------------------------------------------------------------------

    async def _open(self, sub_type: str, delay_ms: int) -> None:
        self.sub_type = sub_type
        self.delay_ms = delay_ms
        await self._open_broker(active_consumer_failover_delay_time_ms=delay_ms)

    def subscription(self):
        return self.service.topics[TOPIC].subscriptions[SUB]

    async def _publish(self, count: int, batch: bool) -> None:
        labels = list(range(self.published, self.published + count))
        self.published += count
        payloads = [b"m%d" % label for label in labels]
        if batch and count > 1:
            if self.network:
                await asyncio.gather(*(self.batcher.send(p) for p in payloads))
            else:
                await publish_batch(self.client, self.producer, payloads)
        else:
            for payload in payloads:
                await self.producer.send(payload)

    async def _subscribe(self, slot: int, priority: int, name: str | None = None):
        return await self.client.subscribe(TOPIC, SUB, consumer_type=self.sub_type, initial_position="earliest",
                                           consumer_name=name or NAMES[slot], priority=priority,
                                           receiver_queue_size=1000)

    async def _fire_handover(self) -> bool:
        """The Failover delay passes now (the dispatcher's timer, fired by the test)."""
        dispatcher = self.subscription().dispatcher
        handover = dispatcher._handover
        if handover is None:
            return False
        handover.cancel()
        dispatcher._hand_over()
        return True

    def _live(self, consumer) -> Processor | None:
        for proc in self.procs:
            if proc.consumer is consumer:
                return proc
        return None

    async def _failed(self, proc: Processor, what: str, exc: BaseException) -> None:
        """The application's reaction to a failed ack or commit: abort (see `_ended`)."""
        self.log.append(f"{proc.name} {what} failed: {exc!r}")
        event(f"{what.split(' of ')[0]} failed: {type(exc).__name__}")
        if proc.txn.state != "aborted":
            with contextlib.suppress(PulsarError):
                await proc.txn.abort()
        await self._ended(proc)

    async def _ended(self, proc: Processor) -> None:
        """A processor's transaction ended without committing: what it took must come again.
        The client's abort rewinds a consumer that acked cumulatively in it (Java's); when it
        did not ask for its ack, or the abort failed (the coordinator had aborted the
        transaction), the application asks for the stream again itself, as transfer.py."""
        self.procs.remove(proc)
        rewound = proc.ack_tried and proc.txn.state == "aborted"
        if proc.taken and not rewound and proc.consumer in self.consumers:
            with contextlib.suppress(PulsarError):
                await proc.consumer.redeliver_unacknowledged_messages()
            self.log.append(f"{proc.name} asked for redelivery (txn {proc.txn.state})")

    # --- rules ----------------------------------------------------------------------------

    @initialize(sub_type=st.sampled_from(["failover", "failover", "failover", "exclusive"]),
                delay=st.sampled_from([0, 0, HELD_DELAY_MS]),
                first=st.integers(1, 8), batched=st.booleans(),
                priorities=st.lists(st.integers(0, 1), min_size=2, max_size=3))
    def start(self, sub_type, delay, first, batched, priorities) -> None:
        self.run(self._open(sub_type, delay))
        self.run(self._publish(first, batched))
        for slot, priority in enumerate(priorities):
            self._try_subscribe(slot, priority)

    def _try_subscribe(self, slot: int, priority: int) -> None:
        try:
            consumer = self.consumers[slot] = self.run_quietly(self._subscribe(slot, priority))
        except PulsarError as exc:          # an Exclusive subscription's second consumer
            self.log.append(f"{NAMES[slot]} refused: {exc!r}")
            return
        self.log.append(f"{NAMES[slot]} subscribed (priority {priority})")
        self.run(self._settle())

    @precondition(lambda self: self.published < 40)
    @rule(count=st.integers(1, 4), batch=st.booleans())
    def publish(self, count, batch) -> None:
        self.run(self._publish(count, batch))

    @rule(slot=st.integers(0, len(NAMES) - 1),
          change=st.sampled_from(["close", "subscribe 0", "subscribe 1", "redeliver", "delay passes"]))
    def consumer_changes(self, slot, change) -> None:
        """A consumer closes, subscribes (with priority 0 or 1: the active one may switch), or
        asks for redelivery (between its processors' transactions, as an application does);
        or the Failover delay of a switch under way passes (the broker's timer, fired now)."""
        consumer = self.consumers[slot]
        if change == "delay passes":
            if self.run(self._fire_handover()):
                self.log.append("the failover delay passed")
                self.run(self._settle())
            return
        if change == "close" and consumer is not None:
            self.consumers[slot] = None
            self.run(consumer.close())
            self.log.append(f"{NAMES[slot]} closed")
        elif change.startswith("subscribe") and consumer is None:
            self._try_subscribe(slot, int(change[-1]))
        elif change == "redeliver" and consumer is not None and self._live(consumer) is None:
            self.run(consumer.redeliver_unacknowledged_messages())
            self.log.append(f"{NAMES[slot]} asked for redelivery")
        self.run(self._settle())

    def _active_slots(self) -> list[int]:
        """The slots whose consumer the broker made active (only to choose the steps: the
        clients hear it a moment later over the network, see `_settle`)."""
        active = {c.name for c in self.subscription().consumers if c.active}
        return [slot for slot, consumer in enumerate(self.consumers) if consumer is not None and NAMES[slot] in active]

    async def _settle(self) -> None:
        """Wait until the consumers heard whether they are active (ACTIVE_CONSUMER_CHANGE, on
        its way over the network), so that what the application hears does not depend on
        timing. Nothing to wait for through the embedding API, nor on an Exclusive
        subscription (no ACTIVE_CONSUMER_CHANGE, as Pulsar)."""
        if not self.network or self.sub_type != "failover":
            return
        for _ in range(400):
            active = {c.name: c.active for c in self.subscription().consumers}
            if all(consumer is None or consumer.active == active.get(NAMES[slot], False)
                   for slot, consumer in enumerate(self.consumers)):
                return
            await asyncio.sleep(0.005)
        raise AssertionError("the consumers never heard which one is active")

    @precondition(lambda self: self._active_slots())
    @rule()
    def active_consumer_closes(self) -> None:
        """The active consumer goes away: another one becomes active (gets what it left)."""
        slot = self._active_slots()[0]
        consumer, self.consumers[slot] = self.consumers[slot], None
        self.run(consumer.close())
        self.log.append(f"{NAMES[slot]} (active) closed")
        self.run(self._settle())

    def _procs(self, predicate):
        return [p for p in self.procs if predicate(p)]

    def _may_take(self, slot: int) -> bool:
        consumer = self.consumers[slot]
        if consumer is None:
            return False
        proc = self._live(consumer)
        return proc is None or (not proc.acked and len(proc.taken) < MAX_TAKE)

    @precondition(lambda self: any(self._may_take(slot) for slot in range(len(NAMES))))
    @rule(data=st.data(), count=st.integers(1, 4), then_ack=st.booleans())
    def take(self, data, count, then_ack) -> None:
        """The consumer's processor (a new one, in a new transaction, if it has none) takes up
        to `count` messages (and acks, `then_ack`)."""
        slots = [slot for slot in range(len(NAMES)) if self._may_take(slot)]
        # mostly the active consumer's (the application hears which one is: its listener)
        active = [slot for slot in slots if slot in self._active_slots()]
        slot = data.draw(st.one_of(st.sampled_from(active), st.sampled_from(slots)) if active
                         else st.sampled_from(slots))
        consumer = self._last_taker = self.consumers[slot]
        proc = self._live(consumer)
        if proc is None:
            self.txn_count += 1
            txn = self.run(self.client.new_transaction(timeout_ms=HELD_DELAY_MS))
            proc = Processor(f"t{self.txn_count}@{NAMES[slot]}", slot, consumer, txn)
            self.procs.append(proc)
            self.log.append(f"{proc.name} begins")
        for _ in range(min(count, MAX_TAKE - len(proc.taken))):
            try:
                message = self.run_quietly(proc.consumer.receive(timeout=RECEIVE_S))
            except TimeoutError:
                self.log.append(f"{proc.name} got nothing")
                break
            label = int(message.data[1:])
            proc.taken.append((label, message))
            self.log.append(f"{proc.name} took m{label} at {message.message_id}")
        if then_ack and proc.taken:
            self._ack(proc)

    @precondition(lambda self: any(self._may_take(slot) for slot in range(len(NAMES))))
    @rule(data=st.data(), count=st.integers(1, MAX_TAKE))
    def process(self, data, count) -> None:
        """A processor's whole cycle at once (the common case): take, ack, commit."""
        self.take(data=data, count=count, then_ack=True)
        done = self._procs(lambda p: p.acked and p.consumer is self._last_taker)
        if done:
            self._end(done[0], True)

    @precondition(lambda self: self._procs(lambda p: p.taken and not p.acked))
    @rule(data=st.data())
    def ack(self, data) -> None:
        self._ack(data.draw(st.sampled_from(self._procs(lambda p: p.taken and not p.acked))))

    def _ack(self, proc: Processor) -> bool:
        """The processor acks the last message it took, cumulatively, in its transaction."""
        label, last = proc.taken[-1]
        proc.ack_tried = True
        try:
            self.run_quietly(proc.consumer.acknowledge_cumulative(last, txn=proc.txn))
        except PulsarError as exc:
            self.run(self._failed(proc, f"cumulative ack of m{label}", exc))
            return False
        proc.acked = True
        self.log.append(f"{proc.name} acked up to m{label}")
        return True

    @precondition(lambda self: self.procs)
    @rule(data=st.data(), commit=st.sampled_from([True, True, False]))
    def end(self, data, commit) -> None:
        """A processor ends its transaction: commits it (after its ack, if not made yet), or
        aborts it; one that took nothing aborts."""
        self._end(data.draw(st.sampled_from(self.procs)), commit)

    def _end(self, proc: Processor, commit: bool) -> None:
        if commit and proc.taken and not proc.acked and not proc.ack_tried:
            if not self._ack(proc):
                return
        if commit and proc.acked:
            try:
                self.run_quietly(proc.txn.commit())
            except PulsarError as exc:
                self.run(self._failed(proc, "commit", exc))
                return
            self._committed(proc)
            return
        try:
            self.run_quietly(proc.txn.abort())
        except PulsarError as exc:
            self.log.append(f"{proc.name} abort failed: {exc!r}")
        else:
            self.log.append(f"{proc.name} aborted")
        self.run(self._ended(proc))

    def _committed(self, proc: Processor) -> None:
        assert not proc.killed, f"{proc.name}: a transaction the coordinator aborted committed"
        self.procs.remove(proc)
        for label, _message in proc.taken:
            self.processed[label].append(proc.name)
        self.log.append(f"{proc.name} committed {[label for label, _ in proc.taken]}")
        event("a processor committed")

    @precondition(lambda self: self.network and self.restarts < MAX_RESTARTS and self._procs(lambda p: p.acked))
    @rule(data=st.data(), after_s=st.sampled_from([0, 0.001, 0.003]))
    def broker_restarts_during_commit(self, data, after_s) -> None:
        """A processor that acked cumulatively commits while the broker restarts (see
        `ExactlyOnceMachine._commit_across_restart`): a durable decision must hold across the
        restart, and the cumulative ack with it."""
        proc = data.draw(st.sampled_from(self._procs(lambda p: p.acked)))
        self.log.append(f"{proc.name} commits while the broker restarts ({after_s} s later)")
        failure = self.run(self._commit_across_restart(proc.name, proc.txn, after_s))
        if failure is not None:
            self.run(self._failed(proc, "commit", failure))
            return
        self._committed(proc)

    @precondition(lambda self: self._procs(lambda p: not p.killed and p.taken))
    @rule(data=st.data())
    def coordinator_aborts(self, data) -> None:
        """As on the transaction's timeout: the application is not told."""
        proc = data.draw(st.sampled_from(self._procs(lambda p: not p.killed and p.taken)))
        proc.killed = True
        self.run(self.service.coordinator.end_transaction(proc.txn.txn_id, TxnAction.ABORT))
        self.log.append(f"{proc.name} aborted by the coordinator")

    # --- the end: every transaction ended, the subscription drained, the contract checked ----

    async def _drain_and_check(self) -> None:
        for proc in list(self.procs):
            with contextlib.suppress(PulsarError):
                await proc.txn.abort()
        self.procs.clear()
        for slot, consumer in enumerate(self.consumers):
            if consumer is not None:
                await consumer.close()
                self.consumers[slot] = None
        await self._fire_handover()
        consumer = await self._subscribe(0, 0, name="drainer")
        await self._fire_handover()
        conflicts = 0
        idle = 0
        while True:
            taken = [(int(m.data[1:]), m) for m in await drain(consumer, timeout=DRAIN_S)]
            if not taken:
                if self.subscription().backlog() == 0:
                    break
                idle += 1
                assert idle < 5, f"the subscription holds {self.subscription().backlog()} messages it never delivers"
                await consumer.redeliver_unacknowledged_messages()
                continue
            self.txn_count += 1
            name = f"t{self.txn_count}@drainer"
            txn = await self.client.new_transaction(timeout_ms=HELD_DELAY_MS)
            try:
                await consumer.acknowledge_cumulative(taken[-1][1], txn=txn)
                await txn.commit()
            except PulsarError as exc:
                self.log.append(f"{name} failed: {exc!r}")
                conflicts += 1
                assert conflicts < 5, f"the drainer's transactions keep failing: {exc!r}"
                with contextlib.suppress(PulsarError):
                    await txn.abort()
                await consumer.redeliver_unacknowledged_messages()
                continue
            for label, _message in taken:
                self.processed[label].append(name)
            self.log.append(f"{name} committed {[label for label, _ in taken]}")
        await consumer.close()
        self.check_exactly_once(f" (mark-delete {self.subscription().cursor.mark_delete})")


class NetworkMachine(FailoverExactlyOnceMachine):
    network = True


FailoverExactlyOnceMachine.TestCase.settings = model_settings(EXAMPLES)
test_failover_exactly_once_model = FailoverExactlyOnceMachine.TestCase

NetworkMachine.TestCase.settings = model_settings(max(5, EXAMPLES // 5))
test_failover_exactly_once_model_network = NetworkMachine.TestCase


# --- the bugs the model found (fixed), as deterministic regression tests ----------------------

REPRO = "persistent://public/default/failover-active-again"
# A Failover consumer made inactive and then active again kept the copies queued (or handed
# out) before its handover; the messages another consumer processed and committed meanwhile
# were processed and committed again: its cumulative ack started above the cursor's
# mark-delete, so neither the inactive-consumer rule nor the stale rule refused it. A handover
# now makes what the consumer holds stale (`Dispatcher._hand_over`).


async def _active_again_duplicates(client, producer_send, service) -> list[bytes]:
    """a (a receiver queue of 3) is active and is sent m0..m2; b, of a better priority, takes
    over (a's unacknowledged messages go to it) and commits m0..m2; b closes: a is active
    again, and is sent m3..m5 (b's unacknowledged ones) once it takes from its queue, which
    still holds m0..m2: a processor takes m0..m3 and commits them. Returns what a's committed
    transaction processed that b's had too (deterministic: nothing waits on a timing)."""
    for i in range(6):
        await producer_send(b"m%d" % i)
    a = await client.subscribe(REPRO, SUB, consumer_type="failover", initial_position="earliest",
                               consumer_name="a", priority=1, receiver_queue_size=3)
    for _ in range(500):            # a is sent m0..m2 (its permits)
        if len(service.topics[REPRO].subscriptions[SUB].consumers[0].pending) == 3:
            break
        await asyncio.sleep(0.01)
    b = await client.subscribe(REPRO, SUB, consumer_type="failover", initial_position="earliest",
                               consumer_name="b", priority=0)
    by_b = [await b.receive(timeout=5) for _ in range(3)]
    assert [m.data for m in by_b] == [b"m0", b"m1", b"m2"]
    txn = await client.new_transaction()
    await b.acknowledge_cumulative(by_b[-1], txn=txn)
    await txn.commit()
    await b.close()
    by_a = [await a.receive(timeout=5) for _ in range(4)]
    assert [m.data for m in by_a] == [b"m0", b"m1", b"m2", b"m3"]
    txn = await client.new_transaction()
    try:
        await a.acknowledge_cumulative(by_a[-1], txn=txn)
        await txn.commit()
    except PulsarError:             # what the engine should do: refuse it (a conflict), or...
        with contextlib.suppress(PulsarError):
            await txn.abort()
        return []
    # ... or a's queue should not have held m0..m2 any more
    return sorted({m.data for m in by_a} & {m.data for m in by_b})


async def test_a_consumer_active_again_does_not_commit_what_another_processed(tmp_path):
    async with Broker.embedded(tmp_path, active_consumer_failover_delay_time_ms=0) as broker:
        producer = await broker.create_producer(REPRO)
        assert await _active_again_duplicates(broker, producer.send, broker.service) == []


async def test_a_consumer_active_again_does_not_commit_what_another_processed_network(tmp_path):
    network_broker = NetworkBroker(tmp_path / "data", num_coordinators=1, active_consumer_failover_delay_time_ms=0)
    await network_broker.start()
    try:
        async with Client(network_broker.url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer(REPRO)
            assert await _active_again_duplicates(client, producer.send, network_broker.service) == []
    finally:
        await network_broker.stop()


# The network client: a transactional cumulative ack that failed at the subscription's
# registration (the coordinator had aborted the transaction, as on its timeout) did not
# register the consumer with the transaction, so the client's abort did not rewind it (Java's
# and the embedding API's do): the message the application took and dropped stayed out, and
# the next transaction's cumulative ack acknowledged it unprocessed.


async def test_the_abort_after_a_refused_cumulative_ack_rewinds_the_consumer_network(tmp_path):
    topic = "persistent://public/default/failed-ack-rewind"
    network_broker = NetworkBroker(tmp_path / "data", num_coordinators=1)
    await network_broker.start()
    try:
        async with Client(network_broker.url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer(topic)
            for i in range(2):
                await producer.send(b"m%d" % i)
            consumer = await client.subscribe(topic, SUB, consumer_type="exclusive", initial_position="earliest")
            txn = await client.new_transaction()
            taken = await consumer.receive(timeout=5)
            assert taken.data == b"m0"
            # the coordinator aborts it as on its timeout; the application is not told
            await network_broker.service.coordinator.end_transaction(txn.txn_id, TxnAction.ABORT)
            with pytest.raises(PulsarError):
                await consumer.acknowledge_cumulative(taken, txn=txn)
            await txn.abort()               # the application's abort (Java's rewinds the consumer)
            assert txn.state == "aborted"
            txn = await client.new_transaction()
            again = await consumer.receive(timeout=5)
            await consumer.acknowledge_cumulative(again, txn=txn)
            await txn.commit()
            # m0 was taken by the aborted transaction only: it must come again (not be acked)
            assert again.data == b"m0", f"{again.data} came next: m0 is acknowledged, never processed"
    finally:
        await network_broker.stop()
