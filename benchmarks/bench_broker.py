"""Broker benchmarks over the network: `pyengine serve` in one process, `pyengine perf` as the load
generator in another, on loopback, all in one run.

Run through the runner: `python -m benchmarks broker [--quick] [--json] [--record]`.

This suite measures its figures itself (`measure`), as throughputs and latency percentiles of
whole runs, instead of pytest-benchmark timings: a figure is one `pyengine perf` run against
a freshly started broker, and the ratios compare runs made one after the other in this process.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from pyengine.testing import SERVE, ServeProcess
from benchmarks.figures import Figure, Target
from pyengine.cli.perf import plot_percentiles

HERE = Path(__file__).resolve().parent
PLOT = HERE / "figures" / "broker_latency.png"
SIZE = 1024
PER_TXN = 100
TXN_PRODUCERS = 10                # 10 producers with up to TXN_PENDING messages in flight each: 1000
TXN_PENDING = 100                 # in all, as the plain run's one producer with 1000 pending
PERF_TIMEOUT_S = 300


def measured(name: str, description: str, unit: str, op: str | None = None, value: float | None = None) -> Figure:
    return Figure(name, description, lambda m, name=name: m[name], unit,
                  Target(op, value) if op is not None and value is not None else None)


FIGURES = [
    measured("publish_msgs_per_s", "non-transactional publish, 1 KiB, batching on, fsync on, as fast as it goes",
             "msg/s", ">=", 100_000),
    measured("txn_vs_plain_throughput_100", "publish throughput with 100 messages per transaction "
             "(10 producers, commits asynchronous, 1000 messages in flight as the plain run) / without transactions", "x", ">=", 0.8),
    measured("end_txn_p99_ms", "END_TXN (commit) round trip p99, transactions of 100 at half their max rate",
             "ms", "<=", 5),
    measured("commit_to_visible_p99_ms", "commit acknowledged -> first message at a consumer (a process of its own) p99, "
             "same run", "ms", "<=", 20),
    measured("publish_p99_ms", "publish latency p99 (send -> receipt) at half of the max publish rate", "ms", "<=", 10),
    measured("uvloop_vs_asyncio", "max publish throughput with the broker on uvloop / on asyncio's default loop",
             "x"),
    measured("publish_msgs_per_s_no_fsync", "as publish_msgs_per_s with the broker's fsync off (--no-fsync)",
             "msg/s"),
    measured("end_txn_p99_ms_at_max", "END_TXN p99 in the max-throughput transactional run (report)", "ms"),
    measured("txn_vs_plain_cpu_100", "CPU per message (broker + load generator) without / with transactions of "
             "100, over every max-rate round: the throughput ratio where both sides are CPU-bound (report; steadier "
             "than the throughputs on a shared machine)", "x"),
]

NOTES_HEAD = """
Setup: the broker (`pyengine serve`, LMDB, fsync ON unless said otherwise: every publish
receipt and END_TXN response is sent after the group commit's fsync, as Pulsar's bookie journal
syncs by default) and the load generator (`pyengine perf`, uvloop, one process per run) run as
separate processes on loopback, sharing the machine's two cores (and, while recording, with
other work on the machine: absolute figures move with the load, ratios less). Every run has a
broker of its own on an empty data dir (deleted after): uvloop + fsync (the main figures),
asyncio + fsync, uvloop without fsync. Each run has a warm-up that is not measured, then the
measured period (full run: 2 s + 8 s; `--quick`: 0.5 s + 2 s and one round). Max-rate runs
keep at most 1000 messages in flight per producer (pulsar-perf's default); batches of up to
1000 messages / 128 KiB, 1 ms batch window (pulsar-perf's `-b 1`). The transactional
throughput run uses 10 producers with 100 pending messages each (1000 in flight, as the plain
run's one producer), each sending transactions of 100 messages one after another; as in
pulsar-perf, a commit is asynchronous and the next transaction opens at once
(`--no-visibility`: no consumer, as in the plain run). Latency figures come from runs at half
of the measured max rate: `publish_p99_ms` from a plain run, `end_txn_p99_ms` and
`commit_to_visible_p99_ms` from a transactional run with a consumer in a process of its own,
as a separate application (`pyengine.cli.perf_watcher`: it reports each transaction's first
message with its CLOCK_MONOTONIC arrival time; commit-to-visible counts 0 when that message
arrived before the commit's response, as most do: the dispatcher delivers committed entries
once the marker is durable, before the END_TXN response reaches the client). Paced runs
(`--rate`) space every message as pulsar-perf's rate limiter does, and paced transactional
producers start spread over one transaction's time (started together, they all committed at
the same instants). `serve` and `perf` freeze their start-up objects, collect the young
generation every 50,000 allocations instead of 700, and keep freed heap memory (glibc's trim
threshold at 128 MiB) while they run.

Where the time goes, transactional throughput (`txn_vs_plain_throughput_100`):
- CPU per message (the recording's table below): plain ~1.9-2.2 us in the broker and ~2.6-2.8
  in the load generator, transactional ~3.6-3.7 and ~3.6-3.7. A transaction's 100 messages
  arrive as one batch entry, so the extra is per transaction: ~160-180 us of the broker (its
  event loop: NEW_TXN, ADD_PARTITION_TO_TXN, END_TXN, four coordinator records, the marker,
  the buffer; its kernel: more group commits, ~3.6 LMDB page writes per transaction against
  ~1 per 100 plain messages) and ~90 us of the load generator (the coordinator requests,
  holding the first sends for ADD_PARTITION_TO_TXN, the commit). `txn_vs_plain_cpu_100` (0.64-0.65) is where the
  ratio would be if both runs were CPU-bound; the transactional one uses ~1.3-1.4 of the 2
  cores.
- Over the wire a transaction is four steps: NEW_TXN (its record durable), ADD_PARTITION_TO_TXN
  (answered once its record is queued: every transactional append is written with or after
  its partition's registration, `CoordinatorRouter.add_produced_partitions`), the sends
  (entries), END_TXN (the decision record and the commit markers in one group commit: a marker
  is a conditional write, never durable without its decision). Each producer (100 pending =
  one transaction) waits for its transaction's receipts before the next one's sends: ~1.15 ms
  batching delay, the registration's answer at ~1.65 ms, SEND to receipt ~2.2 ms, then ~1 ms
  until the next sends leave, as the load generator's loop lags (a 1 ms timer fires 0.11 /
  1.0 / 2.0 ms late at p50 / p90 / p99). With 1000 pending per producer both cores are busy
  and the throughput is about the same.
- How far the protocol alone allows (a probe, not kept): a broker that answers NEW_TXN,
  ADD_PARTITION_TO_TXN and END_TXN at once and stores transactional sends as plain ones
  reached 0.86-1.02 of its plain run, the real broker 0.52-0.61 in the same alternating runs.
  Per message, the broker's event loop spent 0.8-0.9 us on that floor against 2.2-2.8 (0.44
  plain); the load generator 4.7-5.5 on either against 3.4-3.6 plain. So the round trips and
  the client's bookkeeping cost ~0.4 us per message in the broker and ~1.2 in the load
  generator, and the transaction work itself (records, buffer, marker) ~1.4-2 us in the
  broker: that part, ~150-200 us per transaction, is the gap to 0.8 (the engine benchmark's
  notes break the same work down in process).

Where the time goes, END_TXN at half rate (`end_txn_p99_ms`):
- The half-rate run is paced: 10 producers each send a batch of ~10 messages per 1 ms window,
  and every batch is a SEND, an entry, a receipt and a share of a group commit. Per message
  the broker spends ~5.7-6.9 us there (3.7 at max rate), the load generator ~6.4-6.9 (each
  send timed by its own callback; the pacer alone ~0.6 us) and the watcher ~3.8-4.1 (the
  table below counts the last two together): ~1.5-1.7 of the 2 cores at ~90k msg/s.
- The broker's own END_TXN histogram in that run: 21% under 2 ms, 93% under 5, all under 10.
  Phase timers (p50 / p90, paced at 95k msg/s): 3.7 / 5.4 ms in all, of which the decision's
  group commit (waiting for the commit in flight, then its own; the markers join it) 2.6 /
  4.1 and the event-loop hops from the marker's durability to the answer 0.6 / 1.7; at max
  rate 1.7 / 3.3, the commit 1.2 / 2.7. The client sees ~1.5-2 ms more (its loop, the sockets).
- The disk is not the limit: on this machine, idle, an LMDB commit with fsync takes p50 / p99
  0.21 / 0.30 ms for 200 bytes and 0.41 / 0.55 ms for 128 KiB (2026-11-26), against the 2.6
  ms (p50) of the decision's group commit under the paced load. The tail is the machine's
  load: both processes and the watcher near the two cores. (py-lmdb releases the GIL for
  every put, so the writer's puts can queue behind the event loop, but a 0.2 ms switch
  interval instead of 5 changed neither the commit wait nor END_TXN.)

What moved the figures (each measured in alternating rounds of old and new code):
- 2026-11-25: ADD_PARTITION_TO_TXN answered once its record is queued, and held sends leaving
  when the batching delay has passed since they were sent: transactional 132-150k -> 167-204k
  msg/s, the ratio 0.41-0.48 -> 0.57-0.66. Commits made asynchronous, as in pulsar-perf (one
  at a time per producer had made the run latency-bound on END_TXN). Batches decoded in
  Cython (`core_ext.batch.decode_batch`: 2.35 -> 1.12 us per message in the watcher). The
  client's batched send path, perf's receipt handling and one-pass percentiles: client CPU per
  plain message 10.5 -> 6.5 us, per transactional message 20 -> 14 us.
- The watcher in a process of its own: END_TXN p99 at 50k msg/s 16.4 ms with it in the load
  generator's loop, 8.3-11.1 in its own process; tuned collector there: commit-to-visible p99
  38-42 -> 4.9-5.2 ms at 100k msg/s.
- 2026-11-26: glibc keeps freed heap memory (29.6 -> 1.3 minor page faults per transaction
  of 100, broker kernel time per transactional message 2.08 -> 1.61-1.69 us); the client
  batches a transaction's first messages at once and writes ADD_PARTITION_TO_TXN in the same
  turn (load generator 4.29 -> 3.91 us per transactional message, first send to the
  registration's answer 2.09 -> 1.65 ms); the decision taken by a loaded partition with no
  task (`TransactionBuffer.end_now`) and the terminal record written with no task waiting for
  it (broker CPU per transactional message median 3.70 -> 3.58 us, END_TXN at max rate p99
  8.1-9.8 -> 7.1-7.9 ms); a transactional SEND to a durably registered partition goes
  straight to the topic. The throughput ratio moved less than either side: plain gained too.
- 2026-11-26, later: a paced send of `pyengine perf` takes its turn from the pacer without a
  coroutine and reads the clock once per burst (`Pacer.take`): load generator 6.49-6.93 ->
  6.31-6.60 us per message at 90k msg/s, and END_TXN p99 in the same alternating runs 8.3-11.8
  -> 7.5-11.0 ms (medians 10.2 -> 8.2; lower in 7 of 8 pairs): the load generator's own loop
  is part of END_TXN's tail. Minutes later the same code gave p99 12.7-13.3 ms: the machine's
  other load moves this figure more than that.
- 2026-11-28: a transaction's `send_async` goes straight to the producer's submit when its
  partition is registered or its registration is in flight (four layers before), and the
  commit screens its sends with `map(Future.exception, ...)` instead of a Python loop: load
  generator CPU per transactional message 6.97 -> 6.17 and 6.36 -> 5.80 us in two runs of
  alternating rounds (a slow spell: plain at ~4.8 us there), throughput 107k -> 129k and 115k
  -> 121k msg/s (medians) against the same broker. The ratio moved within its spread: the
  broker's ~170-340 us per transaction is most of what is left.
- Recordings before this one: `txn_vs_plain_throughput_100` 0.595, 0.59, 0.581 (plain at 333k
  msg/s), 0.585 (plain 321k, transactional 188k); `end_txn_p99_ms` 13.2, 13.6, 9.5. This one
  (2026-11-26, after the session that added delayed delivery, compaction and expiry):
  transactional 189k msg/s as before at the same 3.6-3.7 us of broker CPU per message, plain's
  best round 343k, so the ratio 0.553. Neither target is met.

Tried and not kept (no measurable change): answering NEW_TXN before its record is durable (a
lost record would let a restarted coordinator hand out the same id again; in process it did
not move the ratio either); a writer that writes commit N+1 while commit N syncs (LMDB allows
it only without its own fsync ordering: not crash-safe); delaying back-to-back group commits
by 1 ms; the client's writes collected into one `writelines` per loop turn (slowed the plain
run); Cython-compiling 19 of the broker's modules as they are (under 3% of its CPU per
transactional message: the cost is the event loop's machinery, allocation and the kernel);
answering a registration or a registered SEND without a task; sealing the decision's batch at
once; the client sending its open batch as soon as the producer's queue is full (as
pulsar-client-cpp does); perf timing paced sends with one reaper per producer instead of a
callback each, or sending a burst in slices. Probes of 2026-11-27 (a slower spell: plain
160-240k msg/s; the transactional run alternating with each, 100 pending per producer): a
transaction's first sends not held for ADD_PARTITION_TO_TXN's answer (this broker registers the
partition with a transactional SEND itself), its batch sent right after its last send instead
of at the batching delay, and both: 113k, 87k and 98k msg/s against 114k, then 104k, 95k and
104k against 91k (the spread, not a change); NEW_TXN answered before its record is durable:
no change either. With 1000 pending per producer the load generator is the limit (1.0 core,
6.3-7.5 us of CPU per transactional message against 4.1-4.9 plain), and NEW_TXN's round trip
(5.6-9.5 ms, each producer opening its transactions one after another as pulsar-perf does).
The broker's event-loop thread under Linux `perf` (same day, 4 s of each run, 100 pending per
producer): 1.95 us per plain message, 4.65 per transactional one. Of the difference, 1.8 us is
the interpreter running the transaction path (~180 us per transaction of 100: NEW_TXN,
ADD_PARTITION_TO_TXN, the SEND's registration, END_TXN, the coordinator's records, the buffer,
the marker), 0.4 the kernel and 0.1 libc; uvloop's own code is 3.5% of the thread against 4.5%
plain. (py-spy, which cannot walk uvloop's frames, had put much of that interpreter time in the
event loop itself.)

This VM slows down writes of data it has never held: after ~6-7 GB written in a broker's life,
the writer thread's system time per message rose from ~1.0 to ~3.0 us (`perf record`: the copy
into the page cache from 2% to 53% of the broker's samples, first touches of guest memory).
A full run of this suite writes tens of GB, so later rounds can be slower than earlier ones on
either side; each figure takes its best round.
"""


@dataclass
class PerfRun:
    """One `pyengine perf` run: its JSON result and the CPU seconds both sides used."""

    label: str
    result: dict[str, Any]
    broker_cpu_s: float
    loadgen_cpu_s: float

    @property
    def messages(self) -> int:
        return max(1, self.result["messages_with_warmup"])

    @property
    def cpu_per_message(self) -> float:
        return (self.broker_cpu_s + self.loadgen_cpu_s) / self.messages

    def cpu_line(self) -> str:
        r = self.result
        return (f"| {self.label} | {r['msgs_per_s']:.0f} | {1e6 * self.broker_cpu_s / self.messages:.1f} | "
                f"{1e6 * self.loadgen_cpu_s / self.messages:.1f} |")


def perf(broker: ServeProcess, label: str, mode: str, *flags: str, duration: float, warmup: float) -> PerfRun:
    """Run `pyengine perf MODE` against `broker` in a child process and return its figures."""
    topic = "persistent://public/default/bench-" + re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    command = [sys.executable, "-c", SERVE, "perf", mode, topic,
               "--url", broker.url, "--size", str(SIZE), "--duration", str(duration), "--warmup", str(warmup),
               "--json", "--quiet", *flags]
    broker_before = broker.cpu_seconds()
    done = subprocess.run(command, capture_output=True, text=True, timeout=PERF_TIMEOUT_S)
    broker_cpu = broker.cpu_seconds() - broker_before
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].startswith("{"):
        raise RuntimeError(f"pyengine perf {mode} {' '.join(flags)} failed (exit {done.returncode}):\n"
                           f"{done.stdout[-2000:]}{done.stderr[-2000:]}\nbroker log:\n"
                           f"{broker.log_tail(20)}")
    result = json.loads(lines[-1])
    # (a transactional run's commit-to-visible consumer is a process of its own: counted in)
    return PerfRun(label, result, broker_cpu, result["cpu_s"] + result.get("watcher_cpu_s", 0.0))


@contextlib.contextmanager
def broker_on(label: str, *, fsync: bool = True, loop: str = "uvloop") -> Iterator[ServeProcess]:
    data_dir = Path(tempfile.mkdtemp(prefix=f"pyengine-bench-broker-{label}-"))
    try:
        with ServeProcess(data_dir / "data", fsync=fsync, loop=loop) as broker:
            check_event_loop(broker, loop)
            yield broker
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def check_event_loop(broker: ServeProcess, loop: str) -> None:
    """The broker logs the module of its event loop: make sure a comparison of loops compares them."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = [line for line in broker.log_lines(200) if "Pulsar protocol on" in line]
        if lines:
            on_uvloop = "(uvloop" in lines[-1]
            if on_uvloop != (loop == "uvloop"):
                raise RuntimeError(f"the broker was to run on {loop}: {lines[-1].strip()}")
            return
        time.sleep(0.05)
    raise RuntimeError(f"the broker never said which event loop it runs on: {broker.log_tail(5)}")


def p99(run: PerfRun, latency: str) -> float:
    value = run.result["latency_ms"][latency]["p99"]
    if value is None:
        raise RuntimeError(f"{run.label}: no {latency} samples")
    return float(value)


def measure(quick: bool, record: bool = False) -> dict[str, float]:
    global NOTES
    duration, warmup, repeats = (2.0, 0.5, 1) if quick else (8.0, 2.0, 3)
    txn_flags = ("--messages-per-txn", str(PER_TXN), "--producers", str(TXN_PRODUCERS),
                 "--max-pending", str(TXN_PENDING))

    def run(label: str, mode: str, *flags: str, fsync: bool = True, loop: str = "uvloop") -> PerfRun:
        # Every run on a broker of its own, started on an empty data dir: a broker that has
        # already stored the previous run's gigabytes writes slower on this VM (see the notes),
        # and the run that came second on a shared broker would pay for it.
        with broker_on(loop if fsync else "nofsync", fsync=fsync, loop=loop) as broker:
            return perf(broker, label, mode, *flags, duration=duration, warmup=warmup)

    # The max-rate runs of every configuration take turns, `repeats` rounds, and each figure
    # takes its best round: the machine's other load comes and goes, and it should not decide
    # a ratio by landing on one side of it.
    rounds = [[run("plain publish, max rate", "produce"),
               run("100 per txn, max rate", "txn", *txn_flags, "--no-visibility"),
               run("plain publish, max rate, broker on asyncio", "produce", loop="asyncio"),
               run("plain publish, max rate, no fsync", "produce", fsync=False)]
              for _ in range(repeats)]
    plain, txn, on_asyncio, no_fsync = (max(runs, key=lambda r: r.result["msgs_per_s"]) for runs in zip(*rounds))
    plain_half = run("plain publish, half rate", "produce", "--rate", f"{plain.result['msgs_per_s'] / 2:.0f}")
    txn_half = run("100 per txn, half rate", "txn", *txn_flags, "--rate", f"{txn.result['msgs_per_s'] / 2:.0f}")

    figures = {
        "publish_msgs_per_s": plain.result["msgs_per_s"],
        "txn_vs_plain_throughput_100": txn.result["msgs_per_s"] / plain.result["msgs_per_s"],
        "end_txn_p99_ms": p99(txn_half, "end-txn"),
        "commit_to_visible_p99_ms": p99(txn_half, "commit-to-visible"),
        "publish_p99_ms": p99(plain_half, "publish"),
        "uvloop_vs_asyncio": plain.result["msgs_per_s"] / on_asyncio.result["msgs_per_s"],
        "publish_msgs_per_s_no_fsync": no_fsync.result["msgs_per_s"],
        "end_txn_p99_ms_at_max": p99(txn, "end-txn"),
        "txn_vs_plain_cpu_100": sum(r[0].cpu_per_message for r in rounds) / sum(r[1].cpu_per_message for r in rounds),
    }
    NOTES = notes([run for runs in rounds for run in runs] + [plain_half, txn_half], txn_half, repeats)
    if record:
        PLOT.parent.mkdir(exist_ok=True)
        curves = {f"publish at {plain_half.result['msgs_per_s']:.0f} msg/s":
                  plain_half.result["latency_ms"]["publish"]["curve"],
                  f"end-txn at {txn_half.result['txns_per_s']:.0f} txn/s":
                  txn_half.result["latency_ms"]["end-txn"]["curve"],
                  "commit-to-visible (same run)": txn_half.result["latency_ms"]["commit-to-visible"]["curve"]}
        plot_percentiles(curves, PLOT, "pyengine broker on loopback, fsync on (latency by percentile)")
    return figures


def notes(runs: list[PerfRun], txn_half: PerfRun, repeats: int) -> str:
    rows = ["| run | msg/s | broker CPU us/msg | load generator CPU us/msg |", "|---|---|---|---|"]
    rows += [run.cpu_line() for run in runs]
    latency = txn_half.result["latency_ms"]
    early = txn_half.result.get("visible_before_commit_ack", 0)
    detail = (f"In the half-rate transactional run {txn_half.result['transactions']} transactions: end-txn "
              f"p50 {latency['end-txn']['p50']} ms, p99 {latency['end-txn']['p99']} ms; commit-to-visible p50 "
              f"{latency['commit-to-visible']['p50']} ms, p99 {latency['commit-to-visible']['p99']} ms "
              f"({early} transactions visible before their commit's response arrived).")
    return (NOTES_HEAD.strip() + f"\n\nEvery run of this recording ({repeats} round(s) of the max-rate runs; "
            "the figures take each configuration's best round) and where the CPU goes, per message: CPU seconds "
            "of the broker over the whole `pyengine perf` run and of the load generator from the start of its "
            "load, divided by the messages of warm-up and measured period:\n\n" + "\n".join(rows) + "\n\n" + detail
            + "\n\n![latency percentiles](figures/broker_latency.png)\n")


NOTES = NOTES_HEAD
