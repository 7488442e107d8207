"""Key_Shared per-key order against a reference model, while consumers join, leave, receive,
acknowledge and negatively acknowledge at random (hypothesis stateful).

What must hold (PIP-379's contract):
* a key's messages are delivered and unacknowledged at one consumer at a time (checked on the
  broker: its consumers' pending entries);
* a consumer receives a message of a key only once every earlier message of that key is
  acknowledged or held by that same consumer (per-key order; a key whose message was
  negatively acknowledged is left out from then on, as Pulsar gives no order after a nack);
* every message is delivered once the consumers acknowledge what they get.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pyengine.broker import Broker
from pyengine_kernels import Position

T = "persistent://public/default/key-shared-model"
KEYS = [f"k{i}" for i in range(6)]
MAX_CONSUMERS = 4


class KeySharedModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = tempfile.mkdtemp(prefix="pyengine-key-shared-")
        self.stack = Broker.embedded(self.dir, sync=False)
        self.broker = self.run(self.stack.__aenter__())
        self.producer = self.run(self.broker.create_producer(T))
        self.consumers: dict[str, object] = {}           # name -> embedded consumer
        self.held: dict[str, list[tuple[int, object]]] = {}   # name -> (label, message) received, unacked
        self.keys: list[str] = []                        # label -> key
        self.labels: dict[Position, int] = {}            # position -> label
        self.acked: set[int] = set()
        self.nacked_keys: set[str] = set()
        self.joined = 0

    def run(self, coro):
        return self.loop.run_until_complete(asyncio.wait_for(coro, 20))

    def teardown(self) -> None:
        self.run(self.stack.__aexit__(None, None, None))
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    async def _settle(self) -> None:
        """Let the dispatch passes asked for run (no wall time involved)."""
        topic = self.broker.service.topics.get(T)
        subscription = topic.subscriptions.get("s") if topic is not None else None
        for _ in range(1000):
            await asyncio.sleep(0)
            if subscription is None or not subscription.dispatcher._scheduled:
                return
        raise AssertionError("the dispatcher never settled")

    def step(self, coro=None) -> None:
        async def go():
            if coro is not None:
                await coro
            await self._settle()
        self.run(go())

    # --- rules ------------------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS))
    def publish(self, key: str) -> None:
        label = len(self.keys)
        self.keys.append(key)
        message_id = self.run(self.producer.send(b"%d" % label, key=key))
        self.labels[Position(message_id.ledger_id, message_id.entry_id)] = label
        self.step()

    @precondition(lambda self: len(self.consumers) < MAX_CONSUMERS)
    @rule(queue=st.integers(1, 4))
    def join(self, queue: int) -> None:
        name = f"c{self.joined}"
        self.joined += 1
        self.consumers[name] = self.run(self.broker.subscribe(
            T, "s", consumer_type="key_shared", initial_position="earliest", consumer_name=name,
            receiver_queue_size=queue, negative_ack_redelivery_delay_ms=0))
        self.held[name] = []
        self.step()

    @precondition(lambda self: self.consumers)
    @rule(data=st.data())
    def leave(self, data) -> None:
        name = data.draw(st.sampled_from(sorted(self.consumers)))
        self.step(self.consumers.pop(name).close())
        del self.held[name]                              # given back: delivered again

    @precondition(lambda self: self.consumers)
    @rule(data=st.data())
    def receive(self, data) -> None:
        name = data.draw(st.sampled_from(sorted(self.consumers)))
        self._receive(name)
        self.step()

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data(), negative=st.booleans())
    def acknowledge(self, data, negative: bool) -> None:
        name = data.draw(st.sampled_from(sorted(n for n, held in self.held.items() if held)))
        label, message = self.held[name].pop(data.draw(st.integers(0, len(self.held[name]) - 1)))
        if negative:
            self.nacked_keys.add(self.keys[label])
            self.step(self.consumers[name].negative_acknowledge(message))
        else:
            self.acked.add(label)
            self.step(self.consumers[name].acknowledge(message))

    @rule()
    def everything_is_delivered_once_the_consumers_acknowledge(self) -> None:
        if not self.consumers:
            self.join(queue=2)
        for name, held in self.held.items():
            for label, message in held:
                self.acked.add(label)
                self.step(self.consumers[name].acknowledge(message))
            held.clear()
        progress = True
        while progress:
            progress = False
            for name in sorted(self.consumers):
                while (label := self._receive(name)) is not None:
                    self.acked.add(label)
                    self.step(self.consumers[name].acknowledge(self.held[name].pop()[1]))
                    progress = True
        assert self.acked == set(range(len(self.keys)))

    def _receive(self, name: str) -> int | None:
        """Take the next message queued at `name`, if any, checking per-key order."""
        async def take():
            return self.consumers[name]._take_if_any()   # may give permits back: in the loop
        message = self.run(take())
        if message is None:
            return None
        label = int(message.data)
        key = self.keys[label]
        if key not in self.nacked_keys:
            own = {held_label for held_label, _ in self.held[name]}
            earlier = [other for other in range(label) if self.keys[other] == key]
            assert all(other in self.acked or other in own for other in earlier), (
                f"{name} got message {label} of {key} before earlier ones")
        self.held[name].append((label, message))
        return label

    # --- invariants -------------------------------------------------------------------------

    @invariant()
    def a_key_is_unacknowledged_at_one_consumer_at_a_time(self) -> None:
        topic = self.broker.service.topics.get(T)
        if topic is None or "s" not in topic.subscriptions:
            return
        holders: dict[str, str] = {}
        for consumer in topic.subscriptions["s"].consumers:
            for position in consumer.pending:
                key = self.keys[self.labels[position]]
                assert holders.setdefault(key, consumer.name) == consumer.name, (
                    f"{key} unacknowledged at {holders[key]} and {consumer.name}")


KeySharedModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_key_shared_draining_model = KeySharedModel.TestCase
