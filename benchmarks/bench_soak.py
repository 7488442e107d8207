"""Soak test with a nemesis: transactional writers, READ_COMMITTED readers, kill -9 / restart of
the broker and delayed END_TXN frames, checked by `benchmarks.history` (Jepsen's
`jepsen.tests.kafka` analyses: aborted / precommitted reads, lost writes, torn transactions,
duplicates, order disagreements, non-contiguous transactions, non-monotonic sends and reads, stuck
readers; reference section D3).

Run through the runner: `python -m benchmarks soak [--quick] [--json] [--record]`.

One run: `pyengine serve` as a child process (`ServeProcess`, fsync on); WORKERS clients, each in
a loop: a new transaction, unique values sent to 2-3 of the TOPICS, then commit (most),
abort, or wait past the transaction's timeout and then commit (it must fail). One more worker
(`wp`) reaches the broker through `EndTxnDelayProxy`, a TCP proxy that holds each END_TXN frame
for a random time, sometimes past the transaction's timeout and past the client's operation
timeout (the Bufstream / KIP-890 scenario: a commit or abort landing late). Readers `r1`, `r2`
(non-durable readers from the earliest message) and `c1` (a durable exclusive consumer that
acknowledges each message) read every topic and record what they receive. The nemesis
SIGKILLs the broker at random moments and restarts it on the same data dir and ports. At the
end the load stops, open transactions time out, the proxy closes, every reader drains every
topic, and the checker runs on the whole history.

An operation whose outcome the client cannot know (a timeout, a broken connection, a
coordinator's refusal of a commit that may have been sent twice across a crash) is recorded as
`info`: the checker allows either outcome of such a commit, but all or nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import shutil
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.figures import Figure, Target
from benchmarks.history import ABORT, COMMIT, FAIL, INFO, OK, SEND, History, Result, check
from benchmarks.transfer import Transfer, finish, merged
from pyengine.client import Client, MessageId
from pyengine.client import transaction as txn_states
from pyengine.client.url import BrokerAddress
from pyengine.errors import InvalidTxnStatusError, TransactionNotFoundError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.testing import ServeProcess

TOPICS = 3
WORKERS = 4
TXN_TIMEOUT_MS = 4000            # a worker's transactions
SHORT_TIMEOUT_MS = 1000          # a transaction left to time out (then committed: must fail)
PROXY_TXN_TIMEOUTS_MS = (2000, 10_000)   # the proxied worker's: END_TXN delays go past the first;
                                         # past the operation timeout but within the second
OPERATION_TIMEOUT_S = 5.0
QUIET_S = 3.0                    # a drain ends after this long without a message (and nothing left)


def measured(name: str, description: str, unit: str = "", op: str | None = None, value: float | None = None) -> Figure:
    return Figure(name, description, lambda m, name=name: m[name], unit,
                  Target(op, value) if op is not None and value is not None else None)


FIGURES = [
    measured("anomalies", "anomalies the history checker found (aborted/precommitted reads, lost writes, torn "
             "transactions, duplicates, order disagreements, non-contiguous transactions, non-monotonic sends and "
             "reads, stuck readers) and the exactly-once "
             "check of consume-transform-produce (outputs duplicated, aborted, lost)", "", "<=", 0),
    measured("txns_committed", "transactions whose commit was acknowledged"),
    measured("txns_aborted", "transactions aborted (abort, commit refused, or commit never sent)"),
    measured("txns_unknown", "transactions whose commit had an unknown outcome (timeout, crash)"),
    measured("kills", "kill -9 + restart of the broker during the run"),
    measured("values_read", "distinct values the readers received"),
    measured("transfer_txns_committed", "consume-transform-produce transactions committed (each acknowledges "
             "what it consumed and sends its outputs)"),
]

NOTES = """
Setup: `pyengine serve` (fsync on) as a child process; 4 workers + 1 worker behind the END_TXN
delay proxy, 3 topics, readers r1 / r2 (non-durable Readers) and c1 (durable consumer acking
each message) on every topic, one event loop. Transactions time out after 4 s (the proxied
worker's after 2 or 10 s; 10% of them are left to time out after 1 s and then committed).
Nemesis: SIGKILL + restart every 3-8 s (full run 4-10 s); the proxy holds 50% of END_TXN frames 0-2.5 s and 20% 3-7 s (past the proxied
worker's 2 s transaction timeout, and past the 5 s operation timeout: an unknown outcome that
commits when its timeout is 10 s). Full run: 180 s of load;
`--quick`: 40 s. The checker's classes are documented in `benchmarks/history.py`.

Exactly-once processing (`benchmarks/transfer.py`), in the same run and under the same
nemesis: a feeder sends unique values to a source topic in bursts of 1-8 batched messages; 2
processors consume it on one Shared subscription and, in transactions of 1-5 messages,
acknowledge each message (a batch index) and send `value|txn` to a sink topic, then commit
(80%) or abort. At the end the sink, read READ_COMMITTED, must hold every value the source
acknowledged exactly once, from a transaction that did not abort, and every output of every
committed transaction. Two more processors consume the same source on a Failover
subscription of their own, each transaction ended by one cumulative ack of the last message
taken (often inside a batch), into a sink of their own, checked the same way. (These checks
found that a v5 commit of some indexes of a batch took the entry out of flight, its other
messages lost until a restart; that a cumulative ack of a copy received before a reconnect
let the next transaction commit the new copies again; and, in 1 quick run of 8, the same
after the broker rewound on its own: a timed-out transaction's abort gave back what it held
and the consumer's queued copies came before the given-back stream; and, in 1 CI run, 2
values of a batch lost: a transaction of a consumer gone with a broker kill held them, the
dispatcher passed over them to the next consumer, and when it timed out that consumer's
cumulative ack of a later copy left before the given-back stream reached it. Each run's
processors trace what they took and acked; a lost value's report carries that story.)

The readers drain the topics only once every transaction has ended (the proxy closed, then
the longest transaction timeout passed): a READ_COMMITTED reader rightly stops before an open
transaction's first entry, and what was committed behind it is not visible yet. (The first
runs drained earlier and reported such values as lost writes; the held transaction then
committed or timed out and everything became visible: the harness, not the engine.) The
broker runs with de-duplication on: without it a send retried after a kill may be stored
twice, as in Pulsar.
"""


def msg_key(message_id: MessageId) -> tuple[int, int, int]:
    return (message_id.ledger_id, message_id.entry_id, message_id.batch_index)


def acknowledged_id(message_id: MessageId) -> tuple[int, int, int] | None:
    """A send's id as its receipt gave it; None for a resend (after a reconnect) that the
    broker's de-duplication found stored already: Pulsar answers it with ledger and entry -1,
    so the id it was stored at is not known, only that it was stored."""
    return msg_key(message_id) if message_id.ledger_id >= 0 else None


class EndTxnDelayProxy:
    """A TCP proxy to the broker that holds each client->broker END_TXN frame for a random
    time (`delay()`), letting the other frames pass (a delayed END_TXN may so arrive after
    later requests, as a retried one on another connection would). Broker->client bytes pass
    unchanged. A frame still held when its connection closes is dropped."""

    def __init__(self, broker_port: int, rnd: random.Random) -> None:
        self.broker_port = broker_port
        self.rnd = rnd
        self.port = 0
        self.delayed = 0
        self.dropped = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    def delay(self) -> float:
        x = self.rnd.random()
        if x < 0.5:
            return 0.0
        if x < 0.8:
            return self.rnd.uniform(0, 2.5)
        return self.rnd.uniform(3, 7)

    async def start(self) -> EndTxnDelayProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError):        # cancelled at the loop's end: quietly
            await self._proxy(client_reader, client_writer)

    async def _proxy(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            broker_reader, broker_writer = await asyncio.open_connection("127.0.0.1", self.broker_port)
        except OSError:
            client_writer.close()
            return
        self._writers |= {client_writer, broker_writer}
        up = asyncio.ensure_future(self._client_to_broker(client_reader, broker_writer))
        down = asyncio.ensure_future(self._pipe(broker_reader, client_writer))
        await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
        for writer in (client_writer, broker_writer):
            writer.close()
            self._writers.discard(writer)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    async def _client_to_broker(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readexactly(4)
                body = await reader.readexactly(int.from_bytes(head, "big"))
                frame = head + body
                command_size = int.from_bytes(body[:4], "big")
                command = pb.BaseCommand.FromString(body[4:4 + command_size])
                wait = self.delay() if command.type == pb.BaseCommand.END_TXN else 0.0
                if wait > 0:
                    self.delayed += 1
                    self._spawn(self._later(writer, frame, wait))
                else:
                    writer.write(frame)
                    await writer.drain()

    async def _later(self, writer: asyncio.StreamWriter, frame: bytes, wait: float) -> None:
        await asyncio.sleep(wait)
        if writer.is_closing():
            self.dropped += 1
            return
        writer.write(frame)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


def through_proxy(client: Client, proxy: EndTxnDelayProxy) -> Client:
    """Make every lookup of `client` answer the proxy's address, so its topic and coordinator
    connections go through the proxy too (the broker names its own address in lookups)."""
    lookup = client._core.lookup
    original = lookup.lookup

    async def proxied(topic: str) -> BrokerAddress:
        address = await original(topic)
        return BrokerAddress(address.logical, "127.0.0.1", proxy.port)

    lookup.lookup = proxied  # type: ignore[method-assign]
    return client


@dataclass
class Soak:
    broker: ServeProcess
    history: History
    topics: list[str]
    rnd: random.Random
    kills: int = 0
    broker_up: bool = True
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    drain_now: asyncio.Event = field(default_factory=asyncio.Event)   # every txn has ended: drain
    errors: dict[str, int] = field(default_factory=dict)
    drains: dict[str, Any] = field(default_factory=dict)   # reader topic -> (last message id, reads in the drain)
    error_examples: dict[str, str] = field(default_factory=dict)   # the first message of each kind of error

    def error(self, where: str, exc: BaseException) -> None:
        key = f"{where}: {type(exc).__name__}"
        self.errors[key] = self.errors.get(key, 0) + 1
        self.error_examples.setdefault(key, str(exc)[:300])

    async def nemesis(self, pause: tuple[float, float]) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.rnd.uniform(*pause))
                return
            self.kills += 1
            self.broker_up = False
            self.history.invoke("nemesis", "kill")
            await asyncio.to_thread(self.broker.kill)
            self.history.complete("nemesis", "kill", OK)
            await asyncio.sleep(self.rnd.uniform(0, 1.0))
            self.history.invoke("nemesis", "start")
            await asyncio.to_thread(self.broker.start)
            self.history.complete("nemesis", "start", OK)
            self.broker_up = True

    async def worker(self, name: str, url: str, timeouts_ms: tuple[int, ...],
                     proxy: EndTxnDelayProxy | None = None) -> None:
        h, rnd = self.history, self.rnd
        client = Client(url, operation_timeout_seconds=OPERATION_TIMEOUT_S)
        if proxy is not None:
            through_proxy(client, proxy)
        producers: dict[str, Any] = {}
        n = 0
        try:
            while not self.stop.is_set():
                await asyncio.sleep(rnd.uniform(0, 0.05))
                try:
                    for topic in self.topics:
                        if topic not in producers:
                            producers[topic] = await client.create_producer(topic, send_timeout_ms=5000)
                    let_time_out = rnd.random() < 0.1
                    timeout_ms = SHORT_TIMEOUT_MS if let_time_out else rnd.choice(timeouts_ms)
                    txn = await self.new_transaction(client, timeout_ms)
                except Exception as exc:                         # no value sent yet: nothing to record
                    self.error(f"{name} new txn", exc)
                    await asyncio.sleep(0.2)
                    continue
                t = f"{name}:{txn.txn_id}"
                sends_ok = True
                for topic in rnd.sample(self.topics, rnd.randint(2, len(self.topics))):
                    for _ in range(rnd.randint(*self.sends_per_topic)):
                        n += 1
                        value = f"{name}-{n}"
                        h.invoke(name, SEND, txn=t, topic=topic, value=value)
                        try:
                            message_id = await self.send_value(producers[topic], topic, value, txn)
                        except Exception as exc:
                            self.error(f"{name} send", exc)
                            h.complete(name, SEND, INFO, txn=t, topic=topic, value=value, error=repr(exc))
                            sends_ok = False
                            break
                        h.complete(name, SEND, OK, txn=t, topic=topic, value=value, msg_id=acknowledged_id(message_id))
                    if not sends_ok:
                        break
                if let_time_out:
                    await asyncio.sleep(SHORT_TIMEOUT_MS / 1000 + 0.5)
                if let_time_out or (sends_ok and rnd.random() < 0.7):
                    await self.commit(name, t, txn)
                else:
                    h.invoke(name, ABORT, txn=t)
                    try:
                        await txn.abort()
                        h.complete(name, ABORT, OK, txn=t)
                    except Exception as exc:
                        self.error(f"{name} abort", exc)
                        h.complete(name, ABORT, INFO, txn=t, error=repr(exc))
        finally:
            await client.close()

    sends_per_topic = (1, 3)         # a transaction's values to each topic it writes

    async def new_transaction(self, client: Client, timeout_ms: int) -> Any:
        return await client.new_transaction(timeout_ms)

    async def send_value(self, producer: Any, topic: str, value: str, txn: Any) -> MessageId:
        """Send `value` to `topic` in `txn`: the id its receipt gave."""
        return await producer.send(value.encode(), txn=txn)

    async def commit(self, name: str, t: str, txn: Any) -> None:
        h = self.history
        kills = self.kills
        h.invoke(name, COMMIT, txn=t)
        try:
            await txn.commit()
        except Exception as exc:
            self.error(f"{name} commit", exc)
            if txn.state in (txn_states.ABORTED, txn_states.TIMED_OUT):
                outcome = FAIL                 # END_TXN COMMIT never left the client
            elif isinstance(exc, (InvalidTxnStatusError, TransactionNotFoundError)) and self.kills == kills \
                    and self.broker_up:
                outcome = FAIL                 # refused by the coordinator, asked once (no crash in between)
            else:
                outcome = INFO
            h.complete(name, COMMIT, outcome, txn=t, error=repr(exc))
        else:
            h.complete(name, COMMIT, OK, txn=t)

    async def reader(self, name: str, url: str, topic: str, durable: bool) -> None:
        """Receive `topic` until told to drain; then read to its end and record `drained`."""
        h = self.history
        client = Client(url, operation_timeout_seconds=OPERATION_TIMEOUT_S)
        last: MessageId | None = None
        consumer: Any = None
        try:
            while True:
                try:
                    if consumer is None:
                        if durable:
                            consumer = await client.subscribe(topic, f"soak-{name}", consumer_type="exclusive",
                                                              initial_position="earliest")
                        else:
                            start = MessageId.earliest if last is None else last
                            consumer = await client.create_reader(topic, start, start_message_id_inclusive=last is None)
                        h.opened(name, topic, durable)     # a Reader must never go back: checked
                    try:
                        message = await consumer.receive(0.5)
                    except TimeoutError:
                        if self.drain_now.is_set():
                            break
                        continue
                    h.read(name, topic, msg_key(message.message_id), message.data.decode())
                    last = message.message_id
                    if durable:
                        await consumer.acknowledge(message)
                except Exception as exc:
                    self.error(f"{name} read", exc)
                    await asyncio.sleep(0.2)
                    if consumer is not None and getattr(consumer, "_closed", False):
                        consumer = None
            await self.drain(name, topic, consumer, durable)
        finally:
            await client.close()

    async def drain(self, name: str, topic: str, consumer: Any, durable: bool) -> None:
        h = self.history
        quiet_since = time.monotonic()
        deadline = time.monotonic() + 60
        reads = 0
        while time.monotonic() < deadline:
            try:
                message = await consumer.receive(0.5)
            except TimeoutError:
                if time.monotonic() - quiet_since < QUIET_S:
                    continue
                if durable or not await consumer.has_message_available():
                    with contextlib.suppress(Exception):
                        self.drains[f"{name} {topic[-1]}"] = (str(await consumer.get_last_message_id()), reads)
                    h.drained(name, topic)
                    return
                if time.monotonic() - quiet_since > 2 * QUIET_S + 10:
                    # has_message_available says more is stored, but nothing comes: the end the
                    # reader cannot pass (a marker or aborted entry): drained as far as it goes
                    self.errors[f"{name} {topic}: has_message_available stays true"] = 1
                    h.stuck(name, topic, "has_message_available stays true, nothing is delivered")
                    h.drained(name, topic)
                    return
                continue
            except Exception as exc:
                self.error(f"{name} drain", exc)
                await asyncio.sleep(0.2)
                continue
            quiet_since = time.monotonic()
            reads += 1
            h.read(name, topic, msg_key(message.message_id), message.data.decode())
            if durable:
                with contextlib.suppress(Exception):
                    await consumer.acknowledge(message)
        self.errors[f"{name} {topic}: drain did not finish"] = 1
        h.stuck(name, topic, "the drain did not finish in 60 s")


async def soak(duration_s: float, data_dir: Path, *, seed: int | None = None,
               kill_pause: tuple[float, float] = (3.0, 8.0), verbose: bool = True) -> tuple[Result, dict[str, Any]]:
    """One soak run of `duration_s` seconds of load: the checker's result and the run's counts."""
    seed = random.randrange(2**32) if seed is None else seed
    rnd = random.Random(seed)
    started = time.monotonic()
    broker = await asyncio.to_thread(ServeProcess(data_dir / "data", "--dedup").start)
    proxy = await EndTxnDelayProxy(broker.port, rnd).start()
    run = f"{seed:08x}"
    topics = [f"persistent://public/default/soak-{run}-{i}" for i in range(TOPICS)]
    s = Soak(broker, History(), topics, rnd)
    source, sink, cumulative_sink = (f"persistent://public/default/transfer-{run}-{end}"
                                     for end in ("in", "out", "out-cumulative"))
    transfer = Transfer(broker.url, source, sink, scalable=False, rnd=rnd, stop=s.stop, drain_now=s.drain_now,
                        error=s.error)
    cumulative = Transfer(broker.url, source, cumulative_sink, scalable=False, rnd=rnd, stop=s.stop,
                          drain_now=s.drain_now, error=s.error, cumulative=True, fed_by=transfer)
    transferred = None
    try:
        readers = [asyncio.ensure_future(s.reader(name, broker.url, topic, name == "c1"))
                   for name in ("r1", "r2", "c1") for topic in topics]
        transfer_tasks = transfer.tasks() + cumulative.tasks()
        workers = [asyncio.ensure_future(s.worker(f"w{i}", broker.url, (TXN_TIMEOUT_MS,))) for i in range(WORKERS)]
        workers.append(asyncio.ensure_future(
            s.worker("wp", f"pulsar://127.0.0.1:{proxy.port}", PROXY_TXN_TIMEOUTS_MS, proxy)))
        nemesis = asyncio.ensure_future(s.nemesis(kill_pause))
        await asyncio.sleep(duration_s)
        s.stop.set()                                  # workers finish their transaction, then stop
        await nemesis
        if broker.process is None:
            await asyncio.to_thread(broker.start)
        done, pending = await asyncio.wait(workers, timeout=60)
        for task in pending:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        # the proxy drops the END_TXN frames it still holds; open transactions time out
        await proxy.close()
        await asyncio.sleep(max(PROXY_TXN_TIMEOUTS_MS) / 1000 + 1)
        s.drain_now.set()                             # only now is every transaction over
        results = await asyncio.gather(*readers, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                s.error("reader task", r)
        transferred = await finish(transfer, transfer_tasks, lambda: _just(sink))
        transferred = merged(transferred, await finish(cumulative, [], lambda: _just(cumulative_sink)))
    finally:
        await proxy.close()
        if broker.process is not None:
            await asyncio.to_thread(broker.stop)
    result = check(s.history)
    info = {"seed": seed, "kills": s.kills, "ops": len(s.history), "end_txn_delayed": proxy.delayed,
            "end_txn_dropped": proxy.dropped, "seconds": round(time.monotonic() - started, 1),
            "errors": dict(sorted(s.errors.items())), "drains": s.drains, "history": s.history,
            "transfer": transferred}
    if not result.valid or transferred.count:
        # keep what a reproduction needs: the history (pickled Ops) and the broker's log
        keep = Path(tempfile.gettempdir()) / f"pyengine-soak-{seed}"
        keep.mkdir(exist_ok=True)
        (keep / "history.pkl").write_bytes(pickle.dumps(s.history.ops))
        if broker.log_path.exists():
            shutil.copy(broker.log_path, keep / "serve.log")
        for name, pipeline in (("transfer", transfer), ("transfer-cumulative", cumulative)):
            (keep / f"{name}-events.txt").write_text("\n".join(pipeline.events) + "\n")
        info["kept"] = str(keep)
    if verbose:
        if "kept" in info:
            print(f"soak: history and broker log kept in {info['kept']}", file=sys.stderr)
        print(f"soak seed={seed}: {result.summary()}", file=sys.stderr)
        print(f"soak: exactly-once transfer: {transferred.summary()}", file=sys.stderr)
        print(f"soak: kills={s.kills} ops={len(s.history)} END_TXN delayed={proxy.delayed} "
              f"dropped={proxy.dropped} in {info['seconds']} s; client errors: {info['errors']}", file=sys.stderr)
        if not result.valid:
            print(f"soak: drains (last message id, messages read while draining): {s.drains}", file=sys.stderr)
    return result, info


async def _just(topic: str) -> list[str]:
    return [topic]


def figures_of(result: Result, info: dict[str, Any]) -> dict[str, float]:
    transferred: Result = info["transfer"]
    return {"anomalies": result.count + transferred.count, "txns_committed": result.stats["txns_committed"],
            "transfer_txns_committed": transferred.stats["transfer_txns_committed"],
            "txns_aborted": result.stats["txns_aborted"], "txns_unknown": result.stats["txns_unknown"],
            "kills": info["kills"], "values_read": result.stats["values_read"]}


def measure(quick: bool, record: bool) -> dict[str, float]:
    duration, pause = (40.0, (3.0, 8.0)) if quick else (180.0, (4.0, 10.0))
    with tempfile.TemporaryDirectory(prefix="pyengine-soak-") as tmp:
        result, info = asyncio.run(soak(duration, Path(tmp), kill_pause=pause))
    return figures_of(result, info)
