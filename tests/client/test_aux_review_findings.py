"""Review findings on the client's auxiliary features: service URLs with several hosts, topic
discovery, routing, dead letters, negative acks and ack timeouts."""

from __future__ import annotations

import re
import socket

import pytest

from pyengine.client import Client
from pyengine.client.url import parse_service_url
from pyengine.schema import SchemaData, SchemaType

NS = "persistent://public/default"


def _dead_port() -> int:
    """A loopback port nothing listens on (bound then closed: connecting is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_a_pattern_subscription_fails_over_from_a_dead_first_host(broker):
    """GET_TOPICS_OF_NAMESPACE went once to the service URL's next host: with the first host of
    `pulsar://dead,alive` down, a pattern subscription failed at once with ConnectError, though
    every other lookup tries the next host with back-off (as the C++ client's retrying lookup
    service does getTopicsOfNamespace too)."""
    client = Client(f"pulsar://127.0.0.1:{_dead_port()},127.0.0.1:{broker.port}", operation_timeout_seconds=5)
    try:
        producer = await client.create_producer(f"{NS}/failover-1")
        await producer.send(b"x")
        client._core.lookup._next_service = 0           # the next request goes to the dead host
        consumer = await client.subscribe(re.compile(f"{NS}/failover-.*"), "sub", initial_position="earliest")
        assert consumer.topics == [f"{NS}/failover-1"]
        assert (await consumer.receive(timeout=5)).data == b"x"
    finally:
        await client.close()


async def test_schema_lookup_fails_over_from_a_dead_first_host(broker):
    """get_schema_info looked the topic up once, on the service URL's next host: with that host
    down it failed with ConnectError instead of asking the next one."""
    client = Client(f"pulsar://127.0.0.1:{_dead_port()},127.0.0.1:{broker.port}", operation_timeout_seconds=5)
    try:
        producer = await client.create_producer(f"{NS}/schema-failover", schema=SchemaData(SchemaType.STRING))
        await producer.close()
        client._core.lookup._next_service = 0
        info = await client.get_schema_info(f"{NS}/schema-failover")
        assert info.version == 0
    finally:
        await client.close()


@pytest.mark.parametrize("url", ["pulsar://[::1:6650", "pulsar://[::1", "pulsar://host:²", "pulsar://host:६६५०"])
def test_malformed_service_urls_are_refused_as_such(url):
    """An IPv6 address missing its "]" was taken as it stood ("[::1:6650" named the host
    ::1:6650 on the default port, another address); a port of non-ASCII digits was taken
    ("६६५०" as 6650) or failed with int()'s message, not the URL's."""
    with pytest.raises(ValueError, match="invalid service URL"):
        parse_service_url(url)
