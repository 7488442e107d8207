"""Transaction keys (pip-transaction-key-fencing): how soon a restarted task's predecessor stops
holding its topics back.

Setup of every round, on a fresh topic: task 1 (a `pyengine.client` with transaction key K)
opens a transaction, sends one message in it and hangs. Another client then commits a
transaction of `QUEUED` messages to the same topic: they are committed but invisible, queued
behind task 1's open transaction (the read horizon stops at its first entry). A consumer waits
on the topic.

* `fence_to_visible_ms`: task 2 starts — a new client with key K connects (TCP, lookup of the
  key's coordinator, TC_CLIENT_CONNECT taking the next epoch, which aborts task 1's
  transaction) — until the consumer has received all queued messages. Median of the rounds;
  `fence_to_visible_max_ms` is the slowest round.
* `timeout_to_visible_ms`: the same setup without fencing (task 2 has no key): the queued
  messages become visible when task 1's transaction times out, `TXN_TIMEOUT_MS` after it began,
  measured from the same moment (task 2 connecting).

Broker and clients in one process on uvloop over loopback TCP, LMDB with fsync on.
Run: `python -m benchmarks txnkeys [--quick] [--json] [--record]`.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import uvloop

from benchmarks.figures import Figure, Target
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.client import Client
from pyengine.protocol.server import ProtocolServer

QUEUED = 100                     # committed messages held back behind the hung transaction
TXN_TIMEOUT_MS = 2_000           # task 1's transaction timeout (the wait without fencing)
KEY = "bench-task"


def measured(name: str, description: str, unit: str, op: str | None = None, value: float | None = None) -> Figure:
    return Figure(name, description, lambda m, name=name: m[name], unit,
                  Target(op, value) if op is not None and value is not None else None)


FIGURES = [
    measured("fence_to_visible_ms", "task 2 (same transaction key) connects -> the committed messages queued "
             "behind task 1's open transaction are all at a consumer (median of the rounds)", "ms", "<=", 100),
    measured("fence_to_visible_max_ms", "the slowest round of fence_to_visible_ms", "ms"),
    measured("timeout_to_visible_ms", f"same setup without fencing: task 2 has no key, the messages show when "
             f"task 1's transaction times out ({TXN_TIMEOUT_MS} ms after it began)", "ms"),
    measured("fence_speedup", "timeout_to_visible_ms / fence_to_visible_ms", "x"),
]

NOTES = f"""
Each round: task 1 (transaction key `{KEY}`) opens a transaction with a {TXN_TIMEOUT_MS} ms timeout,
sends one message in it and hangs; another client commits {QUEUED} messages to the same topic in one
transaction (invisible behind task 1's entry); a consumer is subscribed. The clock starts when
task 2 starts. With fencing, task 2 is a new client with the same key: its TC_CLIENT_CONNECT
takes the next epoch, which aborts task 1's transaction (ABORTING durable, the abort marker
written, the read horizon moved) before it is answered; the figure ends when the consumer has
all {QUEUED} messages. Without fencing the same messages wait for the coordinator's timeout of
task 1's transaction. Broker and clients share one process (uvloop, loopback TCP, fsync on),
so the figure includes the new client's TCP connect and lookups as a restarted task pays them.
"""


async def _setup(url: str, topic: str, keyed: bool):
    """Task 1 hung with an open txn, `QUEUED` committed messages behind it, a consumer waiting."""
    task1 = Client(url, operation_timeout_seconds=30, transaction_key=KEY if keyed else None)
    hung = await task1.new_transaction(timeout_ms=TXN_TIMEOUT_MS)
    began = time.perf_counter()
    producer1 = await task1.create_producer(topic)
    await producer1.send(b"hung", txn=hung)
    other = Client(url, operation_timeout_seconds=30)
    producer = await other.create_producer(topic, batching_enabled=True)
    txn = await other.new_transaction()
    await asyncio.gather(*(producer.send(b"queued-%d" % i, txn=txn) for i in range(QUEUED)))
    await txn.commit()
    consumer = await other.subscribe(topic, "watch", initial_position="earliest")
    return task1, other, consumer, began


async def _all_visible(consumer) -> None:
    for _ in range(QUEUED):
        message = await consumer.receive(timeout=30)
        assert message.data.startswith(b"queued-"), message.data


async def fence_round(url: str, topic: str) -> float:
    task1, other, consumer, _ = await _setup(url, topic, keyed=True)
    try:
        started = time.perf_counter()
        async with Client(url, operation_timeout_seconds=30, transaction_key=KEY) as task2:
            await task2.connect_transaction_key()
            await _all_visible(consumer)
            elapsed = (time.perf_counter() - started) * 1000
    finally:
        await task1.close()
        await other.close()
    return elapsed


async def timeout_round(url: str, topic: str) -> tuple[float, float]:
    """(ms from task 2 connecting to visible, ms from task 1's txn start to visible)."""
    task1, other, consumer, began = await _setup(url, topic, keyed=False)
    try:
        started = time.perf_counter()
        async with Client(url, operation_timeout_seconds=30) as task2:
            await task2.get_topic_partitions(topic)          # connected, as task 2 is above
            await _all_visible(consumer)
            done = time.perf_counter()
    finally:
        await task1.close()
        await other.close()
    return (done - started) * 1000, (done - began) * 1000


async def _measure(quick: bool) -> dict[str, float]:
    rounds, timeout_rounds = (5, 1) if quick else (20, 3)
    with tempfile.TemporaryDirectory() as tmp:
        service = BrokerService(BrokerConfig(data_dir=Path(tmp) / "data", sync=True, num_coordinators=4))
        await service.start()
        server = ProtocolServer(service, "127.0.0.1", 0)
        await server.start()
        url = f"pulsar://127.0.0.1:{server.port}"
        try:
            await fence_round(url, "persistent://public/default/warmup")
            fences = [await fence_round(url, f"persistent://public/default/fence-{i}") for i in range(rounds)]
            timeouts = [await timeout_round(url, f"persistent://public/default/timeout-{i}")
                        for i in range(timeout_rounds)]
        finally:
            await server.stop()
            await service.close()
    fence = statistics.median(fences)
    timeout = statistics.median(t for t, _ in timeouts)
    print(f"fence rounds (ms): {', '.join(f'{f:.1f}' for f in fences)}")
    print(f"timeout rounds (ms from task 2 / from txn start): "
          f"{', '.join(f'{t:.0f}/{s:.0f}' for t, s in timeouts)}")
    return {"fence_to_visible_ms": fence, "fence_to_visible_max_ms": max(fences),
            "timeout_to_visible_ms": timeout, "fence_speedup": timeout / fence}


def measure(quick: bool, record: bool = False) -> dict[str, float]:
    return uvloop.run(_measure(quick))
