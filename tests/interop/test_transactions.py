"""Transactions driven by pyengine.client while OFFICIAL pulsar-client consumers watch, against a
`pyengine serve` subprocess: what a transaction writes is seen only after its commit, never
after an abort or a timeout; plain messages behind an open transaction wait for it; and
consume-transform-produce is exactly-once across a broker kill -9 and restart.

The official client's calls block, so its consumers run in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pulsar
import pytest

from pyengine.client import Client
from pyengine.errors import PulsarError
from tests.interop.conftest import QUIET
from pyengine.testing import ServeProcess


class Watcher:
    """An official-client consumer that collects what it receives in a thread."""

    def __init__(self, url: str, topic: str, subscription: str) -> None:
        self.client = pulsar.Client(url, logger=QUIET)
        self.consumer = self.client.subscribe(topic, subscription,
                                              initial_position=pulsar.InitialPosition.Earliest)
        self.seen: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                message = self.consumer.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            self.seen.append(message.data())
            self.consumer.acknowledge(message)

    async def wait_for(self, count: int, timeout: float = 10) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while len(self.seen) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return list(self.seen)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()


@pytest.fixture
def crashing_broker(tmp_path: Path) -> Iterator[ServeProcess]:
    """A broker of its own: the test kills it."""
    process = ServeProcess(tmp_path / "data", "--num-coordinators", "2", "--dedup")
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
async def watchers(broker: ServeProcess) -> AsyncIterator[list[Watcher]]:
    opened: list[Watcher] = []
    try:
        yield opened
    finally:
        for watcher in opened:
            await asyncio.to_thread(watcher.close)


async def _watch(broker: ServeProcess, watchers: list[Watcher], topic: str) -> Watcher:
    watcher = await asyncio.to_thread(Watcher, broker.url, topic, "official-watcher")
    watchers.append(watcher)
    return watcher


async def test_committed_messages_appear_only_after_commit(broker, watchers):
    topic = "persistent://public/default/interop-commit"
    watcher = await _watch(broker, watchers, topic)
    async with Client(broker.url) as client:
        producer = await client.create_producer(topic)
        txn = await client.new_transaction()
        for i in range(10):
            await producer.send(b"txn-%d" % i, txn=txn)
        await asyncio.sleep(0.5)
        assert watcher.seen == []
        await txn.commit()
        assert await watcher.wait_for(10) == [b"txn-%d" % i for i in range(10)]


async def test_aborted_and_timed_out_messages_never_appear(broker, watchers):
    topic = "persistent://public/default/interop-abort"
    watcher = await _watch(broker, watchers, topic)
    async with Client(broker.url) as client:
        producer = await client.create_producer(topic)
        aborted = await client.new_transaction()
        await producer.send(b"aborted", txn=aborted)
        await aborted.abort()
        # Long enough for the send's durable writes on a slow CI disk; the two messages below
        # become visible only once the coordinator has aborted it at its timeout.
        timed_out = await client.new_transaction(timeout_ms=1500)
        await producer.send(b"timed-out", txn=timed_out)
        committed = await client.new_transaction()
        await producer.send(b"committed", txn=committed)
        await committed.commit()
        await producer.send(b"plain")
        assert await watcher.wait_for(2) == [b"committed", b"plain"]
        await asyncio.sleep(0.3)
        assert watcher.seen == [b"committed", b"plain"]


async def test_plain_messages_behind_an_open_transaction_wait_for_it(broker, watchers):
    topic = "persistent://public/default/interop-behind"
    watcher = await _watch(broker, watchers, topic)
    async with Client(broker.url) as client:
        producer = await client.create_producer(topic)
        await producer.send(b"before")
        assert await watcher.wait_for(1) == [b"before"]
        txn = await client.new_transaction()
        await producer.send(b"in-txn", txn=txn)
        await producer.send(b"plain-after")
        await asyncio.sleep(0.5)
        assert watcher.seen == [b"before"]            # held back by the open transaction
        await txn.commit()
        assert await watcher.wait_for(3) == [b"before", b"in-txn", b"plain-after"]


MESSAGES = 10_000
PER_TXN = 100
RECEIVE_TIMEOUT = 10.0      # seconds without input: the broker is away, this transaction fails
DEADLINE = 180.0


def _fill_input(url: str, topic: str) -> None:
    client = pulsar.Client(url, logger=QUIET)
    try:
        # Batches of 150: most transactions of 100 end inside a batch, and the next one goes on in it.
        producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=150,
                                          batching_max_publish_delay_ms=1000, block_if_queue_full=True)
        results: list[pulsar.Result] = []
        for i in range(MESSAGES):
            producer.send_async(b"%d" % i, lambda result, _id: results.append(result))
        producer.flush()
        assert results == [pulsar.Result.Ok] * MESSAGES
    finally:
        client.close()


def _read_output(url: str, topic: str) -> list[bytes]:
    client = pulsar.Client(url, logger=QUIET)
    try:
        consumer = client.subscribe(topic, "verify", initial_position=pulsar.InitialPosition.Earliest)
        seen = []
        with contextlib.suppress(pulsar.Timeout):
            while True:
                message = consumer.receive(timeout_millis=3000)
                seen.append(message.data())
                consumer.acknowledge(message)
        return seen
    finally:
        client.close()


async def test_consume_transform_produce_is_exactly_once_across_a_kill(crashing_broker: ServeProcess) -> None:
    """10k inputs, 100 per transaction, the broker SIGKILLed in the middle of a transaction and
    restarted on the same data dir and ports; the driver aborts what failed, has the unacked
    inputs redelivered and goes on. The official client then finds every transformed input
    exactly once in the output."""
    broker = crashing_broker
    source, sink = "persistent://public/default/eo-in", "persistent://public/default/eo-out"
    await asyncio.to_thread(_fill_input, broker.url, source)
    failures = 0

    async def kill_and_restart() -> None:
        await asyncio.to_thread(broker.kill)
        await asyncio.sleep(0.3)
        await asyncio.to_thread(broker.start)

    deadline = time.monotonic() + DEADLINE
    async with Client(broker.url, operation_timeout_seconds=20) as client:
        consumer = await client.subscribe(source, "transform", consumer_type="exclusive",
                                          initial_position="earliest")
        producer = await client.create_producer(sink, producer_name="transformer", batching_enabled=True,
                                                batching_max_messages=PER_TXN, batching_max_publish_delay_ms=5)
        committed = 0
        killer: asyncio.Task[None] | None = None
        while committed < MESSAGES:
            assert time.monotonic() < deadline, f"{committed} transformed, {failures} failed transactions"
            sends: list[asyncio.Future] = []
            txn = None
            try:
                txn = await client.new_transaction(timeout_ms=30_000)
                last = None
                while len(sends) < min(PER_TXN, MESSAGES - committed):
                    message = await consumer.receive(timeout=RECEIVE_TIMEOUT)
                    sends.append(asyncio.ensure_future(producer.send(b"out-" + message.data, txn=txn)))
                    last = message
                    if killer is None and committed >= MESSAGES // 3 and len(sends) == PER_TXN // 2:
                        await asyncio.gather(*sends)   # sends of this transaction are stored when it dies
                        killer = asyncio.ensure_future(kill_and_restart())
                await asyncio.gather(*sends)
                assert last is not None
                await consumer.acknowledge_cumulative(last, txn=txn)
                await txn.commit()
                committed += len(sends)
            except (PulsarError, TimeoutError):
                failures += 1
                await asyncio.gather(*sends, return_exceptions=True)
                if txn is not None:
                    with contextlib.suppress(PulsarError, TimeoutError):
                        await txn.abort()
                await consumer.redeliver_unacknowledged_messages()
        assert killer is not None
        await killer                                      # the broker was killed and came back
        # The transaction open at the kill either failed (aborted, inputs redelivered) or, when
        # the producer's resends and the acks reached the restarted broker, committed: both are
        # fine as long as the output below holds every input once.

    output = await asyncio.to_thread(_read_output, broker.url, sink)
    counts = Counter(output)
    assert [m for m, n in counts.items() if n > 1] == []
    assert set(counts) == {b"out-%d" % i for i in range(MESSAGES)}
