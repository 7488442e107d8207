"""Exactly-once processing under a soak's nemesis: consume-transform-produce in transactions.

A feeder sends unique values to a source topic (plain sends in bursts, batched, de-duplicated
by the broker).
Processors consume the source on one Shared subscription and, in a transaction, acknowledge
each message they take and send `value|txn` to a sink topic; then they commit (most) or abort.
An abort gives the acknowledged messages back (Pulsar redelivers them), a commit makes the
outputs visible and the acknowledgements final, all or nothing. At the end, once every
transaction has ended and the processors have emptied the source, the sink is read
(READ_COMMITTED, from the earliest message) and checked:

- `duplicate_output`: a value output twice (processed by two transactions that both committed,
  or one stored twice): exactly-once broken;
- `aborted_output`: an output of a transaction that aborted (or whose commit failed) is visible;
- `lost_input`: a value the source acknowledged never reached the sink (its message was
  acknowledged by a committed transaction whose output is missing, or never processed: stuck
  unacknowledged, or its acknowledgement kept by an aborted transaction);
- `lost_output`: an output of a committed transaction is missing;
- `phantom_output`: an output of a value never fed, or of a transaction never seen.

Pulsar's exactly-once contract (PIP-31) is exactly these four. The soak's nemesis (broker kills,
delayed END_TXN frames, splits and merges on scalable topics) runs meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from typing import Any, Awaitable, Callable

from benchmarks.history import Result
from pyengine.client import Client, MessageId
from pyengine.client import transaction as txn_states
from pyengine.errors import InvalidTxnStatusError

TRANSFER_CLASSES = ("duplicate_output", "aborted_output", "lost_input", "lost_output", "phantom_output")
PROCESSORS = 2
TXN_TIMEOUT_MS = 4000
QUIET_S = 4.0                  # the processors' drain ends after this long without a message
SUBSCRIPTION = "transfer"


def transfer_result() -> Result:
    """The history checker's `Result`, with the exactly-once check's classes."""
    return Result(anomalies={c: [] for c in TRANSFER_CLASSES})


COMMITTED, ABORTED, UNKNOWN = "committed", "aborted", "unknown"


def check_transfer(fed: dict[str, bool], txns: dict[str, tuple[list[str], str]],
                   outputs: list[str]) -> Result:
    """`fed`: value -> True when its send was acknowledged (False: unknown outcome); `txns`:
    txn -> (values it output, outcome); `outputs`: the sink's messages as read (`value|txn`)."""
    result = transfer_result()
    add = lambda kind, **details: result.anomalies[kind].append(details)   # noqa: E731
    seen: Counter[str] = Counter()
    by_txn: dict[str, set[str]] = {}
    for output in outputs:
        value, _, txn = output.partition("|")
        seen[value] += 1
        by_txn.setdefault(txn, set()).add(value)
        if value not in fed or txn not in txns:
            add("phantom_output", output=output)
        elif txns[txn][1] == ABORTED:
            add("aborted_output", output=output)
    for value, count in seen.items():
        if count > 1:
            add("duplicate_output", value=value, count=count,
                by=sorted(t for t, values in by_txn.items() if value in values))
    for value, acknowledged in fed.items():
        if acknowledged and value not in seen:
            add("lost_input", value=value)
    for txn, (values, outcome) in txns.items():
        if outcome == COMMITTED:
            missing = [v for v in values if v not in by_txn.get(txn, ())]
            if missing:
                add("lost_output", txn=txn, missing=missing)
    result.stats = {
        "fed": len(fed), "outputs": len(outputs),
        "transfer_txns_committed": sum(1 for _, o in txns.values() if o == COMMITTED),
        "transfer_txns_aborted": sum(1 for _, o in txns.values() if o == ABORTED),
        "transfer_txns_unknown": sum(1 for _, o in txns.values() if o == UNKNOWN),
    }
    return result


class Transfer:
    """The feeder and processors of one run. `scalable`: `topic://` source and sink (v5
    transactions, a QueueConsumer, keyed sends); else `persistent://` topics (v4). `stop`: the
    load ends (the feeder stops, the processors go on); `drain_now`: every transaction of the
    soak has ended: the processors empty the source, then stop. `sink_topics()`: the topics
    (segments) to read the sink from."""

    def __init__(self, url: str, source: str, sink: str, *, scalable: bool, rnd: random.Random,
                 stop: asyncio.Event, drain_now: asyncio.Event, error: Callable[[str, BaseException], None],
                 cumulative: bool = False, fed_by: Transfer | None = None) -> None:
        self.url, self.source, self.sink, self.scalable, self.rnd = url, source, sink, scalable, rnd
        self.stop, self.drain_now, self.error = stop, drain_now, error
        # `cumulative`: a Failover subscription of its own, each transaction's messages acked
        # with one cumulative ack of the last (often inside a batch); `fed_by`: the transfer
        # whose feeder fills the source (this one has none)
        self.cumulative = cumulative
        self.subscription = f"{SUBSCRIPTION}-cumulative" if cumulative else SUBSCRIPTION
        self.fed_by = fed_by
        self.fed: dict[str, bool] = fed_by.fed if fed_by is not None else {}
        self.stored_at: dict[str, Any] = fed_by.stored_at if fed_by is not None else {}
        self.txns: dict[str, tuple[list[str], str]] = {}
        # What each processor did, in order (for an anomaly's story: who took a value, with
        # which copy, and how its transaction ended); kept in memory, a few lines a value.
        self.events: list[str] = []
        self._started = time.monotonic()

    def trace(self, who: str, what: str) -> None:
        self.events.append(f"{time.monotonic() - self._started:8.3f} {who} {what}")

    def story_of(self, value: str) -> list[str]:
        """The events of the transactions that took `value` or another message of its entry
        (or acked cumulatively into it): who skipped it, and how."""
        at = self.stored_at.get(value)
        entry = f"({at.ledger_id},{at.entry_id}," if at is not None else None
        takers = {line.split()[1] for line in self.events
                  if f" got {value} " in line or (entry is not None and entry in line)}
        return [line for line in self.events if line.split()[1] in takers]

    def tasks(self) -> list[asyncio.Task[None]]:
        prefix = "c" if self.cumulative else "p"
        feeder = [asyncio.ensure_future(self.feeder())] if self.fed_by is None else []
        return [*feeder, *(asyncio.ensure_future(self.processor(f"{prefix}{i}")) for i in range(PROCESSORS))]

    async def feeder(self) -> None:
        """Bursts of 1-8 concurrent sends, batched: the processors acknowledge batch indexes."""
        client = Client(self.url, operation_timeout_seconds=5.0)
        producer = None
        n = 0

        async def feed(value: str) -> None:
            self.fed[value] = False
            try:
                if self.scalable:
                    self.stored_at[value] = await producer.send(value.encode(), key=value)
                else:
                    self.stored_at[value] = await producer.send(value.encode())
            except Exception as exc:
                self.error("feeder send", exc)
            else:
                self.fed[value] = True

        try:
            while not self.stop.is_set():
                await asyncio.sleep(self.rnd.uniform(0.01, 0.05))
                try:
                    if producer is None:
                        producer = await client.create_producer(self.source, send_timeout_ms=5000,
                                                                batching_enabled=True, batching_max_publish_delay_ms=2)
                except Exception as exc:
                    self.error("feeder producer", exc)
                    await asyncio.sleep(0.2)
                    continue
                burst = [f"x{n + i}" for i in range(1, self.rnd.randint(1, 8) + 1)]
                n += len(burst)
                await asyncio.gather(*(feed(value) for value in burst))
        finally:
            await client.close()

    async def _consumer(self, client: Client) -> Any:
        """On one Shared subscription: a message of a batch is acknowledged alone, by its index.
        Cumulative: a Failover subscription (one processor active at a time)."""
        if self.cumulative:
            return await client.subscribe(self.source, self.subscription, consumer_type="failover",
                                          initial_position="earliest")
        if self.scalable:
            return await client.subscribe_queue(self.source, self.subscription)
        return await client.subscribe(self.source, self.subscription, consumer_type="shared",
                                      initial_position="earliest")

    async def processor(self, name: str) -> None:
        rnd = self.rnd
        client = Client(self.url, operation_timeout_seconds=5.0)
        consumer = producer = None
        quiet_since = time.monotonic()
        try:
            while True:
                if self.drain_now.is_set() and time.monotonic() - quiet_since > QUIET_S:
                    return
                try:
                    if consumer is None:
                        consumer = await self._consumer(client)
                    if producer is None:
                        producer = await client.create_producer(self.sink, send_timeout_ms=5000)
                    txn = await client.new_transaction(TXN_TIMEOUT_MS, scalable=self.scalable)
                except Exception as exc:
                    self.error(f"{name} start", exc)
                    await asyncio.sleep(0.2)
                    continue
                t = f"{name}:{txn.txn_id}"
                self.trace(t, "begins")
                values: list[str] = []
                self.txns[t] = (values, ABORTED)          # until its commit is known
                ok = True
                for _ in range(rnd.randint(1, 5)):
                    try:
                        message = await consumer.receive(0.2)
                    except TimeoutError:
                        break
                    except Exception as exc:
                        self.error(f"{name} receive", exc)
                        ok = False
                        break
                    quiet_since = time.monotonic()
                    value = message.data.decode()
                    self.trace(t, f"got {value} at {message.message_id} redelivery {message.redelivery_count}")
                    try:
                        if not self.cumulative:
                            await consumer.acknowledge(message, txn=txn)
                        values.append(value)
                        output = f"{value}|{t}".encode()
                        if self.scalable:
                            await producer.send(output, key=value, txn=txn)
                        else:
                            await producer.send(output, txn=txn)
                    except Exception as exc:
                        self.error(f"{name} ack/send", exc)
                        self.trace(t, f"ack/send failed: {exc!r}")
                        ok = False
                        break
                if ok and values and self.cumulative:
                    try:
                        await consumer.acknowledge_cumulative(message, txn=txn)    # the last one taken
                    except Exception as exc:
                        self.error(f"{name} ack", exc)
                        self.trace(t, f"cumulative ack at {message.message_id} failed: {exc!r}")
                        ok = False
                    else:
                        self.trace(t, f"acked cumulatively up to {message.message_id}")
                outcome = ABORTED
                if ok and values and rnd.random() < 0.8:
                    outcome = await self._commit(name, txn)
                    self.txns[t] = (values, outcome)
                else:
                    with contextlib.suppress(Exception):
                        await txn.abort()           # (a cumulative consumer is rewound by it)
                self.trace(t, f"ends {outcome} (client state {txn.state})")
                if ok and self.cumulative and outcome != COMMITTED and txn.state != txn_states.ABORTED:
                    # not committed, not aborted here (timed out, unknown): read again from the
                    # subscription's position, or the queue's later messages come first
                    with contextlib.suppress(Exception):
                        await consumer.redeliver_unacknowledged_messages()
                    self.trace(t, "asked for redelivery")
                if not ok:
                    # what this consumer holds unacknowledged comes back on a new one
                    with contextlib.suppress(Exception):
                        await consumer.close()
                    consumer = None
                    self.trace(t, "closed its consumer")
        finally:
            await client.close()

    async def _commit(self, name: str, txn: Any) -> str:
        try:
            await txn.commit()
        except Exception as exc:
            self.error(f"{name} commit", exc)
            if txn.state in (txn_states.ABORTED, txn_states.TIMED_OUT) or (
                    isinstance(exc, InvalidTxnStatusError) and "timed out" in str(exc)):
                return ABORTED          # never sent, or refused as timed out: it can never commit
            return UNKNOWN              # a crash, a timeout, a refusal of a commit sent twice...
        return COMMITTED

    async def read_sink(self, topics: list[str]) -> list[str]:
        """Every committed output, read from the earliest message of each of `topics`."""
        outputs: list[str] = []
        async with Client(self.url, operation_timeout_seconds=10.0) as client:
            for topic in topics:
                reader = await client.create_reader(topic, MessageId.earliest, start_message_id_inclusive=True)
                while await reader.has_message_available():
                    try:
                        outputs.append((await reader.receive(10)).data.decode())
                    except TimeoutError as exc:     # more stored, nothing comes: counted, not hidden
                        self.error(f"reading the sink {topic} stopped early", exc)
                        break
                await reader.close()
        return outputs


def merged(a: Result, b: Result) -> Result:
    """Two pipelines' results as one (their anomalies and counts added)."""
    result = transfer_result()
    for kind in TRANSFER_CLASSES:
        result.anomalies[kind] = [*a.anomalies[kind], *b.anomalies[kind]]
    result.stats = {key: a.stats.get(key, 0) + b.stats.get(key, 0) for key in a.stats} | {"fed": a.stats["fed"]}
    return result


async def finish(transfer: Transfer, tasks: list[asyncio.Task[None]],
                 sink_topics: Callable[[], Awaitable[list[str]]]) -> Result:
    """Once the soak has set `drain_now`: wait for the processors (`tasks`: none, when waited
    for with another pipeline's) to empty the source and for their last transactions to end (a
    commit of unknown outcome: its timeout), then read the sink and check the run."""
    if tasks:
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, BaseException):
                transfer.error("transfer task", result)
        await asyncio.sleep(TXN_TIMEOUT_MS / 1000 + 1)
    outputs = await transfer.read_sink(await sink_topics())
    result = check_transfer(transfer.fed, transfer.txns, outputs)
    for lost in result.anomalies["lost_input"]:
        lost["stored_at"] = str(transfer.stored_at.get(lost["value"]))
        lost["story"] = transfer.story_of(lost["value"])
    return result
