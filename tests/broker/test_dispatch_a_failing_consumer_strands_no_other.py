"""A dispatch pass hands each consumer its entries through its sink. A sink that raises (the
embedded consumer cannot decode a malformed batch a network producer stored, as the broker
does not check payloads, like Pulsar's) must only affect that consumer: the entries the same
pass gave the other consumers (already pending at them, their permits taken, the cursor moved
past them) must still reach them, and the markers and aborted entries the pass passed over
must still be acknowledged. Found by review: the first sink that raised ended the pass's
sending, so the other consumers' messages stayed pending at them, never sent, until they
disconnected, and the passed-over entries were never acknowledged (a backlog that never
drained)."""

from __future__ import annotations

from pyengine.broker import Broker
from pyengine.broker.consumer import Consumer, Delivery
from tests.broker.test_key_shared_look_ahead import settle

T = "persistent://public/default/dispatch-failing-sink"


class Sink:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.got: list[Delivery] = []

    def deliver(self, deliveries: list[Delivery]) -> None:
        if self.fail:
            raise ValueError("cannot decode the entry")
        self.got.extend(deliveries)

    def active_changed(self, active: bool) -> None:
        pass

    def reset(self) -> None:
        pass

    def closed_by_broker(self) -> None:
        pass


async def test_a_raising_sink_leaves_the_other_consumers_and_the_auto_acks_of_the_pass_alone(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"m0")
        txn = await broker.new_transaction()
        await producer.send(b"aborted", txn=txn)
        await txn.abort()
        for i in range(1, 4):
            await producer.send(b"m%d" % i)
        topic = broker.service.topics[T]
        failing, healthy = Sink(fail=True), Sink()
        a, b = Consumer(failing, name="a"), Consumer(healthy, name="b")
        sub = await topic.subscribe("s", a, sub_type="shared", initial_position="earliest")
        await topic.subscribe("s", b, sub_type="shared")
        passed_over = [p for p in (e.position for e in topic.ledger.read_entries(topic.ledger.first_position(), 100,
                                                                                  topic.ledger.lac))
                       if topic.ledger.read_entry(p).txn_most >= 0 or topic.ledger.read_entry(p).is_marker]
        assert len(passed_over) == 2                    # the aborted message and its abort marker
        sub.flow(a, 10)                                 # both in one pass: round robin, a first
        sub.flow(b, 10)
        await settle(sub.dispatcher)
        assert list(b.pending) and [d.entry.position for d in healthy.got] == list(b.pending)
        assert all(sub.cursor.is_acked(p) for p in passed_over)
        # The pass gave every message out; a keeps its own pending (they go to b when it leaves).
        assert len(a.pending) + len(b.pending) == 4
        sub.remove_consumer(a)
        sub.flow(b, 10)
        await settle(sub.dispatcher)
        assert sorted(d.entry.data[-2:] for d in healthy.got) == [b"m0", b"m1", b"m2", b"m3"]
