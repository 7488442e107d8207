"""The soak of `bench_soak` on scalable topics: v5 (metadata-driven, PIP-473) transactions over
`topic://` topics whose segments are split and merged while the broker is killed and restarted.

One run: `pyengine serve` as a child process (fsync on, de-duplication on, the LMDB metadata
store); TOPICS scalable topics of 2 segments. WORKERS clients (and one more behind the END_TXN
delay proxy) each loop: a v5 transaction (`new_transaction(scalable=True)`), unique values
sent with random keys to 2 topics through `ScalableProducer`s (each value lands in the segment
its key hashes to; a send refused by a sealed segment is sent again to its child), then commit,
abort, or wait past the timeout and commit (it must fail). A second nemesis splits a random
active segment or merges two adjacent ones through the admin REST API every 1-4 s, so sends,
commits and the broker's kills meet splits and merges half done (the controller's operation
record is completed or rolled back after a restart). Readers r1, r2 (non-durable) and c1 (a
durable exclusive consumer acking each message) read every segment (`segment://` topics, the
logs): each segment is a topic of the history, and a send's topic is the segment its receipt
names (or, for a send of unknown outcome, the segment where a reader found it). The history
checker of `bench_soak` then looks for the same anomalies per segment.

Run through the runner: `python -m benchmarks soak_scalable [--quick] [--json] [--record]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.bench_soak import (
    INFO, OK, PROXY_TXN_TIMEOUTS_MS, TXN_TIMEOUT_MS, EndTxnDelayProxy, FIGURES as SOAK_FIGURES, Soak, figures_of,
    measured)
from benchmarks.history import SEND, History, Op, Result, check
from benchmarks.transfer import Transfer, finish
from pyengine.client import Client, MessageId
from pyengine.testing import ServeProcess

TOPICS = 2
INITIAL_SEGMENTS = 2
WORKERS = 4
MAX_ACTIVE_SEGMENTS = 6            # per topic: past it the layout nemesis merges rather than splits
LAYOUT_PAUSE_S = (1.0, 4.0)

FIGURES = [*SOAK_FIGURES, measured("layout_changes", "splits and merges the admin API accepted during the run")]

NOTES = """
Setup: `pyengine serve` (fsync on, de-duplication on, LMDB metadata store) as a child process;
2 scalable topics of 2 segments at first; 4 workers + 1 worker behind the END_TXN delay proxy
running v5 transactions over both topics with random keys; readers r1 / r2 (non-durable) and
c1 (durable, acking) on every segment, started as segments appear. Nemeses: SIGKILL + restart
of the broker (as `soak`), and a split of a random active segment or a merge of two adjacent
ones every 1-4 s (merges once a topic has 6 active segments). Transactions time out after 4 s
(the proxied worker's after 2 or 10 s). Full run: 180 s of load; `--quick`: 40 s. Each segment
is a topic of the history (`benchmarks/history.py`); a value's topic is the segment its
receipt names. Exactly-once processing as in `soak` (`benchmarks/transfer.py`), on two more
scalable topics, split and merged as well: the processors consume with a QueueConsumer and
send keyed outputs, in v5 transactions.
"""


def http_call(base: str, method: str, path: str) -> tuple[int, Any]:
    request = urllib.request.Request(base + path, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            body = reply.read()
            return reply.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


class ScalableSoak(Soak):
    """`Soak` with scalable producers, a reader per segment and a layout nemesis."""

    def __init__(self, broker: ServeProcess, history: History, topics: list[str], rnd: random.Random) -> None:
        super().__init__(broker, history, topics, rnd)
        self.segment_of: dict[str, str] = {}       # value -> the segment:// topic its receipt names
        self.segments: dict[str, set[str]] = {t: set() for t in topics}
        self.readers: dict[str, asyncio.Task[None]] = {}
        self.layout_changes = 0
        self.layout_topics = list(topics)          # split and merged: these and the transfer's

    def admin_path(self, topic: str) -> str:
        return "/admin/v2/scalable/" + topic.removeprefix("topic://")

    async def admin(self, method: str, path: str) -> tuple[int, Any]:
        try:
            return await asyncio.to_thread(http_call, self.broker.http_url, method, path)
        except OSError as exc:                     # the broker is down
            return 0, repr(exc)

    async def create_topics(self) -> None:
        for topic in self.layout_topics:
            status, body = await self.admin("PUT", f"{self.admin_path(topic)}?numInitialSegments={INITIAL_SEGMENTS}")
            if status != 204:
                raise RuntimeError(f"creating {topic}: HTTP {status} {body}")

    async def layout(self, topic: str) -> dict[str, Any] | None:
        status, body = await self.admin("GET", self.admin_path(topic))
        return body if status == 200 else None

    def segment_topic(self, topic: str, segment: dict[str, Any]) -> str:
        hash_range = segment["hashRange"]
        return (f"segment://{topic.removeprefix('topic://')}/"
                f"{hash_range['start']:04x}-{hash_range['end']:04x}-{segment['segmentId']}")

    async def watch_segments(self, url: str) -> None:
        """Start r1, r2 and c1 on every segment as it appears, until the drain begins (the
        layouts stop changing before it)."""
        while True:
            for topic in self.topics:
                layout = await self.layout(topic)
                for segment in (layout or {}).get("segments", {}).values():
                    name = self.segment_topic(topic, segment)
                    if name in self.segments[topic]:
                        continue
                    self.segments[topic].add(name)
                    for reader in ("r1", "r2", "c1"):
                        self.readers[f"{reader} {name}"] = asyncio.ensure_future(
                            self.reader(reader, url, name, reader == "c1"))
            if self.drain_now.is_set():
                return
            await asyncio.sleep(0.5)

    async def layout_nemesis(self) -> None:
        rnd = self.rnd
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), rnd.uniform(*LAYOUT_PAUSE_S))
                return
            # The first change goes to a topic the workers write (not the transfer's): a short run
            # on a loaded machine made one or two changes, at times none where values were stored.
            topic = rnd.choice(self.layout_topics if self.layout_changes else self.topics)
            layout = await self.layout(topic)
            if layout is None:
                continue
            active = sorted((s for s in layout["segments"].values() if s["state"] == "ACTIVE"),
                            key=lambda s: s["hashRange"]["start"])
            if len(active) >= MAX_ACTIVE_SEGMENTS or (len(active) > 1 and rnd.random() < 0.4):
                i = rnd.randrange(len(active) - 1)
                what, path = "merge", f"/merge/{active[i]['segmentId']}/{active[i + 1]['segmentId']}"
            else:
                what, path = "split", f"/split/{rnd.choice(active)['segmentId']}"
            self.history.invoke("layout", what, topic=topic)
            status, body = await self.admin("POST", self.admin_path(topic) + path)
            if status in (200, 204):
                self.layout_changes += 1
                self.history.complete("layout", what, OK, topic=topic)
            else:
                self.errors[f"layout {what}: HTTP {status}"] = self.errors.get(f"layout {what}: HTTP {status}", 0) + 1
                self.history.complete("layout", what, INFO, topic=topic, error=str(body)[:200])

    sends_per_topic = (1, 4)

    async def new_transaction(self, client: Client, timeout_ms: int) -> Any:
        return await client.new_transaction(timeout_ms, scalable=True)

    async def send_value(self, producer: Any, topic: str, value: str, txn: Any) -> MessageId:
        """With a random key (its segment: where its hash falls); the segment is remembered."""
        segment_id, message_id = await producer.send(value.encode(), key=f"k{self.rnd.randrange(1000)}", txn=txn)
        self.segment_of[value] = self.segment_name(topic, segment_id)
        return message_id

    async def segment_topics(self, topic: str) -> list[str]:
        layout = await self.layout(topic)
        if layout is None:
            raise RuntimeError(f"no layout of {topic}")
        return [self.segment_topic(topic, segment) for segment in layout["segments"].values()]

    def segment_name(self, topic: str, segment_id: int) -> str:
        """The segment:// topic of `segment_id`: the watcher names every segment it has seen (a
        receipt's segment was created before the send, so it is known by the drain at the latest)."""
        return f"{topic}#{segment_id}"

    def per_segment_history(self) -> list[Op]:
        """The history with each send's topic the segment it was stored in: its receipt's, or for
        a send of unknown outcome the segment a reader read it in (none: the scalable topic, which
        no reader reads)."""
        by_id = {}
        for topic, names in self.segments.items():
            for name in names:
                by_id[f"{topic}#{name.rsplit('-', 1)[1]}"] = name
        read_in = {op.value: op.topic for op in self.history.ops if op.f == "read"}
        ops = []
        for op in self.history.ops:
            if op.f == SEND:
                segment = by_id.get(self.segment_of.get(op.value, ""), read_in.get(op.value, op.topic))
                op = replace(op, topic=segment)
            ops.append(op)
        return ops


async def soak(duration_s: float, data_dir: Path, *, seed: int | None = None,
               kill_pause: tuple[float, float] = (3.0, 8.0), verbose: bool = True) -> tuple[Result, dict[str, Any]]:
    """One run of `duration_s` seconds of load: the checker's result and the run's counts."""
    seed = random.randrange(2**32) if seed is None else seed
    rnd = random.Random(seed)
    started = time.monotonic()
    broker = await asyncio.to_thread(ServeProcess(data_dir / "data", "--dedup").start)
    proxy = await EndTxnDelayProxy(broker.port, rnd).start()
    topics = [f"topic://public/default/soak-{seed:08x}-{i}" for i in range(TOPICS)]
    s = ScalableSoak(broker, History(), topics, rnd)
    source, sink = (f"topic://public/default/transfer-{seed:08x}-{end}" for end in ("in", "out"))
    s.layout_topics += [source, sink]
    transfer = Transfer(broker.url, source, sink, scalable=True, rnd=rnd, stop=s.stop, drain_now=s.drain_now,
                        error=s.error)
    transferred = None
    try:
        await s.create_topics()
        watcher = asyncio.ensure_future(s.watch_segments(broker.url))
        transfer_tasks = transfer.tasks()
        workers = [asyncio.ensure_future(s.worker(f"w{i}", broker.url, (TXN_TIMEOUT_MS,))) for i in range(WORKERS)]
        workers.append(asyncio.ensure_future(
            s.worker("wp", f"pulsar://127.0.0.1:{proxy.port}", PROXY_TXN_TIMEOUTS_MS, proxy)))
        nemeses = [asyncio.ensure_future(s.nemesis(kill_pause)), asyncio.ensure_future(s.layout_nemesis())]
        await asyncio.sleep(duration_s)
        s.stop.set()
        await asyncio.gather(*nemeses)
        if broker.process is None:
            await asyncio.to_thread(broker.start)
        done, pending = await asyncio.wait(workers, timeout=60)
        for task in pending:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await proxy.close()
        await asyncio.sleep(max(PROXY_TXN_TIMEOUTS_MS) / 1000 + 1)
        await asyncio.sleep(1.0)                      # the watcher's last look at the layouts
        s.drain_now.set()
        await watcher
        results = await asyncio.gather(*s.readers.values(), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                s.error("reader task", r)
        transferred = await finish(transfer, transfer_tasks, lambda: s.segment_topics(sink))
        if transferred.count:
            info_stats = await s.admin("GET", s.admin_path(source) + "/stats")
            print(f"soak_scalable: the transfer's source: {info_stats}", file=sys.stderr)
    finally:
        await proxy.close()
        if broker.process is not None:
            await asyncio.to_thread(broker.stop)
    ops = s.per_segment_history()
    result = check(ops)
    info = {"seed": seed, "kills": s.kills, "ops": len(ops), "layout_changes": s.layout_changes,
            "segments": sum(len(v) for v in s.segments.values()), "seconds": round(time.monotonic() - started, 1),
            "errors": dict(sorted(s.errors.items())), "history": ops, "transfer": transferred}
    if verbose:
        print(f"soak_scalable seed={seed}: {result.summary()}", file=sys.stderr)
        print(f"soak_scalable: exactly-once transfer: {transferred.summary()}", file=sys.stderr)
        print(f"soak_scalable: kills={s.kills} layout changes={s.layout_changes} segments={info['segments']} "
              f"ops={len(ops)} in {info['seconds']} s; errors: {info['errors']}", file=sys.stderr)
        for key, example in sorted(s.error_examples.items()):
            print(f"soak_scalable:   {key}: {example}", file=sys.stderr)
    return result, info


def measure(quick: bool, record: bool) -> dict[str, float]:
    duration, pause = (40.0, (3.0, 8.0)) if quick else (180.0, (4.0, 10.0))
    with tempfile.TemporaryDirectory(prefix="pyengine-soak-scalable-") as tmp:
        result, info = asyncio.run(soak(duration, Path(tmp), kill_pause=pause))
    return {**figures_of(result, info), "layout_changes": info["layout_changes"]}
