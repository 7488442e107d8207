"""Metadata-driven transactions (PIP-473, v5) against the v4 design, in the same run.

* `end_txn_v5_over_v4_64_participants`: END_TXN latency (median, the coordinator's answer) of a
  transaction that wrote one message to each of 64 topics: v5 on 64 segment:// topics (one CAS
  of the header) over v4 on 64 persistent:// topics (decision record, 64 markers, end record).
  One broker in-process, LMDB with fsync on.
* `end_txn_sealed_segment_ms`: a v5 transaction writes to a segment, the segment is sealed (as
  a split or merge does), then COMMIT: time until the coordinator answered AND the sealed
  segment's buffer materialised the commit (its read horizon reached the sealed end). v4
  cannot do this at all: its marker append fails on the sealed ledger and END_TXN retries
  until the ~30 s client timeout.
* `cold_start_v5_over_v4`: coordinator start after 100k finished transactions and 100 open
  ones. v5: the history was run for real through the v5 coordinator and collected by its GC
  (--quick: 20k txns; after GC the store holds the same records whatever the count);
  start = open the metadata store on the data dir, start the coordinator, run its first
  timeout and GC sweeps (the index scans). v4: replay of a log holding the same history (the
  log written directly in its format, as the coordinator's recovery-scale test does).
* `commit_to_visible_p99_ms` (LMDB metadata store) / `commit_to_visible_p99_ms_etcd` (a
  loopback etcd): a consumer on a segment:// topic; one transactional message per round; time
  from COMMIT until the consumer received it (the decision travels by header watch).

Run: `python -m benchmarks v5 [--quick] [--json] [--record]`.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.figures import Figure, Target
from pyengine.broker import Broker
from pyengine.metadata.etcd_server import LocalEtcd
from pyengine.metadata.lmdb_store import LmdbMetadataStore
from pyengine.storage import StorageEnvironment
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_coordinator import MetadataTransactionCoordinator
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID
from pyengine.transaction.coordinator.service import TransactionCoordinatorService

PARTICIPANTS = 64
FINISHED = 100_000
OPEN = 100
V4_COORDINATORS = 16


def measured(name: str, description: str, unit: str, target: Target | None = None) -> Figure:
    return Figure(name, description, lambda m, name=name: m[name], unit, target)


FIGURES = [
    measured("end_txn_v5_over_v4_64_participants", f"END_TXN latency, {PARTICIPANTS} participant topics: v5 "
             "(one header CAS) / v4 (markers on every participant), median, same run", "x", Target("<=", 0.25)),
    measured("end_txn_sealed_segment_ms", "COMMIT of a v5 txn whose segment was sealed mid-txn, until answered "
             "and materialised on the sealed segment (median)", "ms", Target("<=", 50)),
    measured("cold_start_v5_over_v4", f"coordinator start after {FINISHED // 1000}k finished (v5: collected) and "
             f"{OPEN} open txns: v5 (index scans) / v4 (log replay)", "x", Target("<=", 0.1)),
    measured("commit_to_visible_p99_ms", "v5 COMMIT -> the message at a consumer of the segment, LMDB metadata "
             "store, p99", "ms"),
    measured("commit_to_visible_p99_ms_etcd", "v5 COMMIT -> the message at a consumer of the segment, loopback "
             "etcd metadata store, p99", "ms"),
]

NOTES = """
End-txn: v5's END_TXN is one CAS of one header (one LMDB commit with fsync; the coordinator
remembers the headers it created, so it needs no read first); v4 writes
the decision to its log, appends a marker to each of the 64 topics (one shared group commit,
64 appends in Python) and writes the end record before answering. Both run the participants'
work on the same event loop; v5's participants materialise after the answer (header watch),
which is the design: the answer does not wait for them.

Cold start: v5 has nothing to replay — after GC the store holds the 100 open headers and the id
allocator; start is bounded by two index range queries. v4 rereads every log record of its 16
coordinators. The v5 history (new + end + GC of each txn; 100k, 20k with --quick) is run through
the coordinator with fsync off to keep the suite short; the start itself is timed with fsync on,
on the same data dir. The v4 log always holds 100k finished txns.

Commit-to-visible: COMMIT's answer, then the header-watch notification (LMDB: dispatched after
the write is durable; etcd: the watch stream), the buffer's materialisation (the read horizon
moves), the dispatcher, the consumer's queue. The etcd figure adds etcd's raft commit and watch
latency. Medians are a few ms (printed by the run); the p99 is set by the shared machine's
stalls (fsync, other processes), on both stores alike.
"""


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def p99_ms(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


# --- end txn with 64 participants ---------------------------------------------------------

async def end_txn_latencies(rounds: int) -> tuple[list[float], list[float]]:
    """(v5, v4) END_TXN latencies, rounds interleaved in one broker so both see the same
    machine (a shared disk's fsync time drifts during a run)."""
    samples: dict[int, list[float]] = {4: [], 5: []}
    with tempfile.TemporaryDirectory(prefix="pyengine-v5-") as tmp:
        async with Broker.embedded(tmp, sync=True) as broker:
            producers = {
                5: [await broker.create_producer(f"segment://public/default/p{i}/0000-ffff-0")
                    for i in range(PARTICIPANTS)],
                4: [await broker.create_producer(f"persistent://public/default/p{i}") for i in range(PARTICIPANTS)],
            }
            for _ in range(rounds):
                for version in (4, 5):
                    txn = await broker.new_transaction(timeout_ms=600_000, version=version)
                    await asyncio.gather(*(p.send(b"x", txn=txn) for p in producers[version]))
                    started = time.perf_counter()
                    await broker.service.coordinator.end_transaction(txn.txn_id, TxnAction.COMMIT)
                    samples[version].append(time.perf_counter() - started)
                    await wait_materialised(broker.service)    # v5's participants catch up
    return samples[5], samples[4]


async def wait_materialised(service) -> None:
    while any(getattr(t.buffer, "_materialising", None) for t in service.topics.values()) \
            or await service.v5.store.list_prefix("/txn-op/", limit=1):
        await asyncio.sleep(0.001)


# --- sealed segment -----------------------------------------------------------------------

async def sealed_commit(rounds: int) -> list[float]:
    samples = []
    with tempfile.TemporaryDirectory(prefix="pyengine-v5-") as tmp:
        async with Broker.embedded(tmp, sync=True) as broker:
            for i in range(rounds):
                name = f"segment://public/default/sealed/0000-ffff-{i}"
                producer = await broker.create_producer(name)
                topic = broker.service.topics[name]
                txn = await broker.new_transaction(timeout_ms=600_000, version=5)
                await producer.send(b"x", txn=txn)
                sealed_at = await topic.ledger.terminate()          # split / merge seals it
                started = time.perf_counter()
                await broker.service.coordinator.end_transaction(txn.txn_id, TxnAction.COMMIT)
                while topic.buffer.max_read_position() != sealed_at:
                    await asyncio.sleep(0.0005)
                samples.append(time.perf_counter() - started)
    return samples


# --- cold start ---------------------------------------------------------------------------

async def v5_history(data_dir: Path, finished: int) -> None:
    env = StorageEnvironment(data_dir, sync=False)
    store = await LmdbMetadataStore(env).start()
    clock = {"now": 1_700_000_000_000}
    coordinator = MetadataTransactionCoordinator(store, clock=lambda: clock["now"], retention_ms=0)
    await coordinator.start(sweep=False)

    async def one(i: int) -> None:
        txn = await coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
        await coordinator.end_transaction(txn, TxnAction.COMMIT if i % 3 else TxnAction.ABORT)

    for start in range(0, finished, 1000):
        await asyncio.gather(*(one(i) for i in range(start, min(finished, start + 1000))))
    clock["now"] += 1
    assert await coordinator.collect_garbage() == finished
    for _ in range(OPEN):
        await coordinator.new_transaction(V5_COORDINATOR_ID, 600_000)
    await coordinator.close()
    await store.close()
    await env.drain()
    env.close()


async def v5_start(data_dir: Path) -> float:
    env = StorageEnvironment(data_dir, sync=True)
    started = time.perf_counter()
    store = await LmdbMetadataStore(env).start()
    coordinator = MetadataTransactionCoordinator(store)
    await coordinator.start(sweep=False)
    await coordinator.sweep_timeouts()
    await coordinator.collect_garbage()
    elapsed = time.perf_counter() - started
    open_headers = len(await store.list_prefix("/txn/"))
    assert open_headers == OPEN, open_headers
    await coordinator.close()
    await store.close()
    env.close()
    return elapsed


class _NoParticipants:
    async def end_txn_on_partition(self, *args, **kwargs) -> None:
        return None

    async def end_txn_on_subscription(self, *args) -> None:
        return None


async def v4_start(data_dir: Path) -> float:
    from tests.transaction.coordinator.test_recovery_scale import write_log

    env = StorageEnvironment(data_dir, sync=True)
    service = TransactionCoordinatorService(env, _NoParticipants(), num_coordinators=V4_COORDINATORS)
    await service.start()
    await service.close()
    write_log(env, int(time.time() * 1000))
    env.close()
    env = StorageEnvironment(data_dir, sync=True)
    service = TransactionCoordinatorService(env, _NoParticipants(), num_coordinators=V4_COORDINATORS)
    started = time.perf_counter()
    await service.start()
    elapsed = time.perf_counter() - started
    assert service.stats().open == OPEN
    await service.close()
    env.close()
    return elapsed


async def cold_start(history: int, rounds: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="pyengine-v5-") as tmp:
        await v5_history(Path(tmp) / "v5", history)
        v5 = min([await v5_start(Path(tmp) / "v5") for _ in range(rounds)])
        v4 = min([await v4_start(Path(tmp) / f"v4-{i}") for i in range(rounds)])
    return v5, v4


# --- commit to visible --------------------------------------------------------------------

async def commit_to_visible(rounds: int, metadata_store: str) -> list[float]:
    name = "segment://public/default/visible/0000-ffff-0"
    samples = []
    with tempfile.TemporaryDirectory(prefix="pyengine-v5-") as tmp:
        async with Broker.embedded(tmp, sync=True, metadata_store=metadata_store) as broker:
            producer = await broker.create_producer(name)
            consumer = await broker.subscribe(name, "s", initial_position="earliest")
            for _ in range(rounds + 1):
                txn = await broker.new_transaction(timeout_ms=600_000, version=5)
                await producer.send(b"x", txn=txn)
                started = time.perf_counter()
                await txn.commit()
                message = await consumer.receive(timeout=10)
                samples.append(time.perf_counter() - started)
                await consumer.acknowledge(message)
    return samples[1:]          # the first round warms the dispatch path up


def measure(quick: bool, record: bool) -> dict[str, float]:
    rounds = 20 if quick else 60
    visible_rounds = 100 if quick else 500
    history = 20_000 if quick else FINISHED

    async def run() -> dict[str, float]:
        v5, v4 = await end_txn_latencies(rounds)
        sealed = await sealed_commit(rounds)
        v5_cold, v4_cold = await cold_start(history, 3 if quick else 5)
        lmdb = await commit_to_visible(visible_rounds, "lmdb")
        with tempfile.TemporaryDirectory(prefix="pyengine-etcd-") as tmp:
            etcd = LocalEtcd(Path(tmp) / "etcd")
            etcd.start()
            try:
                on_etcd = await commit_to_visible(visible_rounds, etcd.url)
            finally:
                etcd.stop()
        print(f"end txn 64 participants: v5 {median_ms(v5):.2f} ms, v4 {median_ms(v4):.2f} ms; "
              f"cold start v5 {v5_cold * 1000:.1f} ms, v4 {v4_cold * 1000:.1f} ms; commit-to-visible p50 "
              f"lmdb {median_ms(lmdb):.2f} ms, etcd {median_ms(on_etcd):.2f} ms")
        return {
            "end_txn_v5_over_v4_64_participants": median_ms(v5) / median_ms(v4),
            "end_txn_sealed_segment_ms": median_ms(sealed),
            "cold_start_v5_over_v4": v5_cold / v4_cold,
            "commit_to_visible_p99_ms": p99_ms(lmdb),
            "commit_to_visible_p99_ms_etcd": p99_ms(on_etcd),
        }

    return asyncio.run(run())
