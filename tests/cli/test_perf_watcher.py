"""`pyengine.cli.perf_watcher`: the commit-to-visible consumer of `pyengine perf txn` as a
process of its own, against a `pyengine serve` child process; its arguments; how the load
generator pairs its reports, which come later than the messages they time."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator

import pytest

from pyengine.cli.perf import Latency, Visibility
from pyengine.cli.perf_watcher import READY, TXN_TAG, WatcherFailed, WatcherProcess, main
from pyengine.client import Client
from pyengine.testing import ServeProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[ServeProcess]:
    with ServeProcess(tmp_path_factory.mktemp("watcher-broker") / "data", fsync=False) as process:
        yield process


async def test_the_watcher_reports_each_transactions_first_message_once(broker):
    topic = "persistent://public/default/watched"
    watcher = await WatcherProcess.start(broker.url, topic, "watcher", 10.0)
    try:
        async with Client(broker.url) as client:
            producer = await client.create_producer(topic, batching_enabled=True)
            before = time.monotonic()
            for number in (7, 8):
                txn = await client.new_transaction(timeout_ms=10_000)
                for k in range(3):
                    producer.send_async(TXN_TAG.pack(number) + bytes([k]), txn=txn)
                await txn.commit()
            producer.send_async(b"short", txn=None)         # not a perf payload: not reported
            producer.send_async(b"\xff" * 8, txn=None)      # any 8 bytes, even READY's: not reported
            await producer.flush()
        reported: list[tuple[int, float]] = []
        deadline = time.monotonic() + 10
        while len(reported) < 2 and time.monotonic() < deadline:
            reported += await watcher.records(timeout=0.2)
        assert [number for number, _ in reported] == [7, 8]
        assert all(before <= at <= time.monotonic() for _, at in reported)     # the same clock
        assert await watcher.records(timeout=0.3) == []                       # once per transaction
    finally:
        cpu = await watcher.stop()
    assert cpu > 0
    # It unsubscribed: no subscription is left to hold the topic's backlog.
    with urllib.request.urlopen(f"{broker.http_url}/admin/v2/persistent/public/default/watched/subscriptions") as r:
        assert json.load(r) == []


async def test_a_watcher_that_cannot_subscribe_is_a_clear_failure(unused_tcp_port):
    with pytest.raises(WatcherFailed, match=r"ended \(exit 1\): perf_watcher: .*127\.0\.0\.1"):
        await WatcherProcess.start(f"pulsar://127.0.0.1:{unused_tcp_port}", "persistent://public/default/t",
                                   "watcher", 1.0)


async def test_a_watcher_that_dies_fails_the_read(broker):
    watcher = await WatcherProcess.start(broker.url, "persistent://public/default/dies", "watcher", 10.0)
    watcher._process.kill()
    with pytest.raises(WatcherFailed, match="ended"):
        for _ in range(50):
            await watcher.records(timeout=0.1)
    await watcher.stop()


@pytest.mark.parametrize("argv, message", [
    ([], "usage:"),
    (["pulsar://127.0.0.1:6650", "t", "s"], "usage:"),
    (["pulsar://127.0.0.1:6650", "t", "s", "soon"], "must be a positive number, not 'soon'"),
    (["pulsar://127.0.0.1:6650", "t", "s", "0"], "must be a positive number, not '0'"),
    (["pulsar://127.0.0.1:6650", "t", "s", "nan"], "must be a positive number, not 'nan'"),
])
def test_malformed_arguments_exit_2_with_the_reason(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_report_that_comes_after_the_commit_but_timed_before_it_counts_as_early():
    """The watcher's reports reach the load generator later than the messages reached the
    watcher: a message seen before the commit was acknowledged may be reported after."""
    latency = Latency("v")
    visibility = Visibility(latency)
    visibility.on_commit(1, 10.0)
    visibility.on_message(1, 9.5)          # arrived before the acknowledgement
    visibility.on_commit(2, 10.0)
    visibility.on_message(2, 10.25)
    assert (visibility.measured, visibility.early) == (2, 1)
    latency.roll()
    assert latency.summary()["max"] == pytest.approx(250, rel=0.01)      # ms; the early one counts 0


def test_the_ready_record_cannot_be_a_transaction_number():
    from pyengine.cli import perf

    assert READY == TXN_TAG.unpack(b"\xff" * 8)[0]
    assert READY >= perf.TXN_NUMBERS_END          # perf numbers its transactions below this
