"""Dispatch limits with the official `pulsar-client` (3.13, the C++ client) against
`pyengine serve --max-unacked-messages-per-consumer 10`: a Shared consumer receives 10 messages,
then nothing until it has acknowledged half of them; an Exclusive one is not limited. Producer
and consumer limits set through the admin API refuse the client with ProducerBusy and
ConsumerBusy."""

from __future__ import annotations

import argparse
import json
import logging
import urllib.request
from collections.abc import Iterator

import pulsar
import pytest

from pyengine.cli.serve import unacked_limit
from pyengine.testing import ServeProcess, serving

TOPIC = "persistent://public/default/unacked-limit-official"
QUIET = logging.getLogger("pulsar-client")
QUIET.setLevel(logging.ERROR)


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with serving(tmp_path_factory.mktemp("limits") / "data", "--num-coordinators", "1",
                 "--max-unacked-messages-per-consumer", "10",
                 "--max-unacked-messages-per-subscription", "0") as process:
        yield process


@pytest.fixture
def official(serve: ServeProcess) -> Iterator[pulsar.Client]:
    client = pulsar.Client(serve.url, logger=QUIET, operation_timeout_seconds=10)
    try:
        yield client
    finally:
        client.close()


def post(serve: ServeProcess, path: str, value: int) -> int:
    request = urllib.request.Request(serve.http_url + path, data=json.dumps(value).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.status


def receive_or_none(consumer: pulsar.Consumer, timeout_ms: int) -> pulsar.Message | None:
    try:
        return consumer.receive(timeout_millis=timeout_ms)
    except pulsar.Timeout:
        return None


def test_a_shared_consumer_waits_at_its_limit_until_half_is_acknowledged(official):
    shared = official.subscribe(TOPIC, "shared", consumer_type=pulsar.ConsumerType.Shared)
    exclusive = official.subscribe(TOPIC, "exclusive", consumer_type=pulsar.ConsumerType.Exclusive)
    producer = official.create_producer(TOPIC, batching_enabled=False)
    for i in range(30):
        producer.send(b"m%d" % i)
    first = [shared.receive(timeout_millis=2000) for _ in range(10)]
    assert receive_or_none(shared, 300) is None
    for message in first[:4]:
        shared.acknowledge(message)
    assert receive_or_none(shared, 400) is None               # 6 unacknowledged: over half
    shared.acknowledge(first[4])                              # 5: half the limit
    more = [shared.receive(timeout_millis=2000) for _ in range(5)]
    assert receive_or_none(shared, 300) is None               # 10 again
    assert [m.data() for m in first + more] == [b"m%d" % i for i in range(15)]
    assert len([exclusive.receive(timeout_millis=2000) for _ in range(30)]) == 30


def test_producers_and_consumers_past_the_limits_are_busy(serve, official):
    topic = "persistent://public/default/connection-limits-official"
    official.create_producer(topic)
    url = "/admin/v2/persistent/public/default/connection-limits-official"
    assert post(serve, url + "/maxProducers", 1) == 204
    with pytest.raises(pulsar.ProducerBusy):
        official.create_producer(topic)
    assert post(serve, url + "/maxConsumersPerSubscription", 1) == 204
    official.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        official.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    assert post(serve, url + "/maxConsumers", 1) == 204
    with pytest.raises(pulsar.ConsumerBusy):
        official.subscribe(topic, "t", consumer_type=pulsar.ConsumerType.Shared)


@pytest.mark.parametrize("text", ["-1", "2147483648", "ten"])
def test_the_serve_flags_refuse_what_is_not_a_limit(text):
    with pytest.raises(argparse.ArgumentTypeError):
        unacked_limit(text)
