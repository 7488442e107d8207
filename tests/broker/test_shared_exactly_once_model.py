"""Exactly-once consume-transform-produce on a Shared or Key_Shared subscription, as the
application sees it (hypothesis, stateful).

The application: messages m0..mN are published (plain sends with one of four keys, some as
batches); two or three consumers share ONE Shared (or Key_Shared) subscription; each consumer
runs "processors", one at a time: a processor opens a transaction, takes 1..6 messages from
its consumer, acknowledges each of them INDIVIDUALLY in the transaction (a batch's messages by
their batch index; never cumulatively), produces its output (optional: one message to an
output topic, in the transaction, naming what it processed), then commits or aborts. A commit
that succeeds means the messages the processor acknowledged are processed, by that
transaction. The rules interleave the steps of processors of different consumers, the
coordinator aborting a transaction as on its timeout (the application is not told: it hears of
it when its ack, send or commit fails; also while an ack of it is under way), consumers asking
for redelivery of everything they hold (also while one of their processors holds messages:
those may then go to another consumer too), a processor negatively acknowledging a message it
took and will not process, acknowledging a message twice in its transaction, or acknowledging
a copy another processor holds (Shared: any consumer may acknowledge any message; after the
other one's ack, or both at once), consumers closing and subscribing again, and (network) the
broker restarting on its data dir while transactions are open (the client reconnects; the
transactions, their acks and the processors' copies go on: `ExactlyOnceMachine.broker_restarts`),
also while a processor commits (a commit in doubt is asked again).

An ack, send or commit that fails (TransactionConflictError, or any PulsarError) fails the
transaction: the application aborts it and asks for what it took again (its consumer's
redeliver-all, or a negative ack of each message it took). The messages acknowledged in an
aborted transaction come back by the broker (Pulsar: the abort makes them deliverable
again). Conflicts are legal (two copies of a message out at once, Shared redelivery); losses
and duplicates are not. Checked as the application goes: an individual ack in a transaction
succeeds only for a message neither committed already nor held by another live transaction's
ack (nor by the same transaction's), and a conflict is with something (a committed message, or
one a live transaction's ack holds: a reservation an ended transaction left would keep the
message from everyone). Checked at the end: every transaction is ended, the
consumers close and a fresh processor drains the subscription, committing all it takes; then
every message must have been processed by exactly one committed transaction, once: never by
two (or twice by one), never by none; and the output topic (read committed) must hold exactly
the outputs of the committed transactions that produced one, each once.

The same machine runs through the embedding API and through the network client (against an
in-process broker). `MODEL_EXAMPLES` (environment) sets the examples of the embedded machine
(25 by default; the network one runs a fifth of them, at least 5). The engine bug the model
found (the embedded consumer lost the permits of a redelivered batch's acknowledged messages,
and with a small receiver queue soon got nothing more) is a regression test at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import defaultdict
from dataclasses import dataclass, field

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from pyengine.broker import Broker
from pyengine.client import Client
from pyengine.errors import PulsarError, TransactionConflictError
from pyengine.transaction import TxnAction
from tests.broker.exactly_once import MAX_RESTARTS, NAMES, ExactlyOnceMachine, model_settings
from tests.broker.helpers import publish_batch
from tests.client.conftest import NetworkBroker

TOPIC = "persistent://public/default/shared-exactly-once"
OUT = "persistent://public/default/shared-exactly-once-out"
SUB = "s"
KEYS = ("k0", "k1", "k2", "k3")
MAX_TAKE = 6
RECEIVE_S = 0.02            # only to learn that nothing is queued
DRAIN_S = 0.05              # the drainer: nothing more comes
TXN_TIMEOUT_MS = 600_000    # never reached: the coordinator's abort is a rule
EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", 25))


@dataclass(eq=False)
class Taken:
    label: int
    message: object
    acked: bool = False             # acknowledged in the processor's transaction (answered)

    def __repr__(self) -> str:
        return f"m{self.label}"

    def _repr_pretty_(self, printer, cycle) -> None:      # hypothesis prints the draws so
        printer.text(repr(self))


@dataclass(eq=False)
class Processor:
    name: str
    slot: int
    consumer: object
    txn: object
    recovery: str                   # how it asks for what it took again: "redeliver" / "nack"
    produce: bool                   # whether it produces an output before committing
    taken: list[Taken] = field(default_factory=list)
    killed: bool = False            # the coordinator aborted it; the application does not know

    def __repr__(self) -> str:
        return self.name

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self))

    def unacked(self) -> list[Taken]:
        return [t for t in self.taken if not t.acked]

    def acked(self) -> list[Taken]:
        return [t for t in self.taken if t.acked]


def _label(message) -> int:
    return int(message.data[1:])


async def _together(first: str, **coros) -> dict[str, object]:
    """Run the coroutines at once, `first` started first; what each returned or raised."""
    names = sorted(coros, key=lambda name: name != first)
    outcomes = await asyncio.gather(*(coros[name] for name in names), return_exceptions=True)
    return dict(zip(names, outcomes))


class SharedExactlyOnceMachine(ExactlyOnceMachine):
    """Drives the application through the embedding API; `NetworkMachine` through the client."""

    topic = TOPIC

    def __init__(self) -> None:
        super().__init__("pyengine-shared-eo-")
        self.procs: list[Processor] = []
        self.outputs: dict[str, list[int]] = {}                      # committed txn -> the labels of its output
        self.holders: dict[int, list[Processor]] = defaultdict(list)  # label -> live procs whose ack of it held

    # --- plumbing -------------------------------------------------------------------------

    async def _open(self) -> None:
        await self._open_broker()
        self.out_producer = await self.client.create_producer(OUT)

    def subscription(self):
        return self.service.topics[TOPIC].subscriptions[SUB]

    async def _publish(self, count: int, batch: bool) -> None:
        labels = list(range(self.published, self.published + count))
        self.published += count
        payloads = [b"m%d" % label for label in labels]
        if batch and count > 1:
            if self.network:
                await asyncio.gather(*(self.batcher.send(p, key=KEYS[labels[0] % len(KEYS)]) for p in payloads))
            else:
                await publish_batch(self.client, self.producer, payloads)
        else:
            for label, payload in zip(labels, payloads):
                await self.producer.send(payload, key=KEYS[label % len(KEYS)])
        self.log.append(f"published m{labels[0]}..m{labels[-1]}{' (batch)' if batch and count > 1 else ''}")

    async def _subscribe(self, slot: int, name: str | None = None):
        return await self.client.subscribe(TOPIC, SUB, consumer_type=self.sub_type, initial_position="earliest",
                                           consumer_name=name or NAMES[slot], receiver_queue_size=self.queue_size,
                                           negative_ack_redelivery_delay_ms=0)

    def _live(self, consumer) -> Processor | None:
        for proc in self.procs:
            if proc.consumer is consumer:
                return proc
        return None

    def _procs(self, predicate) -> list[Processor]:
        return [p for p in self.procs if predicate(p)]

    def _forget(self, proc: Processor) -> None:
        """`proc` ended: its acks hold nothing any more."""
        self.procs.remove(proc)
        for taken in proc.taken:
            holders = self.holders.get(taken.label)
            if holders and proc in holders:
                holders.remove(proc)

    async def _failed(self, proc: Processor, what: str, exc: BaseException) -> None:
        """The application's reaction to a failed ack, send or commit: abort (see `_ended`)."""
        self.log.append(f"{proc.name} {what} failed: {exc!r}")
        event(f"{what.split(' of ')[0]} failed: {type(exc).__name__}")
        if proc.txn.state != "aborted":
            with contextlib.suppress(PulsarError):
                await proc.txn.abort()
        await self._ended(proc)

    async def _ended(self, proc: Processor) -> None:
        """A processor's transaction ended without committing: what it took must come again.
        Those it acknowledged in the transaction the broker gives back on the abort; the
        others its consumer still holds, and the application asks for them again: its
        consumer's redeliver-all, or a negative ack of each message it took."""
        self._forget(proc)
        if not proc.taken or proc.consumer not in self.consumers:
            return          # a closed consumer gave back what it held
        with contextlib.suppress(PulsarError):
            if proc.recovery == "redeliver":
                await proc.consumer.redeliver_unacknowledged_messages()
            else:
                for taken in proc.taken:
                    await proc.consumer.negative_acknowledge(taken.message)
        self.log.append(f"{proc.name} asked for redelivery ({proc.recovery}; txn {proc.txn.state})")

    # --- rules ----------------------------------------------------------------------------

    @initialize(sub_type=st.sampled_from(["shared", "key_shared"]), queue_size=st.sampled_from([2, 5, 1000]),
                first=st.integers(1, 8), batched=st.booleans(), consumers=st.integers(2, 3))
    def start(self, sub_type, queue_size, first, batched, consumers) -> None:
        self.sub_type = sub_type
        self.queue_size = queue_size
        self.log.append(f"{sub_type}, receiver queues of {queue_size}")
        event(sub_type)
        self.run(self._open())
        self.run(self._publish(first, batched))
        for slot in range(consumers):
            self.consumers[slot] = self.run(self._subscribe(slot))
            self.log.append(f"{NAMES[slot]} subscribed")

    @precondition(lambda self: self.published < 40)
    @rule(count=st.integers(1, 4), batch=st.booleans())
    def publish(self, count, batch) -> None:
        self.run(self._publish(count, batch))

    @rule(slot=st.integers(0, len(NAMES) - 1), change=st.sampled_from(["close", "subscribe", "redeliver"]))
    def consumer_changes(self, slot, change) -> None:
        """A consumer closes (its processor, if any, goes on: its acks fail from then on),
        subscribes again, or asks for everything it holds again (also while its processor holds
        messages unacknowledged: they may go to another consumer as well)."""
        consumer = self.consumers[slot]
        if change == "close" and consumer is not None:
            self.consumers[slot] = None
            self.run(consumer.close())
            self.log.append(f"{NAMES[slot]} closed")
        elif change == "subscribe" and consumer is None:
            self.consumers[slot] = self.run(self._subscribe(slot))
            self.log.append(f"{NAMES[slot]} subscribed")
        elif change == "redeliver" and consumer is not None:
            self.run(consumer.redeliver_unacknowledged_messages())
            self.log.append(f"{NAMES[slot]} asked for redelivery")

    def _may_take(self, slot: int) -> bool:
        consumer = self.consumers[slot]
        if consumer is None:
            return False
        proc = self._live(consumer)
        return proc is None or len(proc.taken) < MAX_TAKE

    @precondition(lambda self: any(self._may_take(slot) for slot in range(len(NAMES))))
    @rule(data=st.data(), count=st.integers(1, 4), then_ack=st.booleans())
    def take(self, data, count, then_ack) -> None:
        """The consumer's processor (a new one, in a new transaction, if it has none) takes up
        to `count` messages (and acks them, `then_ack`)."""
        self._take(data, count, then_ack)

    def _take(self, data, count: int, then_ack: bool) -> Processor | None:
        slots = [slot for slot in range(len(NAMES)) if self._may_take(slot)]
        slot = data.draw(st.sampled_from(slots))
        consumer = self.consumers[slot]
        proc = self._live(consumer)
        if proc is None:
            self.txn_count += 1
            txn = self.run(self.client.new_transaction(timeout_ms=TXN_TIMEOUT_MS))
            proc = Processor(f"t{self.txn_count}@{NAMES[slot]}", slot, consumer, txn,
                             recovery=data.draw(st.sampled_from(["redeliver", "nack"])),
                             produce=data.draw(st.booleans()))
            self.procs.append(proc)
            self.log.append(f"{proc.name} begins")
        for _ in range(min(count, MAX_TAKE - len(proc.taken))):
            try:
                message = self.run_quietly(proc.consumer.receive(timeout=RECEIVE_S))
            except TimeoutError:
                self.log.append(f"{proc.name} got nothing")
                break
            proc.taken.append(Taken(_label(message), message))
            self.log.append(f"{proc.name} took m{_label(message)} at {message.message_id}")
        if then_ack and proc.unacked():
            self._ack(proc, len(proc.unacked()))
        return proc

    @precondition(lambda self: any(self._may_take(slot) for slot in range(len(NAMES))))
    @rule(data=st.data(), count=st.integers(1, MAX_TAKE))
    def process(self, data, count) -> None:
        """A processor's whole cycle at once (the common case): take, ack, produce, commit."""
        proc = self._take(data, count, then_ack=True)
        if proc in self.procs:
            self._end(proc, True)

    @precondition(lambda self: self._procs(lambda p: p.unacked()))
    @rule(data=st.data(), count=st.integers(1, MAX_TAKE))
    def ack(self, data, count) -> None:
        """A processor acks (up to `count` of) the messages it took and did not ack yet."""
        self._ack(data.draw(st.sampled_from(self._procs(lambda p: p.unacked()))), count)

    def _ack(self, proc: Processor, count: int) -> bool:
        """The processor acks its first `count` unacknowledged messages, one by one,
        individually, in its transaction. False when one failed (the processor ended)."""
        for taken in proc.unacked()[:count]:
            if not self._ack_one(proc, taken):
                return False
        return True

    def _ack_one(self, proc: Processor, taken: Taken, *, expect_conflict: str | None = None) -> bool:
        """Ack `taken` in `proc`'s transaction (see `_acked`)."""
        try:
            self.run_quietly(proc.consumer.acknowledge(taken.message, txn=proc.txn))
        except PulsarError as exc:
            return self._acked(proc, taken, exc, expect_conflict)
        return self._acked(proc, taken, None, expect_conflict)

    def _acked(self, proc: Processor, taken: Taken, failure: BaseException | None,
               expect_conflict: str | None = None, *, held_before: bool = False) -> bool:
        """`proc`'s ack of `taken` ended (`failure`: how it failed). On success, check that
        nobody else holds the message (it is now `proc`'s, processed if `proc` commits); on a
        failure, the transaction fails. `expect_conflict`: why the ack must have been refused
        with TransactionConflictError (unless the coordinator aborted `proc`, or its consumer
        closed). `held_before`: the message was held when the ack was made (acks made at once
        are checked one after the other, and the first one's failure ends its transaction)."""
        label = taken.label
        if proc.consumer not in self.consumers:
            expect_conflict = None          # its consumer closed: refused for that
        if failure is not None:
            if expect_conflict and not proc.killed:
                assert isinstance(failure, TransactionConflictError), \
                    f"{proc.name}: the ack of m{label} ({expect_conflict}) failed with {failure!r}, not a conflict"
            if isinstance(failure, TransactionConflictError) and not proc.killed:
                # with what? a reservation left by a transaction that ended would keep the
                # message from everyone
                assert held_before or self._held_elsewhere(label), \
                    f"{proc.name}: the ack of m{label} conflicted, but nobody holds it: {failure!r}\n" \
                    + "\n".join(self.log)
            self.run(self._failed(proc, f"ack of m{label}", failure))
            return False
        story = "\n".join(self.log)
        assert not expect_conflict or proc.killed, \
            f"{proc.name}: the ack of m{label} succeeded, but {expect_conflict}\n{story}"
        if not proc.killed:
            assert not self.processed.get(label), \
                f"{proc.name} acked m{label}, committed already by {self.processed[label]}\n{story}"
            others = [p for p in self.holders[label] if not p.killed]
            assert not others, f"{proc.name} acked m{label}, which {others} acked and hold\n{story}"
        taken.acked = True
        if taken.message.message_id.batch_index >= 0:
            event("a batch's message acked")
        self.holders[label].append(proc)
        self.log.append(f"{proc.name} acked m{label}")
        return True

    def _held_elsewhere(self, label: int) -> bool:
        """Whether `label` is committed, or held by the ack of a live transaction."""
        return bool(self.processed.get(label)) or any(not p.killed for p in self.holders.get(label, ()))

    def _strays(self) -> list[str]:
        """What `stray` may do now."""
        strays = []
        if self._procs(lambda p: p.unacked() and not p.killed):
            strays.append("nack")
        if self._procs(lambda p: p.acked()):
            strays.append("ack again")
        if len(self.procs) >= 2 and any(p.taken for p in self.procs):
            strays.append("ack another's")
        return strays

    @precondition(lambda self: self._strays())
    @rule(data=st.data())
    def stray(self, data) -> None:
        """A processor steps off the common path (see `_nack`, `_ack_again`, `_ack_anothers`)."""
        {"nack": self._nack, "ack again": self._ack_again,
         "ack another's": self._ack_anothers}[data.draw(st.sampled_from(self._strays()))](data)

    def _nack(self, data) -> None:
        """A processor will not process a message it took: it acks it negatively (before
        acking it) and drops it. It comes again (maybe to another consumer)."""
        proc = data.draw(st.sampled_from(self._procs(lambda p: p.unacked() and not p.killed)))
        taken = data.draw(st.sampled_from(proc.unacked()))
        try:
            self.run_quietly(proc.consumer.negative_acknowledge(taken.message))
        except PulsarError as exc:          # its consumer closed: it gave the message back
            self.log.append(f"{proc.name} nack of m{taken.label} failed: {exc!r}")
        else:
            self.log.append(f"{proc.name} nacked m{taken.label}")
            event("a processor nacked a message")
        proc.taken.remove(taken)

    def _ack_again(self, data) -> None:
        """A processor acks again a message it acked in its transaction: a conflict (legal);
        its transaction fails."""
        proc = data.draw(st.sampled_from(self._procs(lambda p: p.acked())))
        taken = data.draw(st.sampled_from(proc.acked()))
        self.log.append(f"{proc.name} acks m{taken.label} again")
        self._ack_one(proc, Taken(taken.label, taken.message), expect_conflict="it acked it already")

    def _ack_anothers(self, data) -> None:
        """A processor acks a copy of a message another processor took (Shared: any consumer
        may acknowledge any message), after the other one acked it or not, or both at once.
        Refused when the other one acked it already in its live transaction, or it is
        committed; else it is this processor's (to process: the other one's ack of it
        conflicts). Both at once: one of them at most succeeds."""
        other = data.draw(st.sampled_from([p for p in self.procs if p.taken]))
        proc = data.draw(st.sampled_from([p for p in self.procs if p is not other]))
        copy = data.draw(st.sampled_from(other.taken))
        why = None
        if self.processed.get(copy.label):
            why = f"m{copy.label} is committed by {self.processed[copy.label]}"
        elif any(not p.killed for p in self.holders.get(copy.label, ())):
            why = f"m{copy.label} is held by {self.holders[copy.label]}"
        taken = Taken(copy.label, copy.message)
        proc.taken.append(taken)
        if copy.acked or not data.draw(st.booleans()):
            self.log.append(f"{proc.name} acks {other.name}'s m{copy.label}")
            if self._acked(proc, taken, self._ack_failure(proc, taken), why):
                event("a processor acked another's message")
            return
        self.log.append(f"{proc.name} and {other.name} ack m{copy.label} at once")
        first = data.draw(st.sampled_from(["mine", "others"]))
        outcomes = self.run(_together(first=first, mine=self._ack_failure(proc, taken, later=True),
                                      others=self._ack_failure(other, copy, later=True)))
        self.log.append(f"  ({first} first) {outcomes}")
        acks = [(outcomes["mine"], proc, taken), (outcomes["others"], other, copy)]
        # successes first: the second one is checked against the first; a conflict is for it,
        # or for what held the message when both were made (the first failure's handling ends
        # its transaction: `proc` acking its own message again, say)
        held = self._held_elsewhere(copy.label)
        for failure, acker, acked in sorted(acks, key=lambda ack: ack[0] is not None):
            if acker in self.procs:
                self._acked(acker, acked, failure, why, held_before=held)
        event("two processors acked a message at once")

    def _ack_failure(self, proc: Processor, taken: Taken, *, later: bool = False):
        """`proc`'s ack of `taken`: how it failed (None: it did not); `later`: a coroutine
        doing that."""
        async def ack() -> BaseException | None:
            try:
                await proc.consumer.acknowledge(taken.message, txn=proc.txn)
            except PulsarError as exc:
                return exc
            return None
        return ack() if later else self.run(ack())

    @precondition(lambda self: self.procs)
    @rule(data=st.data(), commit=st.sampled_from([True, True, False]))
    def end(self, data, commit) -> None:
        """A processor ends its transaction: commits it (after its acks, if not made yet), or
        aborts it; one that took nothing aborts."""
        self._end(data.draw(st.sampled_from(self.procs)), commit)

    def _end(self, proc: Processor, commit: bool) -> None:
        if commit and proc.unacked():
            if not self._ack(proc, len(proc.unacked())):
                return
        if commit and proc.taken:
            labels = sorted(t.label for t in proc.taken)
            if not self._send_output(proc, labels):
                return
            try:
                self.run_quietly(proc.txn.commit())
            except PulsarError as exc:
                self.run(self._failed(proc, "commit", exc))
                return
            self._committed(proc, labels)
            return
        try:
            self.run_quietly(proc.txn.abort())
        except PulsarError as exc:
            self.log.append(f"{proc.name} abort failed: {exc!r}")
        else:
            self.log.append(f"{proc.name} aborted")
        self.run(self._ended(proc))

    @precondition(lambda self: self.network and self.restarts < MAX_RESTARTS
                  and self._procs(lambda p: p.taken and not p.unacked()))
    @rule(data=st.data(), after_s=st.sampled_from([0, 0.001, 0.003]))
    def broker_restarts_during_commit(self, data, after_s) -> None:
        """A processor that acked all it took commits while the broker restarts (`after_s`
        after the commit was asked). A commit that failed with no answer (in doubt: the
        decision may have been taken) is asked again, as the client allows, until it is
        answered: a durable decision must hold across the restart, and the acks with it."""
        proc = data.draw(st.sampled_from(self._procs(lambda p: p.taken and not p.unacked())))
        labels = sorted(t.label for t in proc.taken)
        if not self._send_output(proc, labels):
            return
        self.log.append(f"{proc.name} commits while the broker restarts ({after_s} s later)")

        failure = self.run(self._commit_across_restart(proc.name, proc.txn, after_s))
        if failure is not None:
            self.run(self._failed(proc, "commit", failure))
            return
        self._committed(proc, labels)

    def _send_output(self, proc: Processor, labels: list[int]) -> bool:
        """The processor's output, if it produces one; False when the send failed (it ended)."""
        if proc.produce:
            try:
                self.run_quietly(self.out_producer.send(
                    b"%s:%s" % (proc.name.encode(), ",".join(map(str, labels)).encode()), txn=proc.txn))
            except PulsarError as exc:
                self.run(self._failed(proc, "send", exc))
                return False
        return True

    def _committed(self, proc: Processor, labels: list[int]) -> None:
        assert not proc.killed, f"{proc.name}: a transaction the coordinator aborted committed"
        self._forget(proc)
        for label in labels:
            self.processed[label].append(proc.name)
        if proc.produce:
            self.outputs[proc.name] = labels
        self.log.append(f"{proc.name} committed {labels}")
        event("a processor committed")

    @precondition(lambda self: self._procs(lambda p: not p.killed and p.taken))
    @rule(data=st.data(), during_ack=st.sampled_from([None, "ack first", "abort first"]))
    def coordinator_aborts(self, data, during_ack) -> None:
        """As on the transaction's timeout: the application is not told. `during_ack`: while
        the processor acks one more message (both under way at once, one asked first)."""
        proc = data.draw(st.sampled_from(self._procs(lambda p: not p.killed and p.taken)))
        proc.killed = True
        abort = self.service.coordinator.end_transaction(proc.txn.txn_id, TxnAction.ABORT)
        if during_ack is None or not proc.unacked():
            self.run(abort)
            self.log.append(f"{proc.name} aborted by the coordinator")
            return
        taken = proc.unacked()[0]
        ack = proc.consumer.acknowledge(taken.message, txn=proc.txn)
        outcomes = self.run(_together(ack=ack, abort=abort, first="ack" if during_ack == "ack first" else "abort"))
        self.log.append(f"{proc.name} aborted by the coordinator while acking m{taken.label} ({during_ack}): "
                        f"{outcomes}")
        for outcome in outcomes.values():
            if isinstance(outcome, BaseException) and not isinstance(outcome, PulsarError):
                raise outcome
        if isinstance(outcomes["abort"], BaseException):
            raise outcomes["abort"]
        if isinstance(outcomes["ack"], BaseException):
            self.run(self._failed(proc, f"ack of m{taken.label}", outcomes["ack"]))
        else:
            taken.acked = True
            self.holders[taken.label].append(proc)

    # --- the end: every transaction ended, the subscription drained, the contract checked ----

    async def _drain_and_check(self) -> None:
        for proc in list(self.procs):
            with contextlib.suppress(PulsarError):
                await proc.txn.abort()
        self.procs.clear()
        self.holders.clear()
        for slot, consumer in enumerate(self.consumers):
            if consumer is not None:
                await consumer.close()
                self.consumers[slot] = None
        consumer = await self._subscribe(0, name="drainer")
        conflicts = 0
        idle = 0
        while True:
            taken = []
            while True:
                try:
                    taken.append(await consumer.receive(timeout=DRAIN_S))
                except TimeoutError:
                    break
            if not taken:
                if self.subscription().backlog() == 0:
                    break
                idle += 1
                assert idle < 5, f"the subscription holds {self.subscription().backlog()} messages it never " \
                                 "delivers\n" + "\n".join(self.log)
                await consumer.redeliver_unacknowledged_messages()
                continue
            self.txn_count += 1
            name = f"t{self.txn_count}@drainer"
            labels = sorted(_label(m) for m in taken)
            txn = await self.client.new_transaction(timeout_ms=TXN_TIMEOUT_MS)
            try:
                for message in taken:
                    await consumer.acknowledge(message, txn=txn)
                await self.out_producer.send(b"%s:%s" % (name.encode(), ",".join(map(str, labels)).encode()), txn=txn)
                await txn.commit()
            except PulsarError as exc:
                self.log.append(f"{name} failed: {exc!r}")
                conflicts += 1
                assert conflicts < 5, f"the drainer's transactions keep failing: {exc!r}\n" + "\n".join(self.log)
                with contextlib.suppress(PulsarError):
                    await txn.abort()
                await consumer.redeliver_unacknowledged_messages()
                continue
            for label in labels:
                self.processed[label].append(name)
            self.outputs[name] = labels
            self.log.append(f"{name} committed {labels}")
        await consumer.close()
        self.check_exactly_once()
        story = "\n".join(self.log)
        # the output topic, read committed: each committed transaction's output, once
        reader = await self.client.subscribe(OUT, "check", consumer_type="exclusive", initial_position="earliest")
        seen: list[bytes] = []
        while True:
            try:
                seen.append((await reader.receive(timeout=DRAIN_S if len(seen) >= len(self.outputs) else 2)).data)
            except TimeoutError:
                break
        await reader.close()
        expected = sorted(b"%s:%s" % (name.encode(), ",".join(map(str, labels)).encode())
                          for name, labels in self.outputs.items())
        assert sorted(seen) == expected, f"outputs {sorted(seen)}, expected {expected}\n{story}"


class NetworkMachine(SharedExactlyOnceMachine):
    network = True


SharedExactlyOnceMachine.TestCase.settings = model_settings(EXAMPLES)
test_shared_exactly_once_model = SharedExactlyOnceMachine.TestCase

NetworkMachine.TestCase.settings = model_settings(max(5, EXAMPLES // 5))
test_shared_exactly_once_model_network = NetworkMachine.TestCase


# --- the bug the model found, as a deterministic regression test ------------------------------

PERMITS = "persistent://public/default/shared-batch-permits"
# A consumer was charged a permit for every message of a batch it was given (the dispatcher
# took `entry.num_messages`), also for the messages already acknowledged (or held by a
# transaction), which the ack set keeps from the application. The embedded consumer gave back
# a permit for each message it handed out only, so each partly acknowledged batch given to it
# again cost it the permits of its acknowledged messages for good: with a small receiver queue
# it soon got nothing more (availablePermits 0, the backlog never delivered; a redeliver-all
# gives back no permits either). The network client gave them back, as the C++ client does.
# The dispatcher now charges only the messages it hands out, as Pulsar's broker does
# (Consumer.sendMessages: `ackedCount - totalMessages`), and neither client gives anything back
# for them (as the Java client).


async def _partly_acked_batch_given_again(client, send, subscribe) -> list[bytes]:
    """A batch m0..m3; a (receiver queue of 2) takes m0 and m1 and commits their acks, then
    closes: the batch goes back with m2 and m3 unacknowledged; b (receiver queue of 2) takes
    them, then m4 is published. What b receives (m4 last, when it gets it)."""
    a = await subscribe("a")
    txn = await client.new_transaction()
    for _ in range(2):
        message = await a.receive(timeout=5)
        assert message.message_id.batch_index >= 0, "not a batch"
        await a.acknowledge(message, txn=txn)
    await txn.commit()
    await a.close()
    b = await subscribe("b")
    got = [(await b.receive(timeout=5)).data for _ in range(2)]
    await send(b"m4")
    with contextlib.suppress(TimeoutError):
        got.append((await b.receive(timeout=1)).data)
    return got


async def test_a_partly_acknowledged_batch_costs_no_permits_of_its_acked_messages(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(PERMITS)
        await publish_batch(broker, producer, [b"m0", b"m1", b"m2", b"m3"])

        async def subscribe(name):
            return await broker.subscribe(PERMITS, SUB, consumer_type="shared", initial_position="earliest",
                                          consumer_name=name, receiver_queue_size=2)
        got = await _partly_acked_batch_given_again(broker, producer.send, subscribe)
        assert got == [b"m2", b"m3", b"m4"], \
            f"{broker.service.topics[PERMITS].subscriptions[SUB].stats()['consumers']}"


async def test_a_partly_acknowledged_batch_costs_no_permits_of_its_acked_messages_network(tmp_path):
    network_broker = NetworkBroker(tmp_path / "data", num_coordinators=1)
    await network_broker.start()
    try:
        async with Client(network_broker.url, operation_timeout_seconds=10) as client:
            batcher = await client.create_producer(PERMITS, batching_enabled=True, batching_max_publish_delay_ms=50)
            await asyncio.gather(*(batcher.send(b"m%d" % i) for i in range(4)))
            producer = await client.create_producer(PERMITS)

            async def subscribe(name):
                return await client.subscribe(PERMITS, SUB, consumer_type="shared", initial_position="earliest",
                                              consumer_name=name, receiver_queue_size=2)
            assert await _partly_acked_batch_given_again(client, producer.send, subscribe) == [b"m2", b"m3", b"m4"]
    finally:
        await network_broker.stop()
