"""Service URLs."""

import pytest

from pyengine.client.url import BrokerAddress, parse_broker_url, parse_service_url


def test_plain_url_and_default_port():
    assert parse_service_url("pulsar://127.0.0.1:6651") == [BrokerAddress("pulsar://127.0.0.1:6651", "127.0.0.1", 6651)]
    assert parse_service_url("pulsar://localhost/") == [BrokerAddress("pulsar://localhost:6650", "localhost", 6650)]


def test_several_hosts_and_ipv6():
    addresses = parse_service_url("pulsar://a:1,b:2,[::1]:3")
    assert [a.logical for a in addresses] == ["pulsar://a:1", "pulsar://b:2", "pulsar://[::1]:3"]
    assert addresses[2].host == "::1"


@pytest.mark.parametrize("url", [
    "", "127.0.0.1:6650", "http://127.0.0.1:6650", "pulsar://", "pulsar://:6650", "pulsar://host:0",
    "pulsar://host:70000", "pulsar://host:port", "pulsar://host:6650/path", "pulsar+ssl://host:6651",
    "pulsar://ho st:1", "pulsar://[::1]x",
])
def test_malformed_urls_are_rejected(url):
    with pytest.raises(ValueError):
        parse_service_url(url)


def test_non_string_url():
    with pytest.raises(TypeError):
        parse_service_url(6650)  # type: ignore[arg-type]


def test_broker_url_names_one_host():
    with pytest.raises(ValueError):
        parse_broker_url("pulsar://a:1,b:2")
