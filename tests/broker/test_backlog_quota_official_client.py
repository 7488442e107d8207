"""Backlog quotas with the official `pulsar-client` (3.13, the C++ client) against
`pyengine serve --backlog-quota-default-limit-bytes 1000`: past the quota a new producer is
refused with ProducerBlockedQuotaExceededError (producer_request_hold, the default policy), or
ProducerBlockedQuotaExceededException once the namespace's quota says producer_exception; once
the subscription consumed its backlog, producers are created again."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from collections.abc import Iterator

import pulsar
import pytest

from pyengine.testing import ServeProcess, serving

TOPIC = "persistent://public/default/backlog-quota-official"
NS = "/admin/v2/namespaces/public/default"
QUIET = logging.getLogger("pulsar-client")
QUIET.setLevel(logging.CRITICAL)


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with serving(tmp_path_factory.mktemp("quota") / "data", "--num-coordinators", "1",
                 "--backlog-quota-default-limit-bytes", "1000", fsync=False) as process:
        yield process


def admin(serve: ServeProcess, method: str, path: str, body: object = None) -> int:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(serve.http_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.status


def wait_for_no_backlog(serve: ServeProcess) -> None:
    deadline = time.monotonic() + 5
    while True:
        with urllib.request.urlopen(f"{serve.http_url}/admin/v2/persistent/public/default/backlog-quota-official/stats",
                                    timeout=10) as reply:
            if json.load(reply)["subscriptions"]["slow"]["msgBacklog"] == 0:
                return
        assert time.monotonic() < deadline, "the acknowledgements never arrived"
        time.sleep(0.02)


def test_producers_are_refused_past_the_quota_until_the_backlog_is_consumed(serve: ServeProcess) -> None:
    client = pulsar.Client(serve.url, logger=QUIET, operation_timeout_seconds=5)
    try:
        consumer = client.subscribe(TOPIC, "slow")
        producer = client.create_producer(TOPIC, batching_enabled=False)
        for _ in range(10):
            producer.send(b"x" * 200)
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededError):
            client.create_producer(TOPIC)
        assert admin(serve, "POST", f"{NS}/backlogQuota",
                     {"limitSize": 1000, "policy": "producer_exception"}) == 204
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            client.create_producer(TOPIC)
        for _ in range(10):
            consumer.acknowledge(consumer.receive(timeout_millis=5000))
        wait_for_no_backlog(serve)                  # the client sends its acks grouped, a little later
        client.create_producer(TOPIC).close()
        assert admin(serve, "DELETE", f"{NS}/backlogQuota") == 204
    finally:
        client.close()


async def test_pyengine_client_waits_under_hold_and_says_why_when_it_gives_up(serve: ServeProcess) -> None:
    """pyengine.client retries a refused producer (as the Java client does under
    producer_request_hold): created once the backlog is consumed, else a TimeoutError that
    carries the broker's reason."""
    from pyengine.client import Client

    topic = TOPIC + "-pyengine"
    client = Client(serve.url, operation_timeout_seconds=10)
    impatient = Client(serve.url, operation_timeout_seconds=0.5)
    try:
        consumer = await client.subscribe(topic, "slow")
        producer = await client.create_producer(topic)
        for _ in range(10):
            await producer.send(b"x" * 200)
        with pytest.raises(TimeoutError, match="Cannot create producer on topic with backlog quota exceeded"):
            await impatient.create_producer(topic)
        waiting = asyncio.ensure_future(client.create_producer(topic))
        for _ in range(10):
            await consumer.acknowledge(await consumer.receive())
        await (await waiting).close()
    finally:
        await impatient.close()
        await client.close()


async def test_pyengine_client_gives_up_at_once_under_producer_exception(serve: ServeProcess) -> None:
    """Under producer_exception the refusal is final: pyengine.client raises the broker's
    ProducerBlockedQuotaExceededException at once instead of retrying until its timeout."""
    from pyengine.client import Client, ProducerBlockedQuotaExceededException

    topic = TOPIC + "-pyengine-exception"
    client = Client(serve.url, operation_timeout_seconds=60)      # far from a loaded machine's stalls
    try:
        await client.subscribe(topic, "slow")
        producer = await client.create_producer(topic)
        for _ in range(10):
            await producer.send(b"x" * 200)
        quota = {"limitSize": 1000, "limitTime": -1, "policy": "producer_exception"}
        assert admin(serve, "POST", f"/admin/v2/persistent/public/default/{topic.rsplit('/', 1)[1]}/backlogQuota",
                     quota) == 204
        started = time.monotonic()
        with pytest.raises(ProducerBlockedQuotaExceededException,
                           match="Cannot create producer on topic with backlog quota exceeded"):
            await client.create_producer(topic)
        assert time.monotonic() - started < 30                       # not its operation timeout
    finally:
        await client.close()
