"""`pyengine admin` message TTL and expiry commands, with pulsar-admin's names and flags."""

from __future__ import annotations

import argparse

import pytest

from pyengine.broker.service import BrokerConfig
from pyengine.cli import serve

T = "persistent://public/default/c"


async def test_message_ttl_commands(admin, client):
    producer = await client.create_producer(T)
    await producer.send(b"m0")
    await producer.send(b"m1")
    assert (await admin("namespaces", "set-message-ttl", "public/default", "-ttl", "2m"))[0] == 0
    assert (await admin("namespaces", "get-message-ttl", "public/default"))[1] == 120
    assert (await admin("topics", "set-message-ttl", T, "-t", "30"))[0] == 0
    assert (await admin("topics", "get-message-ttl", T))[1] == 30
    assert (await admin("topics", "remove-message-ttl", T))[0] == 0
    assert (await admin("topics", "get-message-ttl", T, "--applied"))[1] == 120
    assert (await admin("namespaces", "remove-message-ttl", "public/default"))[0] == 0
    assert (await admin("namespaces", "get-message-ttl", "public/default"))[1] is None
    assert (await admin("topics", "create-subscription", T, "-s", "s", "-m", "earliest"))[0] == 0
    status, _, err = await admin("topics", "expire-messages", T, "-s", "s", "-m", "earliest", "-t", "1")
    assert status == 1 and "either" in err
    assert (await admin("topics", "expire-messages", T, "-s", "s", "-t", "0"))[0] == 0
    status, _, err = await admin("topics", "expire-messages-all-subscriptions", T, "-t", "0")
    assert status == 1 and "not issued" in err                           # Pulsar's 409: nothing left
    await producer.close()


def test_serve_flags(tmp_path):
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--data-dir", str(tmp_path), "--ttl-duration-default-seconds", "60",
                              "--message-expiry-check-interval-seconds", "0.5"])
    config = serve.broker_config(args)
    assert (config.ttl_duration_default_seconds, config.message_expiry_check_interval_s) == (60, 0.5)
    defaults = serve.broker_config(parser.parse_args(["serve", "--data-dir", str(tmp_path)]))
    assert (defaults.ttl_duration_default_seconds, defaults.message_expiry_check_interval_s) == (0, 300.0)
    for bad in (["--ttl-duration-default-seconds", "-1"], ["--ttl-duration-default-seconds", str(2**31)],
                ["--message-expiry-check-interval-seconds", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--data-dir", str(tmp_path), *bad])


def test_broker_config_checks(tmp_path):
    for bad in ({"ttl_duration_default_seconds": -1}, {"ttl_duration_default_seconds": 1.5},
                {"message_expiry_check_interval_s": 0}, {"message_expiry_check_interval_s": True}):
        with pytest.raises(ValueError):
            BrokerConfig(data_dir=tmp_path, **bad)
