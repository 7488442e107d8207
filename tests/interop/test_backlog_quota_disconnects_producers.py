"""Past a producer_request_hold / producer_exception backlog quota, the periodic check closes the
producers already connected (Pulsar's BacklogQuotaManager.disconnectProducers: CLOSE_PRODUCER),
so they reconnect and are refused while the quota is exceeded. Against `pyengine serve` checking
quotas every 0.1 s, with a 1000-byte topic quota set once 2000 bytes are in the backlog (set
before, the check could close the producer in the middle of the sends filling it):

- the official client (pulsar-client 3.13, C++) under hold keeps a send pending (its reconnects
  are refused with ProducerBlockedQuotaExceededError, which it retries): it fails with Timeout
  at the send timeout, or is stored once the backlog is consumed; under producer_exception the pending send fails with
  ProducerBlockedQuotaExceededException, and the producer sends again after the backlog is
  consumed;
- pyengine.client under hold does the same as the official client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Iterator

import pulsar
import pytest

from pyengine.testing import ServeProcess, serving
from tests.interop.conftest import QUIET

NS_PATH = "public/default"


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with serving(tmp_path_factory.mktemp("quota-disconnect") / "data", "--num-coordinators", "1",
                 "--backlog-quota-check-interval-seconds", "0.1", fsync=False) as process:
        yield process


def _stats(serve: ServeProcess, local_name: str) -> dict:
    with urllib.request.urlopen(f"{serve.http_url}/admin/v2/persistent/{NS_PATH}/{local_name}/stats",
                                timeout=10) as reply:
        return json.load(reply)


def _wait_until(condition, what: str, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout}s"
        time.sleep(0.02)


def _wait_for_no_publishers(serve: ServeProcess, local_name: str) -> None:
    _wait_until(lambda: _stats(serve, local_name)["publishers"] == [], "the producers' disconnection")


def _wait_for_no_backlog(serve: ServeProcess, local_name: str) -> None:
    # The clients send their acknowledgements grouped, a little later.
    _wait_until(lambda: _stats(serve, local_name)["subscriptions"]["slow"]["msgBacklog"] == 0,
                "the acknowledgements' arrival")


def _set_topic_quota(serve: ServeProcess, local_name: str, policy: str) -> None:
    body = json.dumps({"limitSize": 1000, "limitTime": -1, "policy": policy}).encode()
    request = urllib.request.Request(f"{serve.http_url}/admin/v2/persistent/{NS_PATH}/{local_name}/backlogQuota",
                                     data=body, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 204


def test_official_client_under_hold_is_disconnected_and_its_send_waits_for_the_backlog(serve) -> None:
    local_name = "quota-disconnect-hold"
    client = pulsar.Client(serve.url, logger=QUIET, operation_timeout_seconds=5)
    try:
        consumer = client.subscribe(f"persistent://{NS_PATH}/{local_name}", "slow")
        producer = client.create_producer(f"persistent://{NS_PATH}/{local_name}", batching_enabled=False,
                                          send_timeout_millis=20_000)
        for _ in range(10):
            producer.send(b"x" * 200)              # 2000 bytes of backlog
        _set_topic_quota(serve, local_name, "producer_request_hold")
        _wait_for_no_publishers(serve, local_name)
        done = threading.Event()
        results: list[object] = []
        producer.send_async(b"held", lambda result, message_id: (results.append(result), done.set()))
        assert not done.wait(0.5), "the send was stored past the quota"
        for _ in range(10):
            consumer.acknowledge(consumer.receive(timeout_millis=5000))
        _wait_for_no_backlog(serve, local_name)
        assert done.wait(15), "the held send never completed"
        assert results == [pulsar.Result.Ok]
        assert consumer.receive(timeout_millis=5000).data() == b"held"
    finally:
        client.close()


def test_official_client_under_hold_times_out_a_send_while_the_backlog_stays(serve) -> None:
    local_name = "quota-disconnect-hold-timeout"
    client = pulsar.Client(serve.url, logger=QUIET, operation_timeout_seconds=5)
    try:
        client.subscribe(f"persistent://{NS_PATH}/{local_name}", "slow")
        producer = client.create_producer(f"persistent://{NS_PATH}/{local_name}", batching_enabled=False,
                                          send_timeout_millis=1000)
        for _ in range(10):
            producer.send(b"x" * 200)
        _set_topic_quota(serve, local_name, "producer_request_hold")
        _wait_for_no_publishers(serve, local_name)
        started = time.monotonic()
        with pytest.raises(pulsar.Timeout):
            producer.send(b"held")
        assert time.monotonic() - started >= 0.9             # held until its send timeout, not refused
        assert _stats(serve, local_name)["subscriptions"]["slow"]["msgBacklog"] == 10
    finally:
        client.close()


def test_official_client_under_producer_exception_fails_the_send_then_reconnects(serve) -> None:
    local_name = "quota-disconnect-exception"
    client = pulsar.Client(serve.url, logger=QUIET, operation_timeout_seconds=5)
    try:
        consumer = client.subscribe(f"persistent://{NS_PATH}/{local_name}", "slow")
        producer = client.create_producer(f"persistent://{NS_PATH}/{local_name}", batching_enabled=False,
                                          send_timeout_millis=20_000)
        for _ in range(10):
            producer.send(b"x" * 200)
        _set_topic_quota(serve, local_name, "producer_exception")
        _wait_for_no_publishers(serve, local_name)
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            producer.send(b"refused")
        for _ in range(10):
            consumer.acknowledge(consumer.receive(timeout_millis=5000))
        _wait_for_no_backlog(serve, local_name)
        # The same producer, reconnected: a reconnect refused just before the backlog was consumed
        # may still fail a send, as it fails every pending one.
        deadline = time.monotonic() + 5
        while True:
            try:
                producer.send(b"again")
                break
            except pulsar.ProducerBlockedQuotaExceededException:
                assert time.monotonic() < deadline, "the producer never reconnected"
                time.sleep(0.05)
        assert consumer.receive(timeout_millis=5000).data() == b"again"
    finally:
        client.close()


@contextlib.asynccontextmanager
async def _pyengine_past_the_quota(serve, local_name: str, policy: str):
    """A pyengine.client consumer and producer of a topic filled past a quota of `policy`, the
    producer closed by the broker's check: (consumer, producer)."""
    from pyengine.client import Client

    client = Client(serve.url, operation_timeout_seconds=5)
    try:
        consumer = await client.subscribe(f"persistent://{NS_PATH}/{local_name}", "slow")
        producer = await client.create_producer(f"persistent://{NS_PATH}/{local_name}", send_timeout_ms=20_000)
        for _ in range(10):
            await producer.send(b"x" * 200)
        await asyncio.to_thread(_set_topic_quota, serve, local_name, policy)
        await asyncio.to_thread(_wait_for_no_publishers, serve, local_name)
        yield consumer, producer
    finally:
        await client.close()


async def test_pyengine_client_under_hold_is_disconnected_and_its_send_waits_for_the_backlog(serve) -> None:
    local_name = "quota-disconnect-pyengine"
    async with _pyengine_past_the_quota(serve, local_name, "producer_request_hold") as (consumer, producer):
        held = asyncio.ensure_future(producer.send(b"held"))
        await asyncio.sleep(0.5)
        assert not held.done(), "the send was stored past the quota"
        for _ in range(10):
            await consumer.acknowledge(await consumer.receive())
        await asyncio.to_thread(_wait_for_no_backlog, serve, local_name)
        await asyncio.wait_for(held, 15)
        assert (await asyncio.wait_for(consumer.receive(), 5)).data == b"held"


async def test_pyengine_client_under_producer_exception_fails_its_sends_then_reconnects(serve) -> None:
    """As the C++ client: a producer closed past a producer_exception quota is not failed for
    good; its sends fail with the broker's exception while it is refused, and once the backlog
    is consumed the same producer reconnects and sends."""
    from pyengine.client import ProducerBlockedQuotaExceededException

    local_name = "quota-disconnect-pyengine-exception"
    async with _pyengine_past_the_quota(serve, local_name, "producer_exception") as (consumer, producer):
        with pytest.raises(ProducerBlockedQuotaExceededException):
            await asyncio.wait_for(producer.send(b"refused"), 10)
        for _ in range(10):
            await consumer.acknowledge(await consumer.receive())
        await asyncio.to_thread(_wait_for_no_backlog, serve, local_name)
        deadline = time.monotonic() + 10
        while True:                 # a reconnect refused just before the backlog was consumed fails a send
            try:
                await asyncio.wait_for(producer.send(b"again"), 10)
                break
            except ProducerBlockedQuotaExceededException:
                assert time.monotonic() < deadline, "the producer never reconnected"
                await asyncio.sleep(0.05)
        assert (await asyncio.wait_for(consumer.receive(), 5)).data == b"again"
