"""Engine benchmarks (in-process, no network): transactional publish overhead, transaction-buffer
recovery with snapshots vs by replay, and durable group-committed appends vs raw LMDB.

Run through the runner: `python -m benchmarks engine [--quick] [--json]`.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import tempfile
import time
from pathlib import Path

import lmdb
import pytest

from benchmarks.figures import Figure, Target, slowdown
from pyengine.broker import Broker
from pyengine.storage import ManagedLedger, StorageEnvironment
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine.transaction.buffer.topic_buffer import TopicTransactionBuffer
from pyengine_kernels import TxnId

QUICK = os.environ.get("PYENGINE_BENCH_QUICK") == "1"
PUBLISH_MESSAGES = 5_000 if QUICK else 20_000
PAYLOAD = b"x" * 1024
RECOVERY_TXNS = 100_000             # the issue fixes 100k finished txns, quick or not
APPEND_ENTRIES = 20_000 if QUICK else 100_000
WORKERS = 10                        # concurrent publishing tasks (transactions in flight)
GROUP = 100                         # messages a plain publishing task sends at a time
APPENDERS = 8                       # concurrent appenders in the append benchmark ...
APPEND_BATCH = 500                  # ... each appending this many entries at a time


NOTES = """
Rounds alternate between the two sides of each ratio (plain, 100 per txn, 10 per txn, plain,
...; appends, putmulti, appends, ...), each figure from each side's best round: the machine's
slow and fast spells last seconds to minutes and then fall on both sides.

Publish: each round on a fresh broker (empty data dir); 10 concurrent tasks, 1 KiB messages,
fsync on. Plain tasks send groups of 100 (`asyncio.gather` of 100 `send`s) and wait for them;
transactional tasks open a transaction, send 100 in it the same way, and commit (the same
messages in flight). `txn_publish_cpu_ratio_100` divides the process CPU per message of the same
rounds (each side's least; both threads, kernel included; within 0.02 of the throughput ratio
in ten runs on 2026-11-26). The collector is left at CPython's defaults: the embedding
application owns it.

Where a transaction's time goes (2026-11-26; one process, the variants taking turns, 20k
messages per round, five rounds each, medians; event-loop thread CPU and wall time per
message, collector off; two runs):

| each task's cycle | loop CPU us/msg | wall us/msg | vs the row above |
|---|---|---|---|
| 100 plain sends | 8.2-8.7 | 10.2-10.6 | |
| NEW_TXN, 100 plain sends, commit of the empty txn | 9.2-9.4 | 12.0-12.3 | +0.6-1.0 CPU, +1.7-1.8 wall |
| the same, one of the 100 sent in the txn | 9.7-10.6 | 12.6-13.9 | +0.4-1.2 CPU, +0.6-1.6 wall |
| 100 sends in the txn | 10.7-10.8 | 13.6-14.0 | +0.2-1.1 CPU, +0.2-1.0 wall |

- The wall time is the loop's CPU plus its waits in `select` (nothing else: the two add up
  to within 0.1 us). The tasks run in lockstep (all wait for the same group commits), so the
  loop idles through the fsyncs of each cycle: plain ~1.9-2.3 us per message waiting, one
  group commit per cycle; transactional ~3.0-3.3, three group commits per cycle. A traced
  cycle of the 10 tasks (~15 ms): NEW_TXN's commit (with the previous transactions' terminal
  records) durable in 0.35-0.45 ms; 6.6 ms of sends; their commit (the entries with the
  registrations) 2.1-2.4 ms; 3.6 ms completing the sends; 0.4 ms of commits; the decisions'
  commit (with the markers) 0.55-0.65 ms.
- NEW and the commit of an empty transaction: ~55 us of the loop's CPU per transaction and
  ~45 more in the writer thread and the kernel, 10 at a time; 38 us at 100 at a time (each
  group commit's hand-offs shared by more). Per phase, 1000 one-message transactions at once:
  NEW_TXN 15 us, the registration 10, the commit 42, the terminal record 6.
- A send in the transaction (one producer, 100 sends at a time, medians of 300 rounds, loop
  CPU): +1.0 us over a plain send while its partition's registration is in flight (every send
  of this benchmark: all 100 go before it lands), +0.5 once it is durable. Of the first: ~0.2
  the conditional append (an entry is never durable without its registration), ~0.25 sharing
  the registration; of the second: ~0.25 the buffer's layer and checks (ongoing here, not
  ending, not ended), the rest the txn id fields and the transaction's state checks.
- With the collector on, the transactional round runs ~285 young, 26 middle and 2-3 full
  collections against 175, 16 and 1-2 plain (1.4-2.1 us per message against 1.0-1.4): the 10
  tasks free their sends' objects together, wait two durable steps, then allocate the next
  100 each at once, and frees never give the young count credit back below zero. Yet the
  ratio is about 0.76 with the collector on or off (runs minutes apart): it costs both sides
  in proportion.

What does not close the gap (probes, each against the same code in alternating runs):
- Less waiting: NEW_TXN answered before its record is durable (and the record joining the
  sends' group commit: two group commits per cycle instead of three) changed neither the
  loop's measured idle time nor the ratio beyond their spread (0.754-0.806 against
  0.763-0.786); it would save at most the 0.35-0.45 ms of NEW's commit per cycle (~3%), and
  it is not done: Pulsar answers NEW_TXN once its record is durable, and a lost record would
  let a restarted coordinator hand out the same id again.
- A cheaper send: the transactional send cut to +0.25 us over plain (skipping the buffer's
  checks and the append's condition: not correct, an upper bound) moved the ratio from 0.767
  to 0.783 (means of three runs), within the spread.
- The interpreter: 19 modules (coordinator, buffer, storage, protocol) compiled with Cython as
  they are cut the wire broker's CPU per transactional message by under 3%.
- The event loop: a transaction of 100 adds ~18 callbacks (counted per round).
- Committing asynchronously and opening the next transaction at once (as pulsar-perf does);
  delaying back-to-back group commits by 1 ms to batch more (BookKeeper's journal waits up to
  2 ms); the collector tuned as `pyengine serve` tunes it (both sides ~25% faster, ratio best
  over best 0.78-0.79 against 0.70-0.85): none changed the ratio measurably.
- With fsync off the ratio is ~0.83; on uvloop ~0.70 (uvloop speeds up the plain side).
So the gap is ~300-350 us per transaction: about half is NEW_TXN and the commit with their
durable steps (the loop waiting, and ~55 us of its CPU), the other half the registration,
the marker, the buffer's bookkeeping and the sends' checks, each a small share.

What moved it, in order (CPU per transaction, event-loop callbacks, instructions counted under
callgrind with the collector off):
- The decision and its commit markers in one group commit (the marker a conditional write,
  never durable without the decision): in-process END_TXN of a one-message transaction 1.3-1.6
  -> 1.05 ms (p50). The terminal record written lazily: 84 -> 62 commits per 200 transactions.
- A transaction's txn id fields encoded once and appended to each message's metadata:
  126.9k -> 122.0k instructions per message (plain 104.0k).
- Shared outcomes (log writes, endings, markers) awaited through a waiter per caller instead
  of `asyncio.shield`, one done callback per log write, no timeout timer on the terminal
  record: a one-message transaction 36 -> ~20 callbacks, 1.18M -> 0.98M instructions;
  `txn_publish_ratio_10` 0.32-0.33 -> 0.37-0.42.
- Sends under way counted rather than kept; the broker's publish path no longer re-checks its
  arguments: 119.8k -> 118.5k instructions per message (0.879 by instructions). The embedding
  API no longer imports aiohttp (a full collection 7.1 -> 4.7 ms).
- A loaded partition takes the decision with no task or coroutine chain
  (`TransactionBuffer.end_now`), the terminal record is written with no task waiting for it,
  one condition per queued append: the commit and what follows it 61-68 -> 46-48 us.
- A ledger batch made to depend on a transaction's registration once rather than once per
  entry (the first sends of a transaction): their extra cost over a plain send ~1.0 -> ~0.85 us.
The ratio through these: recorded 0.647, 0.799, 0.706, 0.710, 0.752 and 0.786 (above); runs of
the full suite ranged 0.51-0.84 early on, later 0.687-0.805 (seven runs, median 0.755),
0.742-0.765 (six runs, median 0.752, against 0.741 before them) and, after the last change,
0.731-0.786 (ten runs, median 0.766; the last one recorded) - yet ten alternating runs of the
code before and after it, in a slower spell minutes later, gave 0.752 +- 0.005 and 0.745 +-
0.008: the change is below this machine's spread. The 0.8 target is not met.

Recovery: 100k finished txns (one entry and one marker each, 1 in 10 aborted); with
snapshots the buffer loads one snapshot and replays the few entries after it.

Appends: 8 tasks each append 500 entries at a time (one `append_batch`) and wait for them;
the baseline writes the same prepared items with one `putmulti(append=True)` and one commit.
Where ours goes (100k entries, one run): the writer thread ~0.09 s in putmulti and ~0.19-0.27 s
in 27 commits (write + fsync), the event loop ~0.16 s encoding and keying entries (0.22 s before
`append_batch` added the entries that fit a ledger in one loop); what the two threads cannot
overlap (the GIL while putmulti runs, the hand-offs between loop and writer) is the rest. The
baseline is one 100 MB putmulti and one fsync. `append_vs_lmdb_putmulti` moved between 0.34
and 0.63 over runs in three sessions, with the disk and the machine's other load.
"""


def per_op_throughput(name: str, ours: str, baseline: str, description: str, at_least: float | None) -> Figure:
    """Throughput of `ours` over throughput of `baseline` (time per message, inverted)."""
    return Figure(name, description, lambda t: t[baseline] / t[ours], "x",
                  Target(">=", at_least) if at_least is not None else None)


FIGURES = [
    per_op_throughput("txn_publish_ratio_100", "test_publish_txn_100", "test_publish_plain",
                      "publish throughput, 100 messages per transaction / no transactions (1 KiB, durable)", 0.8),
    per_op_throughput("txn_publish_ratio_10", "test_publish_txn_10", "test_publish_plain",
                      "the same with 10 messages per transaction (report; Kafka's anchor ~3% overhead)", None),
    per_op_throughput("txn_publish_cpu_ratio_100", "test_publish_txn_100:cpu", "test_publish_plain:cpu",
                      "process CPU per message (both threads, kernel included), no transactions / 100 per "
                      "transaction: the throughput ratio if the run were purely CPU-bound (report)", None),
    slowdown("tb_recovery_snapshot_vs_replay", "test_recovery_with_snapshot", "test_recovery_by_replay",
             "transaction-buffer recovery of 100k finished txns: snapshot + tail replay / full replay",
             at_most=0.1),
    Figure("append_entries_per_s", "durable 1 KiB appends per second through group commit",
           lambda t: 1 / t["test_append_group_commit"], "entries/s"),
    per_op_throughput("append_vs_lmdb_putmulti", "test_append_group_commit", "test_lmdb_putmulti",
                      "group-committed appends vs raw py-lmdb putmulti(append=True) in one txn (fsync both)", 0.5),
]


def run(coro):
    return asyncio.run(coro)


# --- transactional publish ------------------------------------------------------------------

async def publish(broker, messages: int, per_txn: int | None) -> None:
    """`messages` 1 KiB sends through the embedding API by WORKERS concurrent tasks (the same
    number of messages in flight either way); each task sends groups of GROUP messages at a
    time, and with `per_txn` each group is one transaction of that many messages."""
    group = per_txn or GROUP
    producer = await broker.create_producer("persistent://public/default/bench")

    async def worker(count: int) -> None:
        for start in range(0, count, group):
            txn = await broker.new_transaction() if per_txn else None
            await asyncio.gather(*(producer.send(PAYLOAD, txn=txn) for _ in range(min(group, count - start))))
            if txn is not None:
                await txn.commit()

    await asyncio.gather(*(worker(messages // WORKERS) for _ in range(WORKERS)))
    await producer.close()


def publish_benchmark(benchmark, per_txn):
    """One round: publish into a broker started (on a fresh data dir) before the clock runs."""
    benchmark.extra_info["ops"] = PUBLISH_MESSAGES
    loop = asyncio.new_event_loop()
    rounds = []

    def setup():
        path = Path(tempfile.mkdtemp(prefix="pyengine-bench-"))
        stack = Broker.embedded(path)
        broker = loop.run_until_complete(stack.__aenter__())
        rounds.append((path, stack))
        return (broker,), {}

    def teardown(broker):
        path, stack = rounds.pop()
        loop.run_until_complete(stack.__aexit__(None, None, None))
        shutil.rmtree(path, ignore_errors=True)

    def measured(broker):
        cpu = time.process_time()
        loop.run_until_complete(publish(broker, PUBLISH_MESSAGES, per_txn))
        benchmark.extra_info["cpu_s"] = time.process_time() - cpu     # one round per test item

    try:
        benchmark.pedantic(measured, setup=setup, teardown=teardown, rounds=1)
    finally:
        # pytest-benchmark skips `teardown` when benchmarks are disabled (a plain pytest run):
        # a broker left open would leave its tasks pending on a closed loop.
        while rounds:
            teardown(None)
        loop.close()


# The rounds of the publish benchmarks take turns (plain, 100 per txn, 10 per txn, plain, ...),
# one test item per round, and each timing is its best round: the machine's slow and fast
# spells, which last seconds to minutes here, then fall on both sides of a ratio.
PASSES = 3 if QUICK else 5
PUBLISH = {"test_publish_plain": None, "test_publish_txn_100": 100, "test_publish_txn_10": 10}


def alternating(names) -> list:
    return [pytest.param(name, id=f"{name.removeprefix('test_')}-{n}") for n in range(PASSES) for name in names]


@pytest.mark.parametrize("timing", alternating(PUBLISH))
def test_publish(benchmark, timing):
    benchmark.extra_info["timing"] = timing
    publish_benchmark(benchmark, PUBLISH[timing])


# --- transaction-buffer recovery ------------------------------------------------------------

TOPIC = "persistent://public/default/recovery"


_RECOVERY_DIRS: dict[bool, Path] = {}


@pytest.fixture(scope="module", autouse=True)
def _delete_recovery_topics():
    """The recovery topics are written once per run for all its rounds: deleted after them."""
    yield
    while _RECOVERY_DIRS:
        shutil.rmtree(_RECOVERY_DIRS.popitem()[1], ignore_errors=True)


def recovery_data_dir(snapshots: bool) -> Path:
    """A topic holding RECOVERY_TXNS finished txns (one entry + one marker each, 1 in 10
    aborted), written once per run; with snapshots off, recovery has to replay it all."""
    path = _RECOVERY_DIRS.get(snapshots)
    if path is None:
        path = _RECOVERY_DIRS[snapshots] = Path(tempfile.mkdtemp(prefix=f"pyengine-recovery-{snapshots}-"))
        _write_recovery_topic(path, snapshots)
    return path


def _write_recovery_topic(path: Path, snapshots: bool) -> None:

    async def fill():
        env = StorageEnvironment(path, sync=False)
        ledger = await ManagedLedger.open(env, TOPIC)
        buffer = TopicTransactionBuffer(ledger, TopicTransactionBufferConfig(snapshots_enabled=snapshots))
        await buffer.recover()
        for start in range(0, RECOVERY_TXNS, 1000):
            txns = [TxnId(i % 16, i) for i in range(start, start + 1000)]
            await asyncio.gather(*(buffer.append(txn, b"payload") for txn in txns))
            await asyncio.gather(*((buffer.abort if txn.least_bits % 10 == 0 else buffer.commit)(txn, -1)
                                   for txn in txns))
        await buffer.close()
        await ledger.close()
        await env.drain()
        env.close()

    run(fill())


async def recover(path: Path) -> int:
    env = StorageEnvironment(path, sync=False)
    try:
        ledger = await ManagedLedger.open(env, TOPIC)
        buffer = TopicTransactionBuffer(ledger)
        await buffer.recover()
        aborted = len(buffer.aborted)
        await ledger.close()
        return aborted
    finally:
        env.close()


def recovery_benchmark(benchmark, snapshots: bool):
    path = recovery_data_dir(snapshots)
    benchmark.extra_info["ops"] = 1
    aborted = benchmark.pedantic(lambda: run(recover(path)), rounds=3 if QUICK else 5)
    assert aborted == RECOVERY_TXNS // 10


def test_recovery_with_snapshot(benchmark):
    recovery_benchmark(benchmark, True)


def test_recovery_by_replay(benchmark):
    recovery_benchmark(benchmark, False)


# --- appends vs raw LMDB --------------------------------------------------------------------

def append_group_commit(benchmark):
    """Durable appends through the managed ledger, as producers ingest continuously: APPENDERS
    tasks each append a batch of APPEND_BATCH entries (what one socket read brings) and wait
    until it is durable before the next; group commit merges what is pending."""
    benchmark.extra_info["ops"] = APPEND_ENTRIES

    async def append_all(path: Path):
        env = StorageEnvironment(path)
        ledger = await ManagedLedger.open(env, "persistent://public/default/appends")

        async def appender(batches: int) -> None:
            for _ in range(batches):
                await ledger.append_batch([PAYLOAD] * APPEND_BATCH)

        await asyncio.gather(*(appender(APPEND_ENTRIES // APPEND_BATCH // APPENDERS) for _ in range(APPENDERS)))
        await ledger.close()
        env.close()

    def setup():
        return (Path(tempfile.mkdtemp(prefix="pyengine-append-")),), {}

    def target(path):
        try:
            run(append_all(path))
        finally:
            shutil.rmtree(path, ignore_errors=True)

    benchmark.pedantic(target, setup=setup, rounds=1)


@functools.cache
def putmulti_items() -> list[tuple[bytes, bytes]]:
    return [(i.to_bytes(16, "big"), PAYLOAD) for i in range(APPEND_ENTRIES)]


def lmdb_putmulti(benchmark):
    """The same data written by py-lmdb directly: one putmulti(append=True), one durable commit."""
    benchmark.extra_info["ops"] = APPEND_ENTRIES
    items = putmulti_items()

    def setup():
        return (Path(tempfile.mkdtemp(prefix="pyengine-lmdb-")),), {}

    def target(path):
        try:
            env = lmdb.open(str(path), map_size=8 << 30, max_dbs=2)
            db = env.open_db(b"entries")
            with env.begin(write=True) as txn:
                txn.cursor(db=db).putmulti(items, append=True)
            env.close()
        finally:
            shutil.rmtree(path, ignore_errors=True)

    benchmark.pedantic(target, setup=setup, rounds=1)


APPENDS = {"test_append_group_commit": append_group_commit, "test_lmdb_putmulti": lmdb_putmulti}


@pytest.mark.parametrize("timing", alternating(APPENDS))
def test_appends(benchmark, timing):
    benchmark.extra_info["timing"] = timing
    APPENDS[timing](benchmark)
