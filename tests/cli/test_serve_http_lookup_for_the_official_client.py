"""Pulsar's HTTP lookup on the admin port: the official client given the broker's `http://` URL
(as pulsar-client-python's `test_v2_topics_http` does) looks topics up over HTTP and then
produces and consumes over the binary protocol; `/admin/v2/clusters` names the one cluster."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pulsar
import pytest

from pyengine.testing import ServeProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    process = ServeProcess(tmp_path_factory.mktemp("http-lookup") / "data", "--num-coordinators", "1")
    process.start()
    try:
        yield process
    finally:
        assert process.stop() == 0, process.log_tail()


def test_lookup_names_this_brokers_urls(broker: ServeProcess) -> None:
    data = broker.admin("GET", "/lookup/v2/topic/persistent/public/default/looked-up")
    assert data["brokerUrl"] == broker.url and data["httpUrl"] == broker.http_url
    with pytest.raises(urllib.error.HTTPError) as error:
        broker.admin("GET", "/lookup/v2/topic/persistent/public/no-such-namespace/t")
    assert error.value.code == 404 and "reason" in json.loads(error.value.read())


def test_the_clusters_list_is_the_one_standalone_cluster(broker: ServeProcess) -> None:
    assert broker.admin("GET", "/admin/v2/clusters") == ["standalone"]


def test_the_official_client_on_the_http_url_produces_and_consumes(broker: ServeProcess) -> None:
    client = pulsar.Client(broker.http_url, operation_timeout_seconds=10)
    try:
        topic = "my-v2-topic-over-http-lookup"
        consumer = client.subscribe(topic, "my-sub", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic)
        producer.send(b"hello")
        message = consumer.receive(10_000)
        assert message.data() == b"hello"
        consumer.acknowledge(message)
        with pytest.raises(pulsar.Timeout):
            consumer.receive(100)
    finally:
        client.close()


def test_on_a_wildcard_address_lookup_answers_with_the_host_the_client_used(tmp_path) -> None:
    broker = ServeProcess(tmp_path / "data", "--num-coordinators", "1", "--host", "0.0.0.0").start()
    try:
        assert f"pulsar=pulsar://0.0.0.0:{broker.port}" in broker.ready_line
        data = broker.admin("GET", "/lookup/v2/topic/persistent/public/default/t")
        assert data["brokerUrl"] == f"pulsar://127.0.0.1:{broker.port}"
        assert data["httpUrl"] == f"http://127.0.0.1:{broker.http_port}"
    finally:
        assert broker.stop() == 0, broker.log_tail()
