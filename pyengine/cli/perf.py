"""`pyengine perf produce|consume|txn`: a load generator with latency histograms, like `pulsar-perf`.

    pyengine perf produce --url pulsar://127.0.0.1:6650 --rate 50000 --size 1024 --duration 30
    pyengine perf consume persistent://public/default/perf --duration 30
    pyengine perf txn --messages-per-txn 100 --producers 4 --duration 30 --json --plot txn.png

`produce` publishes at `--rate` messages per second (0: as fast as the broker takes them, with at
most `--max-pending` in flight per producer) and records each message's publish latency (send to
receipt). `consume` receives and records end-to-end latency (publish time to receipt, ms
precision as Pulsar's publish time). `txn` publishes `--messages-per-txn` messages per
transaction on each of `--producers` concurrent producers and commits; it records the publish
latency, the end-txn latency (commit request to its response) and commit-to-visible: a
consumer on the topic measures from the moment the commit was acknowledged to the moment the
transaction's first message arrives (zero if it arrived before the acknowledgement).

Latencies go into HDR histograms (1 us .. 1 h, 3 significant digits). Once per second a
progress line goes to stderr (rate, MB/s, p99 of that second). At the end a summary with
p50/p95/p99/p99.9/max goes to stdout; `--json` adds one JSON object as the last line and
`--plot FILE.png` draws the latency percentile distribution. A failed send, commit or
connection makes the exit status 1 (the figures of such a run are not trustworthy).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import math
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop
from hdrh.histogram import HdrHistogram

from pyengine.cli.gc_tuning import settled_garbage_collector
from pyengine.cli.malloc_tuning import keep_freed_heap
from pyengine.cli.perf_watcher import TXN_TAG, WatcherFailed, WatcherProcess   # txn mode: payloads start with their txn's number
from pyengine.client import Client
from pyengine.client.url import parse_service_url
from pyengine.errors import InvalidTopicNameError, PulsarError
from pyengine.naming import TopicName

DEFAULT_URL = "pulsar://127.0.0.1:6650"
DEFAULT_TOPIC = "persistent://public/default/perf"
TXN_NUMBERS_END = 1 << 62                 # txn mode numbers its transactions below this
HIGHEST_US = 3_600_000_000                  # one hour: anything slower is clamped to it
SIGNIFICANT_DIGITS = 3
SUMMARY_PERCENTILES = (50.0, 95.0, 99.0, 99.9)
# The percentile curve kept in the JSON (and plotted): dense towards the tail.
CURVE_PERCENTILES = (0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 97.5, 99.0, 99.5, 99.75, 99.9, 99.95, 99.99, 100.0)


# --- latency histograms ----------------------------------------------------------------------

class Latency:
    """One latency series: an HDR histogram of the whole run. A value is first counted in a
    dict of the current progress interval, rounded down to the HDR bucket it falls in (what
    the histogram would keep of it anyway); the dict is folded into the histogram once per
    progress line. That costs a fraction of `record_value` per message, which matters at
    100k messages per second."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.total = HdrHistogram(1, HIGHEST_US, SIGNIFICANT_DIGITS)
        self._counts: dict[int, int] = {}
        # Values below 2 * 10^digits rounded up to a power of two are kept exactly; above, the
        # lowest `bit_length - _EXACT_BITS` bits are dropped (HDR's sub-bucket resolution).
        self._exact_bits = (2 * 10 ** SIGNIFICANT_DIGITS - 1).bit_length()

    def record(self, seconds: float) -> None:
        micros = int(seconds * 1e6)
        if micros < 1:
            micros = 1
        elif micros > HIGHEST_US:
            micros = HIGHEST_US
        shift = micros.bit_length() - self._exact_bits
        if shift > 0:
            micros = micros >> shift << shift
        counts = self._counts
        counts[micros] = counts.get(micros, 0) + 1

    def roll(self) -> tuple[int, float]:
        """Fold the current interval into the total histogram; return the interval's count
        and p99 in ms (from the interval's own counts: cheaper than asking a histogram)."""
        counts, self._counts = self._counts, {}
        record = self.total.record_value
        for micros, count in counts.items():
            record(micros, count)
        return sum(counts.values()), _percentile_of_counts(counts, 99.0) / 1000

    def discard(self) -> None:
        """Forget everything recorded so far (the end of the warm-up)."""
        self._counts.clear()
        self.total.reset()

    def percentiles_ms(self, percentiles: tuple[float, ...]) -> dict[float, float]:
        """Percentiles of the whole run (one pass over the histogram)."""
        values = self.total.get_percentile_to_value_dict(list(percentiles))
        return {p: values[p] / 1000 for p in percentiles}

    def summary(self) -> dict[str, Any]:
        count = self.total.get_total_count()
        out: dict[str, Any] = {"count": count}
        curve = self.percentiles_ms(CURVE_PERCENTILES + SUMMARY_PERCENTILES) if count else {}
        for p in SUMMARY_PERCENTILES:
            out[f"p{p:g}"] = round(curve[p], 3) if count else None
        out["max"] = round(self.total.get_max_value() / 1000, 3) if count else None
        out["curve"] = [[p, round(curve[p], 3)] for p in CURVE_PERCENTILES] if count else []
        return out


def _percentile_of_counts(counts: dict[int, int], percentile: float) -> float:
    total = sum(counts.values())
    if not total:
        return 0.0
    target = max(1, math.ceil(total * percentile / 100))
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= target:
            return value
    return max(counts)


# --- plots ----------------------------------------------------------------------------------

def plot_percentiles(series: dict[str, list[list[float]]], path: Path, title: str) -> None:
    """A latency-by-percentile plot (x: percentile on Gil Tene's 1/(1-p) scale, y: ms) of
    curves of [percentile, ms] pairs, as `summary()["curve"]` holds them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ticks = [0.0, 90.0, 99.0, 99.9, 99.99]
    plotted = False
    for label, curve in series.items():
        points = [(p, ms) for p, ms in curve if p < 100.0]
        if not points:
            continue
        ax.plot([1 / (1 - p / 100) for p, _ in points], [ms for _, ms in points], marker="o", markersize=3,
                label=label)
        plotted = True
    ax.set_xscale("log")
    ax.set_xticks([1 / (1 - p / 100) for p in ticks])
    ax.set_xticklabels([f"{p:g}%" for p in ticks])
    ax.set_xlabel("percentile")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if plotted:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# --- arguments ------------------------------------------------------------------------------

def _number(kind: Callable[[str], float], minimum: float, what: str, maximum: float = math.inf,
            unit: str = "") -> Callable[[str], Any]:
    """An argparse type: a number of `kind` from `minimum` to `maximum` (in `unit`, said when a
    value is above it)."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, not {text!r}") from None
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, not {text!r}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected at most {maximum}{unit}, not {text!r}")
        return value
    return parse


# The largest message a Pulsar broker can be configured to take (its maxMessageSize is at most
# 2^31 - 1 less the 10 KiB frame padding); perf does not chunk, so a larger one is never sent.
MAX_MESSAGE_SIZE = 2**31 - 1 - 10 * 1024
MAX_BATCH_DELAY_MS = 3_600_000     # an hour: a batch held longer outlasts any sensible run

positive_int = _number(int, 1, "a whole number >= 1")
non_negative_int = _number(int, 0, "a whole number >= 0")
non_negative_float = _number(float, 0, "a number >= 0")
# The client's connection timeout is whole milliseconds, at least 1: a shorter operation
# timeout made it 0 and the client refused it with a traceback.
operation_timeout = _number(float, 0.001, "a number of seconds >= 0.001")
message_size = _number(int, 1, "a whole number >= 1", MAX_MESSAGE_SIZE,
                       " bytes (the largest message a Pulsar broker can take)")
batch_delay_ms = _number(int, 0, "a whole number >= 0", MAX_BATCH_DELAY_MS, " ms (an hour)")
# Upper bounds that keep a run a run (found by an audit: a rate past the float resolution of
# the pacer's clock spun for ever, a queue of 10^20 pending sends never let the loop tick, and
# protobuf refused the largest integers with a traceback).
MAX_RATE = 1e9                      # messages per second
MAX_PENDING = 1_000_000             # messages in flight per producer
MAX_SECONDS = 31 * 24 * 3600.0      # a month of --duration or --warmup
rate = _number(float, 0, "a number >= 0", MAX_RATE, " messages per second")
max_pending = _number(int, 1, "a whole number >= 1", MAX_PENDING, " messages")
# A transaction's sends go out together (unpaced): as many as may be in flight, at most.
messages_per_txn = _number(int, 1, "a whole number >= 1", MAX_PENDING, " messages")
seconds = _number(float, 0, "a number >= 0", MAX_SECONDS, " seconds (a month)")
receiver_queue_size = _number(int, 1, "a whole number >= 1", 2**31 - 1, " messages")
txn_timeout_ms = _number(int, 1, "a whole number >= 1", 2**63 - 1, " ms")


def _url(text: str) -> str:
    try:
        parse_service_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _topic(text: str) -> str:
    try:
        return str(TopicName.parse(text))
    except (InvalidTopicNameError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"invalid topic {text!r}: {exc}") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    perf = sub.add_parser("perf", help="load generator with latency histograms (like pulsar-perf)",
                          description=__doc__.split("\n\n")[0])
    modes = perf.add_subparsers(dest="mode", required=True, metavar="MODE")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("topic", nargs="?", type=_topic, default=DEFAULT_TOPIC,
                        help=f"the topic (default {DEFAULT_TOPIC})")
    common.add_argument("--url", type=_url, default=DEFAULT_URL, help=f"broker service URL (default {DEFAULT_URL})")
    common.add_argument("--duration", type=seconds, default=10.0,
                        help="seconds to run after the warm-up (0: until --messages or Ctrl-C)")
    common.add_argument("--messages", type=non_negative_int, default=0,
                        help="send this many messages after the warm-up, then stop (0: no limit; txn mode "
                             "rounds up to whole transactions)")
    common.add_argument("--warmup", type=seconds, default=0.0,
                        help="seconds run before measuring starts (not in the figures)")
    common.add_argument("--operation-timeout", type=operation_timeout, default=30.0,
                        help="seconds for connecting, lookups and each request")
    common.add_argument("--json", action="store_true", help="print the figures as one JSON object last")
    common.add_argument("--plot", type=Path, metavar="FILE.png", help="draw the latency percentiles into FILE.png")
    common.add_argument("--quiet", action="store_true", help="no progress line on stderr")

    sending = argparse.ArgumentParser(add_help=False)
    sending.add_argument("--rate", type=rate, default=0.0,
                         help="messages per second over all producers (0: as fast as possible)")
    sending.add_argument("--size", type=message_size, default=1024,
                         help=f"message size in bytes (at most {MAX_MESSAGE_SIZE})")
    sending.add_argument("--producers", type=positive_int, default=1, help="concurrent producers")
    sending.add_argument("--batching", action=argparse.BooleanOptionalAction, default=True,
                         help="batch messages into entries (default on)")
    sending.add_argument("--batch-delay-ms", type=batch_delay_ms, default=1,
                         help="longest wait of an open batch (pulsar-perf's -b, default 1 ms, at most an hour)")
    sending.add_argument("--batch-max-messages", type=positive_int, default=1000, help="messages per batch at most")
    sending.add_argument("--max-pending", type=max_pending, default=1000,
                         help="messages in flight per producer at most")

    produce = modes.add_parser("produce", parents=[common, sending], help="publish and measure publish latency")
    produce.set_defaults(measure=measure_produce)

    consume = modes.add_parser("consume", parents=[common], help="consume and measure end-to-end latency")
    consume.add_argument("--subscription", default="perf-sub", help="subscription name")
    consume.add_argument("--consumers", type=positive_int, default=1,
                         help="consumers on the subscription (more than one: a Shared subscription)")
    consume.add_argument("--initial-position", choices=("latest", "earliest"), default="latest")
    consume.add_argument("--receiver-queue-size", type=receiver_queue_size, default=1000)
    consume.add_argument("--txn", action="store_true",
                         help="acknowledge in transactions (pulsar-perf consume's -txn) and measure end-txn")
    consume.add_argument("--messages-per-txn", type=messages_per_txn, default=50,
                         help="with --txn: acknowledgements per transaction")
    consume.add_argument("--txn-timeout-ms", type=txn_timeout_ms, default=60_000, help="with --txn: transaction timeout")
    consume.set_defaults(measure=measure_consume)

    txn = modes.add_parser("txn", parents=[common, sending],
                           help="publish in transactions and measure end-txn and commit-to-visible latency")
    txn.add_argument("--messages-per-txn", type=messages_per_txn, default=100, help="messages per transaction")
    txn.add_argument("--txn-timeout-ms", type=txn_timeout_ms, default=60_000, help="transaction timeout")
    txn.add_argument("--no-visibility", dest="visibility", action="store_false",
                     help="do not run the consumer that measures commit-to-visible")
    txn.set_defaults(measure=measure_txn)


# --- the run --------------------------------------------------------------------------------

class PerfFailure(Exception):
    """The run could not be carried out or an operation of it failed."""


class PerfInterrupted(Exception):
    """SIGINT or SIGTERM before the run started (while connecting or setting up)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class Run:
    """What every mode shares: the clock, the stop condition, counters and the progress line."""

    args: argparse.Namespace
    latencies: dict[str, Latency]
    messages: int = 0                        # counted after the warm-up
    all_messages: int = 0                    # warm-up included
    sent_measured: int = 0                   # messages sent after the warm-up
    bytes: int = 0
    errors: int = 0
    first_error: BaseException | None = None
    measuring: bool = False
    clocked: bool = False                    # the clock runs: connecting and setting up are over
    started: float = 0.0                     # when measuring started (loop time)
    ended: float = 0.0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    on_measuring: list[Callable[[], None]] = field(default_factory=list)   # run when the warm-up ends
    cpu_started: float = 0.0
    cpu_ended: float = 0.0
    _interval_messages: int = 0
    _interval_bytes: int = 0

    def count(self, messages: int, size: int, measured: bool = True) -> None:
        """`messages` settled; `measured`: sent after the warm-up (`may_send` said so while
        measuring). A send of the warm-up is never measured, whenever it settles (found by an
        audit: with --warmup they were counted, and --messages overshot)."""
        self.all_messages += messages
        if self.measuring and measured:
            self.messages += messages
            self.bytes += messages * size
            self._interval_messages += messages
            self._interval_bytes += messages * size
            if self.args.messages and self.messages >= self.args.messages:
                self.stop.set()

    def may_send(self, messages: int = 1) -> bool:
        """Whether the senders may send `messages` more: `--messages` counts the measured
        messages, so once that many are sent after the warm-up, sending stops."""
        if self.stop.is_set():
            return False
        if self.args.messages and self.measuring:
            if self.sent_measured >= self.args.messages:
                return False
            self.sent_measured += messages
        return True

    def failed(self, error: BaseException) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = error

    def elapsed(self) -> float:
        """Seconds measured so far (never 0: a run stopped in its warm-up measured nothing)."""
        if not self.measuring:
            return 1e-9
        end = self.ended or asyncio.get_running_loop().time()
        return max(end - self.started, 1e-9)

    async def clock(self) -> None:
        """The warm-up, then the measured period with a progress line per second."""
        loop = asyncio.get_running_loop()
        self.clocked = True
        self.cpu_started = time.process_time()
        if self.args.warmup:
            with _suppress_timeout():
                await asyncio.wait_for(self.stop.wait(), self.args.warmup)
        for latency in self.latencies.values():
            latency.discard()
        for hook in self.on_measuring:
            hook()
        self.started = last = loop.time()
        self.measuring = True
        deadline = self.started + self.args.duration if self.args.duration else math.inf
        while not self.stop.is_set():
            with _suppress_timeout():
                await asyncio.wait_for(self.stop.wait(), max(0.0, min(last + 1.0, deadline) - loop.time()))
            now = loop.time()
            if now >= deadline:
                self.stop.set()
            self._progress(now - last, now - self.started)
            last = now
        self.ended = loop.time()
        self.cpu_ended = time.process_time()

    def _progress(self, interval: float, elapsed: float) -> None:
        interval = max(interval, 1e-9)
        parts = [f"{self.args.mode} {elapsed:6.1f}s", f"{self._interval_messages / interval:9.0f} msg/s",
                 f"{self._interval_bytes / interval / 1e6:7.2f} MB/s"]
        for latency in self.latencies.values():
            count, p99 = latency.roll()
            if count:
                parts.append(f"{latency.name} p99 {p99:.2f} ms")
        self._interval_messages = self._interval_bytes = 0
        if self.errors:
            parts.append(f"errors {self.errors}")
        if not self.args.quiet:
            print("  ".join(parts), file=sys.stderr, flush=True)

    def result(self, extra: dict[str, Any]) -> dict[str, Any]:
        for latency in self.latencies.values():
            latency.roll()
        elapsed = self.elapsed()
        return {
            "mode": self.args.mode, "topic": self.args.topic, "duration_s": round(elapsed, 3),
            "messages": self.messages, "msgs_per_s": round(self.messages / elapsed, 1),
            "mb_per_s": round(self.bytes / elapsed / 1e6, 3), "errors": self.errors, **extra,
            # The load generator's own cost: CPU seconds from the start of the load (after
            # connecting) to the end of the measured period, and the messages of that span.
            "messages_with_warmup": self.all_messages,
            "cpu_s": round((self.cpu_ended or time.process_time()) - self.cpu_started, 3),
            "latency_ms": {name: latency.summary() for name, latency in self.latencies.items()},
        }


class _suppress_timeout:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> bool:
        return exc_type is TimeoutError


# A sender lets the event loop run after this many sends in a row (the clock, the receipts).
_YIELD_EVERY = 1000


class Pacer:
    """Spaces sends at `rate` per second (0: no spacing); sleeps in steps of >= 1 ms and lets
    the sends that fell behind go out at once, as pulsar-perf's rate limiter does."""

    def __init__(self, rate: float, delay: float = 0.0) -> None:
        self.rate = rate
        self._time = asyncio.get_running_loop().time
        self.start = self._time() + delay
        self.sent = 0
        self._due = 0       # how many sends were due at the last reading of the clock
        self._burst = 0     # sends in a row without a turn of the event loop

    def free_turn(self) -> bool:
        """Whether the next send of a sender loop goes at once (no await: this runs for every
        message): it is due, and it is not the sender's _YIELD_EVERY-th in a row. Else the
        sender awaits `turn`."""
        self._burst += 1
        if self._burst >= _YIELD_EVERY:
            return False
        return not self.rate or self.take()

    async def turn(self, stop: asyncio.Event) -> bool:
        """Wait for the next send's turn after `free_turn` said no: the event loop gets a turn
        (a large window must not keep the clock from ticking), then the send is due. False
        when the run stopped meanwhile."""
        if self._burst >= _YIELD_EVERY:
            self._burst = 0
            await asyncio.sleep(0)
            if not self.rate or self.take():
                return not stop.is_set()
        await self.wait(stop=stop)
        return not stop.is_set()

    def take(self) -> bool:
        """Count one send if it is due now (within 1 ms), without sleeping. The clock is read
        only when the sends due at its last reading are used up: a paced burst costs one
        reading, not one per message (this runs for every message of a paced run)."""
        if self.sent >= self._due:
            self._due = self._due_at(self._time()) if self.rate else self.sent + 1
            if self.sent >= self._due:
                return False
        self.sent += 1
        return True

    def _due_at(self, now: float) -> int:
        """How many sends are due at `now`: send n is once `start + n / rate - now <= 1 ms`, the
        test `wait` makes. The product below can round across that line at an exact boundary
        (1000 / 999999.9999999999 is 0.001, 0.001 * 999999.9999999999 is below 1000): the
        count is moved back onto it, so `take` and `wait` never disagree about a send."""
        due = math.floor((now - self.start + 0.001) * self.rate) + 1
        while self.start + due / self.rate - now <= 0.001:
            due += 1
        while due > 0 and self.start + (due - 1) / self.rate - now > 0.001:
            due -= 1
        return due

    async def wait(self, messages: int = 1, stop: asyncio.Event | None = None) -> None:
        """Count `messages` sends, sleeping first until the last of them is due, or until
        `stop` is set (a slow rate must not hold a run past its end: the caller checks it)."""
        if self.rate:
            delay = self.start + (self.sent + messages - 1) / self.rate - self._time()
            if delay > 0.001:
                if stop is None:
                    await asyncio.sleep(delay)
                else:
                    with _suppress_timeout():
                        await asyncio.wait_for(stop.wait(), delay)
        self.sent += messages


class Window:
    """At most `limit` messages in flight; `acquire` waits for room (receipts release it)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self.room: asyncio.Future[None] | None = None

    async def acquire(self, count: int = 1) -> None:
        """Room for `count` more (a group larger than the limit goes when nothing is in flight)."""
        while self.in_flight and self.in_flight + count > self.limit:
            self.room = asyncio.get_running_loop().create_future()
            await self.room
        self.in_flight += count

    def release(self, count: int = 1) -> None:
        self.in_flight -= count
        room = self.room
        if room is not None and not room.done():
            room.set_result(None)

    async def drained(self) -> None:
        while self.in_flight:
            self.room = asyncio.get_running_loop().create_future()
            await self.room


def _producer_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"batching_enabled": args.batching, "batching_max_publish_delay_ms": args.batch_delay_ms,
            "batching_max_messages": args.batch_max_messages,
            "batching_max_allowed_size_in_bytes": max(128 * 1024, args.size),
            "max_pending_messages": args.max_pending, "block_if_queue_full": True}


async def _publish_loop(run: Run, producer: Any, payload: bytes, rate: float, window: Window) -> None:
    """Send `payload` until the run stops; record each message's publish latency (when its
    own receipt arrives: for a partitioned topic, whose partitions answer independently)."""
    publish = run.latencies["publish"]
    size = len(payload)
    clock = time.perf_counter
    pacer = Pacer(rate)

    def settled(sent: float, measured: bool, future: asyncio.Future[Any]) -> None:
        # Runs once per message: everything inline (the window, the latency, the counters).
        window.in_flight -= 1
        room = window.room
        if room is not None and not room.done():
            room.set_result(None)
        if future.cancelled() or future.exception() is not None:
            run.failed(future.exception() or asyncio.CancelledError())
            return
        if measured:
            record(clock() - sent)
        run.count(1, size, measured)

    record = publish.record
    stop = run.stop
    limit = window.limit
    while True:
        # Awaited only when they have to wait: a coroutine per message costs more than the send.
        if not pacer.free_turn() and not await pacer.turn(stop):
            break
        # Whether it may go and is measured once it is its turn: asked before, a send that
        # waited through the end of the warm-up was not measured (--rate 1 lost a message).
        if not run.may_send():
            break
        measured = run.measuring
        if window.in_flight >= limit:
            await window.acquire()
        else:
            window.in_flight += 1
        try:
            future = producer.send_async(payload)
        except PulsarError as exc:
            window.release()
            run.failed(exc)
            stop.set()
            break
        future.add_done_callback(functools.partial(settled, clock(), measured))
    await window.drained()


async def _publish_in_order(run: Run, producer: Any, payload: bytes, rate: float, limit: int) -> None:
    """`_publish_loop` for a producer on one partition, whose sends are acknowledged in send
    order: no callback per message (asyncio schedules each one through the loop, which costs
    more than the send); a reaper awaits the oldest pending send and then takes every settled
    one from the head at once, each with its own send time and the reap time."""
    publish = run.latencies["publish"]
    record = publish.record
    size = len(payload)
    clock = time.perf_counter
    pacer = Pacer(rate)
    loop = asyncio.get_running_loop()
    pending: collections.deque[tuple[asyncio.Future[Any], float, bool]] = collections.deque()
    stop = run.stop
    sending = True
    room: asyncio.Future[None] | None = None         # the sender waits for the reaper
    more: asyncio.Future[None] | None = None         # the reaper waits for the sender

    async def reap() -> None:
        nonlocal room, more
        while sending or pending:
            if not pending:
                more = loop.create_future()
                await more
                continue
            head = pending[0][0]
            if not head.done():
                await asyncio.wait((head,))
            now = clock()
            settled = warm = 0
            while pending and pending[0][0].done():
                future, sent, measured = pending.popleft()
                if future.cancelled() or future.exception() is not None:
                    run.failed(future.exception() or asyncio.CancelledError())
                    continue
                if measured:
                    record(now - sent)
                    settled += 1
                else:
                    warm += 1
            run.count(settled, size)
            if warm:
                run.count(warm, size, measured=False)
            if room is not None and not room.done():
                room.set_result(None)

    reaper = asyncio.ensure_future(reap())
    try:
        while True:
            if not pacer.free_turn() and not await pacer.turn(stop):
                break
            if not run.may_send():          # (once it is its turn, as in `_publish_loop`)
                break
            measured = run.measuring
            while len(pending) >= limit:
                room = loop.create_future()
                await room
            try:
                future = producer.send_async(payload)
            except PulsarError as exc:
                run.failed(exc)
                stop.set()
                break
            pending.append((future, clock(), measured))
            if more is not None and not more.done():
                more.set_result(None)
    finally:
        sending = False
        if more is not None and not more.done():
            more.set_result(None)
        await reaper


async def _then_stop(run: Run, senders: list[Coroutine[Any, Any, None]]) -> None:
    """Run the senders; when every one has finished (its quota sent and settled, or a
    failure), the run is over."""
    try:
        await asyncio.gather(*senders)
    finally:
        run.stop.set()


async def measure_produce(client: Client, run: Run) -> dict[str, Any]:
    args = run.args
    payload = b"x" * args.size
    producers = [await client.create_producer(args.topic, **_producer_options(args)) for _ in range(args.producers)]
    rate = args.rate / len(producers)
    if len(await client.get_topic_partitions(args.topic)) == 1:
        loops = [_publish_in_order(run, p, payload, rate, args.max_pending) for p in producers]
    else:
        loops = [_publish_loop(run, p, payload, rate, Window(args.max_pending)) for p in producers]
    await asyncio.gather(run.clock(), _then_stop(run, loops))
    for producer in producers:
        await producer.close()
    return {"producers": args.producers, "batching": args.batching, "size": args.size, "rate": args.rate}


async def measure_consume(client: Client, run: Run) -> dict[str, Any]:
    args = run.args
    end_to_end = run.latencies["end-to-end"]
    end_txn = run.latencies.get("end-txn")
    consumer_type = "shared" if args.consumers > 1 else "exclusive"
    consumers = [await client.subscribe(args.topic, args.subscription, consumer_type=consumer_type,
                                        initial_position=args.initial_position,
                                        receiver_queue_size=args.receiver_queue_size)
                 for _ in range(args.consumers)]
    transactions = 0

    def settled(ack: asyncio.Future[None]) -> None:
        if not ack.cancelled() and ack.exception() is not None:
            run.failed(ack.exception())       # (its transaction's commit aborts and raises it too)

    async def commit(txn: Any, acks: list[asyncio.Future[None]], window: Window) -> None:
        nonlocal transactions
        try:
            await asyncio.wait(acks)          # every acknowledgement answered (commit would wait too)
        finally:
            window.release(len(acks))
        started = time.perf_counter()         # end-txn: the END_TXN round trip alone
        try:
            await txn.commit()
        except (PulsarError, TimeoutError) as exc:
            run.failed(exc)
            return
        assert end_txn is not None
        end_txn.record(time.perf_counter() - started)
        if run.measuring:
            transactions += 1

    async def consume(consumer: Any) -> None:
        # With --txn, as pulsar-perf consume -txn: acknowledgements go out without waiting
        # (acknowledgeAsync), and every `messages_per_txn` one the commit goes on in the
        # background while the next transaction opens at once. Waiting for each commit made
        # the run as slow as a few durable round trips per transaction allow (~1.5k msg/s
        # against ~17k without transactions). The acknowledgements not yet committed are
        # bounded by the receiver queue's size, as a producer's by --max-pending.
        txn, acks = None, []
        window = Window(args.receiver_queue_size)
        committing: set[asyncio.Future[None]] = set()

        def end_current() -> None:
            ending = asyncio.ensure_future(commit(txn, acks, window))
            committing.add(ending)
            ending.add_done_callback(committing.discard)

        while not run.stop.is_set():
            try:
                message = await consumer.receive(timeout=0.2)
            except TimeoutError:
                continue
            # Pulsar's publish time is in ms: end-to-end latency has ms precision.
            end_to_end.record(max(0.0, time.time() - message.publish_time / 1000))
            run.count(1, len(message.data))
            try:
                if not args.txn:
                    await consumer.acknowledge(message)
                    continue
                if txn is None:
                    txn = await client.new_transaction(timeout_ms=args.txn_timeout_ms)
                await window.acquire()
                ack = asyncio.ensure_future(consumer.acknowledge(message, txn=txn))
                ack.add_done_callback(settled)
                acks.append(ack)
                if len(acks) == args.messages_per_txn:
                    end_current()
                    txn, acks = None, []
            except (PulsarError, TimeoutError) as exc:
                run.failed(exc)
        if txn is not None and acks:          # what it acknowledged last is committed too
            end_current()
        if committing:
            await asyncio.wait(committing)

    await asyncio.gather(run.clock(), *(consume(c) for c in consumers))
    for consumer in consumers:
        await consumer.close()
    extra: dict[str, Any] = {"consumers": args.consumers, "subscription": args.subscription}
    if args.txn:
        extra.update(messages_per_txn=args.messages_per_txn, transactions=transactions,
                     txns_per_s=round(transactions / run.elapsed(), 1))
    return extra


class Visibility:
    """Commit-to-visible: when each transaction's commit was acknowledged and when its first
    message reached the consumer; the latency is recorded once both are known. A transaction
    begun in the warm-up is matched but not recorded, as its other figures are not."""

    def __init__(self, latency: Latency) -> None:
        self.latency = latency
        self.committed: dict[int, float] = {}
        self.seen: dict[int, float] = {}
        self.unmeasured: set[int] = set()       # of `committed`: begun in the warm-up
        self.measured = 0
        self.early = 0

    def forget_early(self) -> None:
        self.early = 0

    def on_commit(self, txn_number: int, at: float, measured: bool = True) -> None:
        seen = self.seen.pop(txn_number, None)
        if seen is None:
            self.committed[txn_number] = at
            if not measured:
                self.unmeasured.add(txn_number)
        elif measured:
            self.early += 1             # delivered before the client had the commit's response
            self._record(0.0)

    def on_message(self, txn_number: int, at: float) -> None:
        committed = self.committed.pop(txn_number, None)
        if committed is None:
            if txn_number not in self.seen:
                self.seen[txn_number] = at
        elif txn_number in self.unmeasured:
            self.unmeasured.discard(txn_number)
        elif at < committed:            # it arrived first, and its report came after the commit's
            self.early += 1
            self._record(0.0)
        else:
            self._record(at - committed)

    def _record(self, seconds: float) -> None:
        self.latency.record(seconds)
        self.measured += 1


async def measure_txn(client: Client, run: Run) -> dict[str, Any]:
    args = run.args
    publish, end_txn = run.latencies["publish"], run.latencies["end-txn"]
    visibility = Visibility(run.latencies["commit-to-visible"]) if args.visibility else None
    if visibility is not None:
        run.on_measuring.append(visibility.forget_early)
    clock = time.perf_counter
    filler = b"x" * max(0, args.size - TXN_TAG.size)
    producers = [await client.create_producer(args.topic, **_producer_options(args)) for _ in range(args.producers)]
    watcher = None
    if visibility is not None:
        # The watcher is its own process, as a separate application would be: on the
        # producers' connection, messages would be ordered behind the commit's response, and
        # on their event loop, its decoding of every message would delay the END_TXN answers.
        watcher = await WatcherProcess.start(args.url, args.topic, f"perf-visibility-{time.time_ns():x}",
                                             args.operation_timeout)
    txn_numbers = iter(range(TXN_NUMBERS_END))
    transactions = 0
    producing = len(producers)

    def settled(sent: float, future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            publish.record(clock() - sent)

    async def finish(txn: Any, number: int, futures: list[asyncio.Future[Any]], sent: float | None,
                     size: int, window: Window, measured: bool) -> None:
        # `measured`: the transaction was begun after the warm-up (else nothing of it counts)
        nonlocal transactions
        try:
            # One producer's sends are acknowledged in order: wait for each unsettled one. A
            # burst (`sent`: when it went) takes every send as it is found settled instead of
            # a callback per message; paced sends were timed by their own callbacks.
            now = clock()
            try:
                for future in futures:
                    if not future.done():
                        await asyncio.wait((future,))
                        now = clock()
                    if sent is not None and measured and not future.cancelled() and future.exception() is None:
                        publish.record(now - sent)
            finally:
                window.release(len(futures))     # the sends are settled: no longer pending
            asked = clock()             # end-txn: the END_TXN round trip, sends already stored
            await txn.commit()          # (raises the first failed send, after aborting)
            done = clock()
            acknowledged = time.monotonic()     # the watcher process's clock
        except (PulsarError, TimeoutError) as exc:
            run.failed(exc)
            run.stop.set()
            return
        if measured:
            end_txn.record(done - asked)
        if visibility is not None:
            visibility.on_commit(number, acknowledged, measured)
        if run.measuring:
            transactions += measured
        run.count(len(futures), size, measured)

    async def transact(producer: Any, index: int) -> None:
        """Transactions one after another, as pulsar-perf runs them: a transaction's commit
        is asynchronous and the next transaction opens at once, so several may be committing;
        the producer's messages in flight are bounded by `--max-pending` (pulsar-perf's
        maxPendingMessages, blocking when full). A rate spaces every message, not whole
        transactions: producers that sent their transactions as bursts would all burst at
        the same instants (their pacers start together)."""
        nonlocal producing
        per_txn = args.messages_per_txn
        # Paced producers start spread over one transaction's time, as independent clients
        # would be: started together, their commits would all fall on the same instants.
        rate = args.rate / len(producers)
        pacer = Pacer(rate, index * per_txn / rate / len(producers) if rate else 0.0)
        window = Window(args.max_pending)
        committing: set[asyncio.Future[None]] = set()
        try:
            while run.may_send(per_txn):
                measured = run.measuring
                number = next(txn_numbers)
                payload = (TXN_TAG.pack(number) + filler)[:args.size]
                try:
                    txn = await client.new_transaction(timeout_ms=args.txn_timeout_ms)
                except (PulsarError, TimeoutError) as exc:
                    run.failed(exc)
                    run.stop.set()
                    break
                await window.acquire(per_txn)
                if pacer.rate:
                    sent, futures = None, []
                    for _ in range(per_txn):
                        if not pacer.take():
                            await pacer.wait(stop=run.stop)
                        # The run is over: the rest of the transaction is not sent (sent at
                        # once, it went far above --rate and was counted in the figures).
                        if run.stop.is_set():
                            break
                        future = producer.send_async(payload, txn=txn)
                        if measured:
                            future.add_done_callback(functools.partial(settled, clock()))
                        futures.append(future)
                    window.release(per_txn - len(futures))
                    if not futures:         # nothing sent in it: nothing to commit or wait for
                        try:
                            await txn.abort()
                        except (PulsarError, TimeoutError) as exc:
                            run.failed(exc)
                        break
                else:
                    sent = clock()
                    futures = [producer.send_async(payload, txn=txn) for _ in range(per_txn)]
                ending = asyncio.ensure_future(finish(txn, number, futures, sent, len(payload), window, measured))
                committing.add(ending)
                ending.add_done_callback(committing.discard)
            if committing:
                await asyncio.wait(committing)
        finally:
            producing -= 1

    async def watch() -> None:
        assert watcher is not None and visibility is not None
        loop = asyncio.get_running_loop()
        give_up = math.inf
        while True:
            if producing == 0:
                if not visibility.committed:
                    break
                give_up = min(give_up, loop.time() + 5.0)   # committed ones get 5 s to show up
                if loop.time() >= give_up:
                    break
            for number, at in await watcher.records(timeout=0.1):
                visibility.on_message(number, at)

    tasks = [run.clock(), _then_stop(run, [transact(p, i) for i, p in enumerate(producers)])]
    if watcher is not None:
        tasks.append(watch())
    watcher_cpu = 0.0
    try:
        await asyncio.gather(*tasks)
    finally:
        for producer in producers:
            await producer.close()
        if watcher is not None:
            watcher_cpu = await watcher.stop()
    extra: dict[str, Any] = {"producers": args.producers, "batching": args.batching, "size": args.size,
                             "rate": args.rate, "messages_per_txn": args.messages_per_txn,
                             "transactions": transactions,
                             "txns_per_s": round(transactions / run.elapsed(), 1)}
    if visibility is not None:
        extra["watcher_cpu_s"] = round(watcher_cpu, 3)
        extra["committed_not_seen"] = len(visibility.committed)
        extra["visible_before_commit_ack"] = visibility.early
        if visibility.committed:
            run.failed(PerfFailure(f"{len(visibility.committed)} committed transactions never became visible"))
    return extra


LATENCIES = {"produce": ("publish",), "consume": ("end-to-end", "end-txn"),
             "txn": ("publish", "end-txn", "commit-to-visible")}


async def perf(args: argparse.Namespace) -> dict[str, Any]:
    left_out = set()
    if args.mode == "txn" and not args.visibility:
        left_out.add("commit-to-visible")
    if args.mode == "consume" and not args.txn:
        left_out.add("end-txn")
    names = [n for n in LATENCIES[args.mode] if n not in left_out]
    run = Run(args, {name: Latency(name) for name in names})
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    interrupted: list[int] = []

    def stop(signum: int) -> None:
        run.stop.set()
        # Before the clock runs (connecting, creating producers) nothing waits on `stop`: a
        # broker that does not answer would hold the run until the operation timeout.
        if not run.clocked and not interrupted:
            interrupted.append(signum)
            main.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop, signum)
    try:
        with settled_garbage_collector():
            async with Client(args.url, operation_timeout_seconds=args.operation_timeout,
                              connection_timeout_ms=int(args.operation_timeout * 1000)) as client:
                extra = await args.measure(client, run)
    except asyncio.CancelledError:
        if not interrupted:
            raise
        raise PerfInterrupted(interrupted[0]) from None
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    result = run.result(extra)
    if run.first_error is not None:
        result["first_error"] = f"{type(run.first_error).__name__}: {run.first_error}"
    return result


def print_summary(result: dict[str, Any]) -> None:
    print(f"{result['mode']}: {result['messages']} messages in {result['duration_s']:.1f} s: "
          f"{result['msgs_per_s']:.0f} msg/s, {result['mb_per_s']:.2f} MB/s, errors {result['errors']}")
    for name, latency in result["latency_ms"].items():
        if not latency["count"]:
            print(f"  {name:18} no samples")
            continue
        figures = "  ".join(f"p{p:g} {latency[f'p{p:g}']:.3f}" for p in SUMMARY_PERCENTILES)
        print(f"  {name:18} latency ms: {figures}  max {latency['max']:.3f}  ({latency['count']} samples)")
    if "first_error" in result:
        print(f"  first error: {result['first_error']}")


def _usage_error(message: str) -> SystemExit:
    """A flag refused after parsing: said as argparse says it, with its exit status 2."""
    print(f"pyengine perf: error: {message}", file=sys.stderr)
    return SystemExit(2)


def run(args: argparse.Namespace) -> int:
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        raise _usage_error(f"--plot takes a .png file name, not {str(args.plot)!r}")
    if args.plot is not None and not args.plot.resolve().parent.is_dir():
        raise _usage_error(f"--plot: no directory {str(args.plot.resolve().parent)!r}")
    if args.plot is not None and args.plot.exists() and not args.plot.is_file():
        raise _usage_error(f"--plot: {str(args.plot)!r} exists and is not a file")
    if args.mode == "txn" and args.size < TXN_TAG.size and args.visibility:
        raise _usage_error(f"txn --size must be at least {TXN_TAG.size} bytes "
                           "(each message carries its transaction's number) or use --no-visibility")
    keep_freed_heap()
    try:
        result = uvloop.run(perf(args))
    except (PulsarError, TimeoutError, OSError, WatcherFailed) as exc:
        print(f"pyengine perf: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except PerfInterrupted as exc:
        print(f"pyengine perf: interrupted by {signal.Signals(exc.signum).name} before the run started "
              f"(connecting to {args.url} or setting up)", file=sys.stderr)
        return 128 + exc.signum
    except MemoryError:            # a --size within bounds can still be more than this host has
        print(f"pyengine perf: MemoryError: not enough memory for messages of {args.size} bytes",
              file=sys.stderr)
        return 1
    print_summary(result)
    if args.json:                  # first: a plot that cannot be written must not lose it
        sys.stdout.flush()
        print(json.dumps(result, sort_keys=True))
    if args.plot is not None:
        curves = {name: latency["curve"] for name, latency in result["latency_ms"].items()}
        try:
            plot_percentiles(curves, args.plot, f"pyengine perf {args.mode}: {result['msgs_per_s']:.0f} msg/s")
        except OSError as exc:
            print(f"pyengine perf: --plot: cannot write {str(args.plot)!r}: {exc}", file=sys.stderr)
            return 1
    if result["errors"]:
        print(f"pyengine perf: {result['errors']} operations failed; first: {result.get('first_error')}",
              file=sys.stderr)
        return 1
    return 0
