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

Publish: 10 concurrent tasks, 1 KiB messages, fsync on; plain tasks send groups of 100 and wait
for them, transactional tasks send 100 per transaction and commit (same messages in flight).
`txn_publish_cpu_ratio_100` divides the process CPU per message of the same rounds (each side's
least; both threads, kernel included): when it is close to the throughput ratio, the gap is CPU
and not waiting (so far it has been: within 0.02 in ten runs on 2026-11-26).
A transactional send shares its group commit with the ADD_PARTITION record (one LMDB
transaction), and END_TXN writes the coordinator's decision and the commit marker in one group
commit (the marker is a conditional write: never durable without the decision), so each task
waits for three durable steps per transaction (NEW, the sends, the decision with its marker)
against one per plain group; the terminal record is written after the answer, lazily (it joins
the next group commit: before, it took a commit of its own that the next NEW records queued
behind - 84 commits for 200 transactions, now 62, against 20 for the same 20k plain messages). The run is
CPU-bound (process CPU ~= wall time): plain ~23-29 us of process CPU per message (both threads,
kernel included), transactional ~35-37 us; CPython's collector takes 15-20% of either (the
embedding application owns the collector: the benchmark leaves it at its defaults). The extra
~1 ms per transaction of 100 is coordinator records, the buffer's bookkeeping, the marker and
~35 more event-loop callbacks per transaction, and the extra commits' kernel time.
`txn_publish_ratio_100` measured 0.51-0.84 over this session's runs (plain runs alone vary by
~20% with the disk's fsync time and the other work on the machine): the 0.8 target is NOT
reliably met; merging the decision and marker commits cut in-process END_TXN of a one-message
transaction from 1.3-1.6 ms to 1.05 ms (p50) but did not move this ratio measurably.
A later decomposition (10 tasks, 10k-20k messages, runs of each kind alternated 6-12 times in
one process, main-thread CPU per message): a NEW_TXN per group of 100 costs 0-3 us per
message, sending in the transaction (its registration, the buffer's bookkeeping) 2-6, the
commit 2-4; on the same machine identical runs differ by up to 35% (17.5-26 us for the same
plain run, same GC counts), which is the size of the whole gap. The same ratio with fsync off
is ~0.83, on uvloop ~0.70 (uvloop speeds up the plain run, not the transactional one: the
extra cost is not the event loop's callbacks). Delaying back-to-back group commits by 1 ms to
batch more per commit (as BookKeeper's journal waits up to 2 ms) did not change the wire
broker's transactional throughput or CPU per message, so it was not kept.
Instructions counted under callgrind (deterministic where times are not; same workload, gc off,
per message from runs of 5k and 15k messages): plain 104.0k, transactional 126.9k, and 122.0k
since a transaction encodes its txn id fields once and appends them to each message's metadata
(setting them by name on each MessageMetadata was 4.9k): 0.852 by instructions (0.845 with
the collector on). Fitting 50, 100 and 200 per transaction: ~1.1M instructions per
transaction and ~6.8k per message on top of a plain send; NEW_TXN alone is ~176k and the
commit of an empty transaction ~495k (each `asyncio.shield` that keeps a cancelled caller
from cancelling a shared write or ending costs one more event-loop hop, ~0.9k per message in
all; each `asyncio.timeout` of the coordinator's retried calls ~7 us). The time ratio stays
below the instruction ratio: in five alternating rounds shaped as this suite's (fresh broker,
20k messages) user CPU was +35% for +18% instructions while kernel time differed by ~5 ms per
round: the transactional run executes its instructions more slowly (more objects alive until
the commit, three times the group commits and thread hand-offs). Those rounds gave 0.83 as
best over best and 0.755 as median over median, minutes after a recording of 0.647.
Later (same machine, a quieter day): one process, alternating 20k-message runs after a warm-up,
plain 9.0-9.1 us of process CPU per message, 100 per txn 11.5-12.9 (ratio ~0.75-0.76), 10 per
txn 27.5, one per txn ~210: a transaction costs ~200 us of CPU (~190 us user) on top of its
messages. A one-message transaction runs 36 event-loop callbacks: 10 of them are the hops of
five `asyncio.shield`s (cancelled callers must not make shared writes look failed), 4 the
coordinator's write bookkeeping, ~12 task steps; the rest of that time is the coordinator's
four log writes, the marker, and the buffer's bookkeeping, spread thin over many functions.
Two full runs of this suite that day gave 0.744 and 0.799 (the one recorded then); `--quick`
(5k messages, a fresh broker per round) 0.631.
Then the shared outcomes a transaction awaits (log writes, its ending, its marker) stopped
going through `asyncio.shield` (`pyengine/transaction/outcome.py`: a waiter per caller, set
directly), the log's two done callbacks per write became one, and the terminal record's local
write lost its timeout timer (~44k instructions alone): a one-message transaction went from
36 to ~20 event-loop callbacks and from 1.18M to 0.98M instructions; at 100 per transaction
122.3k -> ~119k instructions per message against 104.0k plain. `txn_publish_ratio_10` moved
from 0.32-0.33 to 0.37-0.42; `txn_publish_ratio_100` stayed within its noise (0.71-0.80 over
five full runs that afternoon, 0.706 the one recorded then, the machine in a slower spell:
plain 11-14 us per message where it had been 9). Old and new code alternated in one window:
10 per txn 27.8-30.1 -> 25.7-28.7 us of CPU per message; 100 per txn within the noise.
The collector is not what separates the two sides: tuned as `pyengine serve` tunes it
(`gc.freeze()` after start-up, young generation collected every 50,000 allocations), one
process alternating fresh-broker 20k-message runs, plain 9.5-11.2 us per message (11.6-14.8 at
the defaults) and 100 per txn 12.1-14.9 (15.4-18.4): both sides ~25% faster, the ratio best
over best 0.78-0.79 tuned against 0.70-0.85 at the defaults.
Seven full runs of this suite in one later hour (no engine change since the recording
before): `txn_publish_ratio_100` 0.772, 0.805, 0.696, 0.754, 0.687, 0.755 and 0.710 (the one
recorded then); median 0.755. The target is not met.
A later session (2026-11-25, evening): an embedded transaction counts its sends under way
instead of keeping each one's future for the commit to inspect, and the broker's publish path
appends to the transaction buffer without re-checking its arguments: 119.8k -> 118.5k
instructions per message at 100 per transaction (callgrind, gc off; plain 104.2k, so 0.879
by instructions; a one-message transaction costs ~870k instructions on top of a plain send).
Importing the embedding API no longer loads aiohttp, which made a third of the heap that every
full collection scans (7.1 -> 4.7 ms for a full collection after import). Where the rest of
the time gap is, per 20k-message round: the loop waits in select 49-57 ms of ~290 against
35-37 of ~220 (the same ~17% of the wall time on both sides: three durable steps per
transaction convoy the 10 tasks as one durable step per group does); the transactional round
runs 268 young collections against 176 and two full collections against one (~12-15 ms each
in the benchmark's process): its live objects rise and fall three times per transaction
(NEW, the sends, the commit) instead of once per group, and the collector counts the rises.
That one extra full collection is ~5% of a round and falls on either side of a ratio in
whole collections, which is much of the round-to-round spread. Committing asynchronously
and opening the next transaction at once (as pulsar-perf does) did not change the ratio on
this workload (five alternating rounds, twice: 0.735-0.857 against 0.747-0.814
committing in turn), so the benchmark keeps committing in turn. Three full runs before the
recording of that day gave 0.724, 0.752 and 0.803.
2026-11-26, per phase (1000 one-message transactions at once, collector off, CPU per
transaction): NEW_TXN 19-25 us, the partition's registration 17, the commit 78-83 (~14
event-loop callbacks, 7 futures and 2 tasks), the terminal record ~17; a plain send 12-14.
With the collector at its defaults a 20k-message round of 100 per txn ran 284-288 young, 26-27
middle and 2-3 full collections against 174-182, 15-16 and 1-2 plain (1.4-2.1 us of collector
time per message against 1.0-1.4; a full collection 6.7-8 ms): a transaction's own objects
raise the young count between the bursts of sends, and 103 more young collections per round
begin inside the sends' `gather` (5 in the plain round). Writing the terminal record with no
task waiting for it saved ~10 us of CPU per transaction but no collection and no measurable
ratio, so it was not kept. Four full runs of this suite that morning gave 0.779, 0.735, 0.721
and 0.747 (`txn_publish_cpu_ratio_100` 0.789, 0.741, 0.730 and 0.751).
Later that day a loaded partition takes the decision without a task or coroutine chain
(`TransactionBuffer.end_now`: its marker is queued in the turn the decision is), the terminal
record is written with no task waiting for it (a failed one is repeated by a task), and a
transaction's first sends keep one condition per queued append instead of one per message.
Per phase as above: NEW_TXN 15 us, the registration 10, the commit 42, the terminal record 6
(the commit and what follows it 61-68 -> 46-48 us, old and new code alternating); a first
send's extra cost per message 0.58-0.66 -> 0.51-0.53 us. The collector's counts did not
change (285-288 young collections per round). Six full runs after the changes: 0.757, 0.765,
0.751, 0.752 (recorded above), 0.752 and 0.742 (`txn_publish_cpu_ratio_100` 0.774, 0.773,
0.771, 0.763, 0.763 and 0.750): median 0.752 against 0.741 before, within this machine's
swings. The 0.8 target is not met.

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
