"""Scalable topics (PIP-468): how fast a split reaches clients, how fast a dead controller
leader is replaced, and what the metadata store sustains.

* `split_ms_p50` / `split_ms_max`: an admin REST split (`POST /admin/v2/scalable/.../split/{id}`)
  until a client's DAG watch (SCALABLE_TOPIC_LOOKUP session over TCP) holds the new layout; one
  broker in-process on uvloop, metadata on a loopback etcd, LMDB with fsync on.
* `leader_failover_ms`: three `pyengine serve` processes on one etcd; the controller leader is
  killed with SIGKILL; time until a surviving broker's admin API reports itself as the leader.
  The brokers run with `--scalable-session-ttl FAILOVER_TTL_S`: the dead leader's lock lives
  until its etcd lease expires, so the figure is bounded below by that ttl.
* `metadata_ops_per_s_lmdb` / `_etcd`: records written (create) and read back (get) and updated
  (CAS put) per second by CONCURRENCY tasks on one store; each record counts three operations.

Run: `python -m benchmarks scalable [--quick] [--json] [--record]`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import uvloop

from pyengine.testing import ServeProcess
from benchmarks.figures import Figure
from pyengine.admin import AdminServer
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.client import Client
from pyengine.metadata import open_metadata_store
from pyengine.metadata.etcd_server import LocalEtcd
from pyengine.protocol.server import ProtocolServer
from pyengine.storage import StorageEnvironment

TOPIC = "topic://public/default/bench"
FAILOVER_TTL_S = 2.0
CONCURRENCY = 16


def measured(name: str, description: str, unit: str) -> Figure:
    return Figure(name, description, lambda m, name=name: m[name], unit)


FIGURES = [
    measured("split_ms_p50", "admin REST split -> the new layout at a client's DAG watch (etcd metadata, "
             "median)", "ms"),
    measured("split_ms_max", "the slowest split of split_ms_p50's rounds", "ms"),
    measured("leader_failover_ms", f"SIGKILL of the controller leader (one of 3 serve processes on etcd) -> a "
             f"survivor reports itself leader; session ttl {FAILOVER_TTL_S:g} s bounds it below", "ms"),
    measured("metadata_ops_per_s_lmdb", f"create + get + CAS put per second, {CONCURRENCY} tasks, LMDB store "
             "(fsync on)", "ops/s"),
    measured("metadata_ops_per_s_etcd", f"create + get + CAS put per second, {CONCURRENCY} tasks, loopback etcd",
             "ops/s"),
]

NOTES = f"""
A split on the controller: a read of the layout and of any pending operation, the operation
record, the subscription discovery, the two child topics with their cursors (each with its owner
record, one create-if-absent), the parent's termination, the CAS of the layout, the deletion of
the operation record — about nine metadata-store round trips — then one watch notification to the
broker serving the client's DAG session, which re-reads the layout, the leader lock and the
segments' owners (cached) and pushes the DAG. On etcd every write is a raft commit (fsync) of the loopback
single-node cluster.

Failover: the survivors' elections watch the leader lock; it disappears when the dead broker's
etcd lease expires ({FAILOVER_TTL_S:g} s after its last keep-alive, which is up to ttl/3 before
the kill), then one survivor creates the lock and restores the controller state from etcd.
"""


# --- metadata operations ------------------------------------------------------------------

async def metadata_ops(store, records: int) -> float:
    """Operations per second: each task creates, reads and CAS-updates its share of records."""
    async def worker(index: int) -> None:
        for i in range(index, records, CONCURRENCY):
            path = f"/bench/{i:08d}"
            created = await store.create(path, b"v" * 64)
            got = await store.get(path)
            assert got is not None
            await store.put(path, b"w" * 64, created.version)

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(CONCURRENCY)))
    return 3 * records / (time.perf_counter() - started)


async def measure_metadata(etcd: LocalEtcd, records: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="pyengine-meta-") as tmp:
        env = StorageEnvironment(Path(tmp), sync=True)
        store = await open_metadata_store("lmdb", env)
        try:
            lmdb_rate = await metadata_ops(store, records)
        finally:
            await store.close()
            await env.drain()
            env.close()
    store = await open_metadata_store(etcd.url, etcd_root=f"/bench-{time.time_ns()}")
    try:
        etcd_rate = await metadata_ops(store, records)
    finally:
        await store.close()
    return {"metadata_ops_per_s_lmdb": lmdb_rate, "metadata_ops_per_s_etcd": etcd_rate}


# --- split to visible -----------------------------------------------------------------------

async def measure_split(etcd: LocalEtcd, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="pyengine-split-") as tmp:
        service = BrokerService(BrokerConfig(data_dir=Path(tmp), metadata_store=etcd.url))
        await service.start()
        server = ProtocolServer(service, "127.0.0.1", 0)
        await server.start()
        service.service_url = f"pulsar://127.0.0.1:{server.port}"
        admin = AdminServer(service, port=0)
        await admin.start()
        try:
            async with aiohttp.ClientSession() as http, \
                    Client(service.service_url, operation_timeout_seconds=30) as client:
                url = f"{admin.url}/admin/v2/scalable/public/default/bench"
                async with http.put(f"{url}?numInitialSegments=1") as reply:
                    assert reply.status == 204, await reply.text()
                watch = await client.watch_scalable_topic(TOPIC)
                timings = []
                for _ in range(rounds):
                    layout = watch.layout
                    widest = max(layout.active_segments, key=lambda s: s.hash_range.end - s.hash_range.start)
                    started = time.perf_counter()
                    async with http.post(f"{url}/split/{widest.segment_id}") as reply:
                        assert reply.status == 204, await reply.text()
                    await watch.wait_newer_than(layout.epoch, 30)
                    timings.append((time.perf_counter() - started) * 1000)
                await watch.close()
        finally:
            await admin.stop()
            await server.stop()
            await service.close()
    return {"split_ms_p50": statistics.median(timings), "split_ms_max": max(timings)}


# --- leader failover ------------------------------------------------------------------------

def http_json(method: str, url: str) -> tuple[int, object]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            raw = reply.read()
            return reply.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        return error.code, None
    except OSError:
        return 0, None


def measure_failover(etcd: LocalEtcd, rounds: int, root: Path) -> dict[str, float]:
    timings = []
    for round_ in range(rounds):
        brokers = [ServeProcess(root / f"r{round_}-b{i}", "--metadata-store", etcd.url, "--broker-id", f"b{i}",
                                "--scalable-session-ttl", str(FAILOVER_TTL_S), fsync=False) for i in range(3)]
        try:
            for broker in brokers:
                broker.start()
            topic = f"failover{round_}"
            base = f"/admin/v2/scalable/public/default/{topic}"
            status, _ = http_json("PUT", brokers[0].http_url + base)
            assert status == 204, status
            leader = None
            for broker in brokers:          # every broker gets a controller (and stands for election)
                status, stats = http_json("GET", broker.http_url + base + "/stats")
                assert status == 200, status
                leader = stats["controllerBrokerUrl"]
            dead = next(b for b in brokers if b.url == leader)
            survivors = [b for b in brokers if b is not dead]
            dead.process.send_signal(signal.SIGKILL)
            started = time.perf_counter()
            dead.process.wait()
            new_leader = None
            while new_leader is None and time.perf_counter() - started < 60:
                for broker in survivors:
                    status, stats = http_json("GET", broker.http_url + base + "/stats")
                    if status == 200 and stats["controllerBrokerUrl"] == broker.url:
                        new_leader = broker
                        break
                else:
                    time.sleep(0.01)
            assert new_leader is not None, "no survivor took over within 60 s"
            timings.append((time.perf_counter() - started) * 1000)
        finally:
            for broker in brokers:
                broker.stop()
    return {"leader_failover_ms": statistics.median(timings)}


def measure(quick: bool, record: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="pyengine-bench-scalable-") as tmp:
        etcd = LocalEtcd(Path(tmp) / "etcd").start()
        try:
            figures = uvloop.run(measure_metadata(etcd, 500 if quick else 3000))
            figures.update(uvloop.run(measure_split(etcd, 10 if quick else 40)))
            figures.update(measure_failover(etcd, 1 if quick else 3, Path(tmp)))
        finally:
            etcd.stop()
    return figures


if __name__ == "__main__":
    print(measure(os.environ.get("PYENGINE_BENCH_QUICK") == "1", False))
