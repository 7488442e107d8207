"""v4 and v5 side by side in ONE broker, given the same random operations: a persistent://
topic with v4 transactions and a segment:// topic with v5 transactions must give the same
READ_COMMITTED answers after every step — which messages a reader may see, which are
acknowledged, which are reserved by an open transaction's ack, and which operations fail."""

from __future__ import annotations

import asyncio
import shutil
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from pyengine.broker import Broker
from pyengine_kernels import Position

V4_TOPIC = "persistent://public/default/diff"
V5_TOPIC = "segment://public/default/diff/0000-ffff-0"
SUB = "s"

OPS = st.lists(st.one_of(
    st.tuples(st.just("send")),
    st.tuples(st.just("begin")),
    st.tuples(st.just("txn_send"), st.integers(0, 3)),
    st.tuples(st.just("ack"), st.integers(0, 40)),
    st.tuples(st.just("txn_ack"), st.integers(0, 3), st.integers(0, 40)),
    st.tuples(st.just("cumulative"), st.integers(0, 3), st.integers(0, 40)),
    st.tuples(st.just("end"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("restart")),
), max_size=40)


class Side:
    def __init__(self, broker, topic: str, version: int) -> None:
        self.broker = broker
        self.topic_name = topic
        self.version = version
        self.ids: list = []              # label -> MessageId
        self.txns: list = []             # txn label -> handle
        self.open: list[int] = []

    async def start(self, broker=None) -> None:
        """Attach to `broker` (again, after a restart: open txns are rebound to it)."""
        if broker is not None:
            self.broker = broker
            for i, handle in enumerate(self.txns):
                self.txns[i] = handle._rebound(broker.service)
        self.producer = await self.broker.create_producer(self.topic_name)
        self.consumer = await self.broker.subscribe(self.topic_name, SUB, consumer_type="failover",
                                                    initial_position="earliest")
        self.topic = self.broker.service.topics[self.topic_name]
        self.sub = self.topic.subscriptions[SUB]

    async def apply(self, op: tuple) -> str:
        """Run one operation; its outcome as text (the error class, if any)."""
        try:
            await self._apply(op)
        except Exception as exc:      # compared between the sides, so any error must match
            return type(exc).__name__
        return "ok"

    async def _apply(self, op: tuple) -> None:
        kind = op[0]
        if kind == "send":
            self.ids.append(await self.producer.send(b"%d" % len(self.ids)))
        elif kind == "begin":
            self.txns.append(await self.broker.new_transaction(version=self.version))
            self.open.append(len(self.txns) - 1)
        elif not self.open and kind in ("txn_send", "txn_ack", "cumulative", "end"):
            return
        elif kind == "txn_send":
            txn = self.txns[self.open[op[1] % len(self.open)]]
            self.ids.append(await self.producer.send(b"%d" % len(self.ids), txn=txn))
        elif not self.ids and kind in ("ack", "txn_ack", "cumulative"):
            return
        elif kind == "ack":
            await self.consumer.acknowledge(self.ids[op[1] % len(self.ids)])
        elif kind == "txn_ack":
            txn = self.txns[self.open[op[1] % len(self.open)]]
            await self.consumer.acknowledge(self.ids[op[2] % len(self.ids)], txn=txn)
        elif kind == "cumulative":
            txn = self.txns[self.open[op[1] % len(self.open)]]
            await self.consumer.acknowledge_cumulative(self.ids[op[2] % len(self.ids)], txn=txn)
        elif kind == "end":
            label = self.open.pop(op[1] % len(self.open))
            await (self.txns[label].commit() if op[2] else self.txns[label].abort())

    async def settle(self) -> None:
        if self.version == 5:
            v5 = self.broker.service.v5
            while (any(h.txn_id in v5.headers._listeners for i, h in enumerate(self.txns) if i not in self.open)
                   or self.topic.buffer._materialising or self.sub.pending_ack._deciding):
                await asyncio.sleep(0.001)

    def view(self) -> list[tuple[bool, bool, bool]]:
        """Per message: (a reader may see it, acknowledged, reserved by an open txn)."""
        horizon = self.topic.buffer.max_read_position()
        visible = {e.position for e in self.topic.ledger.read_entries(Position.EARLIEST, 10**6, horizon)
                   if not e.is_marker and not (e.txn_most >= 0 and self.topic.buffer.hides(e))}
        out = []
        for message_id in self.ids:
            position = message_id.position
            pending = position <= horizon and self.sub.pending_ack.is_fully_pending(position)
            out.append((position in visible, self.sub.cursor.is_acked(position),
                        pending and not self.sub.cursor.is_acked(position)))
        return out


@settings(max_examples=25, deadline=None)
@given(ops=OPS)
def test_v5_answers_like_v4(ops):
    directory = tempfile.mkdtemp(prefix="pyengine-diff-")

    async def run() -> None:
        stack = Broker.embedded(directory, sync=False)
        broker = await stack.__aenter__()
        try:
            v4, v5 = Side(broker, V4_TOPIC, 4), Side(broker, V5_TOPIC, 5)
            await v4.start()
            await v5.start()
            assert type(v5.topic.buffer).__name__ == "MetadataTransactionBuffer"
            assert type(v4.topic.buffer).__name__ == "TopicTransactionBuffer"
            for step, op in enumerate(ops):
                if op[0] == "restart":          # a clean restart: both designs recover their state
                    await stack.__aexit__(None, None, None)
                    stack = Broker.embedded(directory, sync=False)
                    broker = await stack.__aenter__()
                    await v4.start(broker)
                    await v5.start(broker)
                    outcomes = ("ok", "ok")
                else:
                    outcomes = (await v4.apply(op), await v5.apply(op))
                await v5.settle()
                assert outcomes[0] == outcomes[1], (step, op, outcomes)
                assert v4.view() == v5.view(), (step, op, v4.view(), v5.view())
        finally:
            await stack.__aexit__(None, None, None)

    try:
        asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
