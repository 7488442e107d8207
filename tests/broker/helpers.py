"""Helpers shared by the broker tests."""

import asyncio
import shutil
import tempfile
import threading

from hypothesis.stateful import RuleBasedStateMachine, rule

from pyengine.broker import Broker
from pyengine.broker.embedded import EmbeddedTransaction
from pyengine.transaction import TxnStatus
from tests.waiting import eventually


class GatedWriter:
    """Holds each group commit of `env` until the test lets it through (or fails it)."""

    def __init__(self, env) -> None:
        self.env = env
        self.original = env._write_batch
        self.arrived = threading.Semaphore(0)
        self.allowed = threading.Semaphore(0)
        self.failures: list[BaseException] = []
        env._write_batch = self._write

    def _write(self, writes):
        self.arrived.release()
        if not self.allowed.acquire(timeout=10):
            raise RuntimeError("the test never let this group commit through")
        if self.failures:
            raise self.failures.pop(0)
        return self.original(writes)

    async def next_commit(self) -> None:
        """Wait until a group commit is being held."""
        assert await asyncio.to_thread(self.arrived.acquire, True, 10), "no group commit came"

    def let_through(self, failure: BaseException | None = None) -> None:
        """Let one group commit go on, or fail with `failure` (as an I/O error would)."""
        if failure is not None:
            self.failures.append(failure)
        self.allowed.release()

    def open(self) -> None:
        self.env._write_batch = self.original
        for _ in range(100):
            self.allowed.release()


async def drain(consumer, timeout=0.2):
    """Everything the consumer can receive now (stops after `timeout` s of silence)."""
    out = []
    while True:
        try:
            out.append(await consumer.receive(timeout=timeout))
        except TimeoutError:
            return out


async def publish_batch(broker, producer, payloads: list[bytes], txn=None):
    """One batch entry of `payloads` (the embedded producer sends single messages only)."""
    from core_ext.batch import build_batch
    from pyengine.protocol.commands import message_metadata
    from pyengine.protocol.pulsar_api_pb2 import SingleMessageMetadata
    from pyengine.storage.entry import headers_and_payload

    topic = broker.service.topics[producer.topic]
    sequence = producer._next_sequence
    producer._next_sequence += len(payloads)
    singles = [(SingleMessageMetadata(payload_size=len(p), sequence_id=sequence + i).SerializeToString(), p)
               for i, p in enumerate(payloads)]
    fields = {"num_messages_in_batch": len(payloads)}
    if txn is not None:
        fields.update(txnid_most_bits=txn.txn_id.most_bits, txnid_least_bits=txn.txn_id.least_bits)
        await txn._register_partition(producer.topic)
    metadata = message_metadata(producer.producer_name, sequence, 1, **fields).SerializeToString()
    return await topic.publish(producer._producer, headers_and_payload(metadata, build_batch(singles)),
                               sequence_id=sequence, num_messages=len(payloads),
                               txn=txn.txn_id if txn is not None else None)


class EmbeddedBrokerMachine(RuleBasedStateMachine):
    """What the stateful model tests share: an embedded broker on a data dir of its own, one
    producer and one consumer of `topic` (`consumer_type`), opened and closed again across
    restarts, an event loop stepped by `run`, the coordinators' clock at `now_ms`. Subclasses
    set `self.model` and write the rules."""

    topic: str
    subscription = "s"
    consumer_type = "shared"
    step_timeout_s = 20

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = tempfile.mkdtemp(prefix="pyengine-model-")
        self.ids: dict[int, object] = {}          # message label -> MessageId
        self.handles: dict[int, EmbeddedTransaction] = {}
        self.next_label = 0
        self.stack = None
        self.now_ms = 1_000_000_000_000      # the coordinators' clock, moved by the rules

    def run(self, coro):
        # A step that does not finish is a bug (a hang), not something to wait for.
        return self.loop.run_until_complete(asyncio.wait_for(coro, self.step_timeout_s))

    async def _open(self) -> None:
        self.stack = Broker.embedded(self.dir, sync=False, clock=lambda: self.now_ms)
        self.broker = await self.stack.__aenter__()
        self.producer = await self.broker.create_producer(self.topic)
        self.consumer = await self.broker.subscribe(self.topic, self.subscription, consumer_type=self.consumer_type,
                                                    initial_position="earliest", receiver_queue_size=100_000)

    async def _close(self) -> None:
        await self.stack.__aexit__(None, None, None)

    def teardown(self) -> None:
        try:
            if self.stack is not None:
                self.run(self._close())
        finally:                # a close that failed (the bug a run found) leaves no data dir behind
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def open_txns(self) -> list[int]:
        return [t for t, state in self.model.txns.items() if state == "open"]

    @rule()
    def restart(self) -> None:
        self.run(self._close())
        self.run(self._open())
        # The coordinator keeps open transactions across the restart: rebind their handles.
        for label, handle in self.handles.items():
            self.handles[label] = handle._rebound(self.broker.service)


def pulsar_failover_pick(topic: str, names: list[str]) -> str:
    """The consumer Pulsar (>= 3.0) makes active on a non-partitioned Failover topic, all of one
    priority: on a ring of `name + j` (j < 100) hashed with Murmur3_32Hash (non-negative), the
    first point at or after the topic name's hash (pickAndScheduleActiveConsumer). Written
    here apart from the dispatcher's, as the tests' oracle."""
    import bisect

    import mmh3

    def murmur(text: str) -> int:
        return mmh3.hash(text.encode(), signed=True) & 0x7FFFFFFF

    ordered = sorted(names, key=lambda name: name.encode("utf-16-be"))     # Java's String.compareTo
    ring = {}
    for index, name in enumerate(ordered):
        for replica in range(100):
            ring[murmur(f"{name}{replica}")] = index
    points = sorted(ring)
    at = bisect.bisect_left(points, murmur(topic))
    return ordered[ring[points[at % len(points)]]]


def failover_names(topic: str) -> tuple[str, str]:
    """Two consumer names of which Pulsar makes the first the active one on `topic`."""
    for second in "bcdefghijk":
        if pulsar_failover_pick(topic, ["a", second]) == "a":
            return "a", second
    raise AssertionError(f"no pair of names for {topic}")


# A txn timeout long enough for the durable writes a test does inside it on a slow CI disk
# (200 ms once ran out before the txn's first send was stored), short enough for a test.
SHORT_TXN_TIMEOUT_MS = 1500


async def timed_out(txn: EmbeddedTransaction) -> None:
    """Wait until the client has seen `txn` time out and its coordinator has aborted it, with
    every participant told."""
    await eventually(lambda: txn.state == "timed_out"
                     and txn.service.coordinator.get(txn.txn_id).status == TxnStatus.TIME_OUT)


async def subscribing_from_earliest(broker, topic: str, subscription: str = "s") -> asyncio.Future:
    """An embedded subscribe to `topic`, returned once its subscription is being created (its
    cursor not yet written): what the caller does next meets a subscription under way."""
    loaded = broker.service.topics[topic]
    subscribing = asyncio.ensure_future(broker.subscribe(topic, subscription, initial_position="earliest"))
    for _ in range(10):
        if loaded.subscriptions_changing():
            return subscribing
        await asyncio.sleep(0)
    raise AssertionError(f"no subscription of {topic} was being created")
