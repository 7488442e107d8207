"""`pyengine serve`'s delayed delivery flags (Pulsar's broker.conf delayedDeliveryEnabled,
delayedDeliveryTickTimeMillis, delayedDeliveryMaxDelayInMillis, isDelayedDeliveryDeliverAtTimeStrict)
become BrokerConfig's defaults; BrokerConfig refuses values that are not ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyengine.broker.policies import DelayedDelivery
from pyengine.broker.service import BrokerConfig
from pyengine.cli import serve
from tests.cli.serve_flags import assert_refused_before_start, serve_args


def test_defaults(tmp_path: Path) -> None:
    config = serve.broker_config(serve_args("--data-dir", str(tmp_path)))
    assert (config.delayed_delivery_enabled, config.delayed_delivery_tick_time_ms,
            config.delayed_delivery_max_delay_ms, config.delayed_delivery_deliver_at_time_strict) == (True, 1000, 0, True)
    assert config.delayed_delivery_policy() == DelayedDelivery()
    assert BrokerConfig(data_dir=tmp_path).delayed_delivery_policy() == DelayedDelivery()


def test_flags(tmp_path: Path) -> None:
    config = serve.broker_config(serve_args(
        "--data-dir", str(tmp_path), "--no-delayed-delivery", "--delayed-delivery-tick-time-ms", "250",
        "--delayed-delivery-max-delay-ms", "60000", "--no-delayed-delivery-strict"))
    assert config.delayed_delivery_policy() == DelayedDelivery(active=False, tick_time_ms=250,
                                                               max_delivery_delay_ms=60_000)
    assert config.delayed_delivery_deliver_at_time_strict is False


@pytest.mark.parametrize("argv", [("--delayed-delivery-tick-time-ms", "-1"),
                                  ("--delayed-delivery-max-delay-ms", "1.5"),
                                  ("--delayed-delivery-max-delay-ms", "soon")])
def test_bad_flags_are_refused_before_anything_starts(tmp_path: Path, capsys, argv) -> None:
    assert_refused_before_start(tmp_path, capsys, argv)


@pytest.mark.parametrize("field, value, error", [
    ("delayed_delivery_enabled", 1, TypeError), ("delayed_delivery_deliver_at_time_strict", "yes", TypeError),
    ("delayed_delivery_tick_time_ms", 1.0, TypeError), ("delayed_delivery_tick_time_ms", True, TypeError),
    ("delayed_delivery_max_delay_ms", -1, ValueError), ("delayed_delivery_tick_time_ms", -5, ValueError)])
def test_broker_config_refuses_bad_values(tmp_path: Path, field, value, error) -> None:
    with pytest.raises(error):
        BrokerConfig(data_dir=tmp_path, **{field: value})
