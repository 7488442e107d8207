"""A randomized transactional workload written through the embedded broker, and what the
broker's own READ_COMMITTED consumers deliver from it: the oracle of the Spark tests.

Every message's payload is its label (`b"<label>"`), so rows can be traced back to the step
that wrote them. The workload mixes plain and transactional messages, single messages and
batches, keys, properties and event times, commits, aborts, timeouts (the coordinators'
clock moves and they abort what expired; at least one such transaction in each design, with
a visible message behind it: `Workload.timed_out`), transactions spanning topics, ledger
roll-overs (small ledgers: several partitions per topic) and transactions still open at the
end.

Both designs at once: v4 (PIP-31) transactions on `persistent://` topics (markers in the
stream) and v5 (PIP-473) transactions of the metadata-driven coordinator on two `segment://`
topics of one scalable topic (state in the data dir's LMDB metadata store, no markers).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path

from core_ext.batch import build_batch
from pyengine.broker import Broker
from pyengine.client.message import MessageId
from pyengine.protocol.commands import message_metadata
from pyengine.protocol.pulsar_api_pb2 import KeyValue, SingleMessageMetadata
from pyengine.storage.entry import headers_and_payload
from pyengine.errors import TransactionConflictError
from pyengine.storage.managed_ledger import ManagedLedgerConfig
from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID

TOPICS = ("persistent://public/default/orders", "persistent://public/default/payments",
          "persistent://acme/sales/refunds")
SCALABLE = "topic://public/default/events"
SEGMENTS = ("segment://public/default/events/0000-7fff-1", "segment://public/default/events/8000-ffff-2")
ALL_TOPICS = TOPICS + SEGMENTS


@dataclass
class Workload:
    data_dir: Path
    labels: dict[int, tuple[str, tuple[int, int] | None]] = field(default_factory=dict)  # label -> topic, txn
    outcome: dict[tuple[int, int], str] = field(default_factory=dict)        # txn -> committed/aborted/open
    txn_topics: dict[tuple[int, int], set[str]] = field(default_factory=dict)
    delivered: list[dict] = field(default_factory=list)    # the READ_COMMITTED consumers' messages
    late: set[int] = field(default_factory=set)            # v5 late writes: refused, never visible
    timed_out: set[tuple[int, int]] = field(default_factory=set)   # txns aborted by their coordinator's timeout
    # The running broker's transaction buffers at the end: topic -> (max read position, aborted set)
    buffers: dict[str, tuple] = field(default_factory=dict)

    @property
    def markers(self) -> int:
        """Commit/abort markers stored: one per ended transaction per topic it wrote to."""
        return sum(len(self.txn_topics[txn]) for txn, state in self.outcome.items()
                   if state != "open" and txn[0] != V5_COORDINATOR_ID)      # v5: none


def consumer_row(topic: str, message) -> dict:
    """A delivered message in the data source's terms (times in ms)."""
    return {"topic": topic, "ledger_id": message.message_id.ledger_id, "entry_id": message.message_id.entry_id,
            "batch_index": message.message_id.batch_index, "publish_time": message.publish_time,
            "event_time": message.event_time or None, "key": message.partition_key, "value": message.data,
            "properties": dict(message.properties), "producer_name": message.producer_name,
            "sequence_id": message.sequence_id}


async def write_workload(data_dir: Path, seed: int, steps: int = 400) -> Workload:
    rng = random.Random(seed)
    workload = Workload(data_dir)
    now = [1_700_000_000_000]
    config = dict(sync=False, clock=lambda: now[0], ledger=ManagedLedgerConfig(max_entries_per_ledger=64))
    label = 0
    async with Broker.embedded(data_dir, **config) as broker:
        await broker.service.policies.create_tenant("acme")
        await broker.service.policies.create_namespace("acme/sales")
        producers = {topic: await broker.create_producer(topic, producer_name=f"p-{i}")
                     for i, topic in enumerate(ALL_TOPICS)}
        coordinator = broker.service.coordinator
        open_txns: list = []

        def message_fields(i: int) -> dict:
            fields: dict = {}
            if rng.random() < 0.6:
                fields["key"] = f"k{rng.randrange(7)}"
            if rng.random() < 0.3:
                fields["properties"] = {"n": str(i), "kind": rng.choice(["a", "b", "é"])}
            if rng.random() < 0.3:
                fields["event_time"] = now[0] - rng.randrange(1, 10_000)
            return fields

        async def send_batch(producer, labels: list[int], txn) -> None:
            # What a batching producer sends: one entry of N [size][SingleMessageMetadata][payload].
            singles = []
            for i in labels:
                fields = message_fields(i)
                single = SingleMessageMetadata(payload_size=len(str(i)))
                if "key" in fields:
                    single.partition_key = fields["key"]
                for k, v in fields.get("properties", {}).items():
                    single.properties.append(KeyValue(key=k, value=v))
                if "event_time" in fields:
                    single.event_time = fields["event_time"]
                singles.append((single.SerializeToString(), str(i).encode()))
            sequence = producer._next_sequence
            producer._next_sequence += len(labels)
            extra = {"num_messages_in_batch": len(labels)}
            if txn is not None:
                txn._check_open()
                extra.update(txnid_most_bits=txn.txn_id.most_bits, txnid_least_bits=txn.txn_id.least_bits)
            metadata = message_metadata(producer.producer_name, sequence, now[0], **extra).SerializeToString()
            registration = txn._register_partition(producer.topic) if txn is not None else None
            stored = producer._topic.publish(producer._producer, headers_and_payload(metadata, build_batch(singles)),
                                             sequence_id=sequence, num_messages=len(labels), publish_time=now[0],
                                             highest_sequence_id=sequence + len(labels) - 1,
                                             txn=txn.txn_id if txn is not None else None)
            if txn is not None:
                txn._track(stored)
            await stored
            if registration is not None:
                await registration

        def txn_key(txn) -> tuple[int, int]:
            return (txn.txn_id.most_bits, txn.txn_id.least_bits)

        async def begin(timeout_ms: int, version: int):
            txn = await broker.new_transaction(timeout_ms=timeout_ms, version=version)
            open_txns.append(txn)
            workload.outcome[txn_key(txn)] = "open"
            workload.txn_topics[txn_key(txn)] = set()
            return txn

        async def end(txn, commit: bool) -> None:
            """The client ends `txn`."""
            open_txns.remove(txn)
            await (txn.commit() if commit else txn.abort())
            workload.outcome[txn_key(txn)] = "committed" if commit else "aborted"

        async def write(topic: str, txn, count: int) -> None:
            nonlocal label
            labels = list(range(label, label + count))
            label += count
            now[0] += rng.randrange(0, 3)
            if count == 1 and rng.random() < 0.7:
                await producers[topic].send(str(labels[0]).encode(), txn=txn, **message_fields(labels[0]))
            else:
                await send_batch(producers[topic], labels, txn)
            for i in labels:
                workload.labels[i] = (topic, txn_key(txn) if txn is not None else None)
            if txn is not None:
                workload.txn_topics[txn_key(txn)].add(topic)

        async def pass_time(ms: int) -> None:
            """`ms` pass: the coordinators abort the open transactions whose timeout passed
            (their clients never end them: they are out of `open_txns` from then on)."""
            now[0] += ms
            await coordinator.wait_for_endings()
            coordinator.poll_timeouts()
            await coordinator.wait_for_endings()
            await coordinator.v5.sweep_timeouts()
            for txn in list(open_txns):
                if txn.txn_id.most_bits == V5_COORDINATOR_ID:
                    # A v5 header says aborted, not why: only the sweep ends a txn of open_txns.
                    ended = (await coordinator.v5.get(txn.txn_id)).status.outcome is TxnAction.ABORT
                else:
                    ended = coordinator.get(txn.txn_id).status is TxnStatus.TIME_OUT
                if ended:
                    open_txns.remove(txn)
                    workload.outcome[txn_key(txn)] = "aborted"
                    workload.timed_out.add(txn_key(txn))

        for _ in range(steps):
            roll = rng.random()
            if roll < 0.12 and len(open_txns) < 4:
                await begin(rng.choice([60_000, 60_000, 1_000]), rng.choice([4, 5]))
            elif roll < 0.22 and open_txns:
                await end(open_txns[rng.randrange(len(open_txns))], rng.random() < 0.7)
            elif roll < 0.25 and open_txns:
                await pass_time(2_000)        # the 1 s transactions time out
            else:
                txn = rng.choice(open_txns) if open_txns and rng.random() < 0.5 else None
                # v5 transactions write to segment:// topics only, v4 ones to persistent:// only.
                v5 = txn.txn_id.most_bits == V5_COORDINATOR_ID if txn is not None else rng.random() < 0.4
                await write(rng.choice(SEGMENTS if v5 else TOPICS), txn, rng.choice([1, 1, 1, 2, 5, 11]))
        # Whatever the dice did, in each design: a transaction its client never ends, aborted by
        # its coordinator when its timeout passes, on a topic no open transaction holds back (its
        # messages are below the read horizon: only the abort hides them), with a plain message
        # behind it that READ_COMMITTED readers receive.
        expiring = {}
        for version, topics in ((4, TOPICS), (5, SEGMENTS)):
            held = {topic for txn in open_txns for topic in workload.txn_topics[txn_key(txn)]}
            topic = next((topic for topic in topics if topic not in held), topics[-1])
            for txn in [txn for txn in open_txns if topic in workload.txn_topics[txn_key(txn)]]:
                await end(txn, commit=True)
            expiring[topic] = txn = await begin(1_000, version)
            await write(topic, txn, 1)
            await write(topic, txn, 5)
        await pass_time(2_000)
        for topic, txn in expiring.items():
            assert txn_key(txn) in workload.timed_out and txn.state == "open", "the timeout did not end it"
            await write(topic, None, 1)
        v5_timed_out = sum(1 for txn in workload.timed_out if txn[0] == V5_COORDINATOR_ID)
        assert coordinator.v5.stats()["timed_out_total"] == v5_timed_out
        # A v5 late write: a send that loses the race with its transaction's commit is refused
        # (TransactionConflictError) and its entry, stored anyway, is never visible.
        txn = await broker.new_transaction(version=5)
        workload.outcome[txn_key(txn)] = "committed"
        workload.txn_topics[txn_key(txn)] = {SEGMENTS[1]}
        for i in (label, label + 1):
            workload.labels[i] = (SEGMENTS[1], txn_key(txn))
        await producers[SEGMENTS[1]].send(str(label).encode(), txn=txn)
        decided = asyncio.ensure_future(coordinator.end_transaction(txn.txn_id, TxnAction.COMMIT))
        try:
            await producers[SEGMENTS[1]].send(str(label + 1).encode(), txn=txn)
        except TransactionConflictError:
            workload.late.add(label + 1)
        await decided
        assert workload.late, "the late write was not late"
        label += 2
        # Left open, in each design: what a READ_COMMITTED reader must not see, nor anything
        # after it (a plain message behind it waits too).
        for version, topic in ((4, TOPICS[0]), (5, SEGMENTS[0])):
            txn = await broker.new_transaction(timeout_ms=3_600_000, version=version)
            workload.outcome[txn_key(txn)] = "open"
            workload.txn_topics[txn_key(txn)] = {topic}
            for i, pending in ((label, txn), (label + 1, None)):
                await producers[topic].send(str(i).encode(), txn=pending)
                workload.labels[i] = (topic, txn_key(pending) if pending is not None else None)
            label += 2
        await settle_v5(broker, workload)

        for topic in ALL_TOPICS:
            buffer = broker.service.topics[topic].buffer
            workload.buffers[topic] = (buffer.max_read_position(), buffer.aborted.items(), buffer.ongoing_txns())
        workload.delivered = await consume_all(broker, ALL_TOPICS)
    return workload


async def consume_all(broker, topics, row=consumer_row, quiet: float = 0.5) -> list:
    """`row(topic, message)` of every message READ_COMMITTED readers of `topics` receive from
    the start, until `quiet` seconds pass without one (all topics at once: one quiet wait)."""
    async def consume(topic: str) -> list:
        reader = await broker.create_reader(topic, MessageId.earliest, receiver_queue_size=100_000)
        rows = []
        while True:
            try:
                message = await reader.receive(timeout=quiet)
            except TimeoutError:
                break
            rows.append(row(topic, message))
        await reader.close()
        return rows

    return [row for rows in await asyncio.gather(*map(consume, topics)) for row in rows]


async def settle_v5(broker, workload: Workload) -> None:
    """v5 decisions reach the segments by a metadata-store watch: wait until each segment's
    buffer holds exactly the open transactions that wrote to it (every decision applied)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    for topic in SEGMENTS:
        buffer = broker.service.topics[topic].buffer
        want = {txn for txn, state in workload.outcome.items() if state == "open" and topic in workload.txn_topics[txn]}
        while {(t.most_bits, t.least_bits) for t, _ in buffer.ongoing_txns()} != want:
            assert loop.time() < deadline, f"the v5 decisions did not reach {topic} in 10 s"
            await asyncio.sleep(0.005)
        await buffer.wait_materialised()


def read_directly(data_dir: Path, **options: str):
    """What `spark.read.format("pyengine")` with `options` returns, as one Arrow table, read
    by the data source's own reader (planning and `read()` of every partition: what Spark
    runs) without a Spark query: for tests of what the options select."""
    import pyarrow as pa

    from spark_udfs.options import parse_options
    from spark_udfs.schema import ARROW_SCHEMA
    from spark_udfs.source import PyengineReader

    reader = PyengineReader(parse_options({"path": str(data_dir), **options}))
    batches = [batch for partition in reader.partitions() for batch in reader.read(partition)]
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)
