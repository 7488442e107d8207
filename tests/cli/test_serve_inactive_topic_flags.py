"""`pyengine serve`'s inactive-topic flags (Pulsar's broker.conf brokerDeleteInactiveTopicsEnabled,
-Mode, -MaxInactiveDurationSeconds and -FrequencySeconds) become BrokerConfig's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyengine.broker.policies import InactiveTopicPolicies
from pyengine.cli import serve
from tests.cli.serve_flags import assert_refused_before_start, serve_args


def test_defaults_are_pulsars(tmp_path: Path) -> None:
    config = serve.broker_config(serve_args("--data-dir", str(tmp_path)))
    assert config.inactive_topic_policies() == InactiveTopicPolicies("delete_when_no_subscriptions", 60, True)
    assert config.delete_inactive_topics_frequency_s == 60


def test_flags(tmp_path: Path) -> None:
    config = serve.broker_config(serve_args(
        "--data-dir", str(tmp_path), "--no-delete-inactive-topics",
        "--delete-inactive-topics-mode", "delete_when_subscriptions_caught_up",
        "--delete-inactive-topics-max-inactive-duration-seconds", "600",
        "--delete-inactive-topics-frequency-seconds", "30"))
    assert config.inactive_topic_policies() == InactiveTopicPolicies("delete_when_subscriptions_caught_up", 600, False)
    assert config.delete_inactive_topics_frequency_s == 30


@pytest.mark.parametrize("argv", [("--delete-inactive-topics-mode", "always"),
                                  ("--delete-inactive-topics-max-inactive-duration-seconds", "-1"),
                                  ("--delete-inactive-topics-frequency-seconds", "0")])
def test_bad_flags_are_refused_before_anything_starts(tmp_path: Path, capsys, argv) -> None:
    assert_refused_before_start(tmp_path, capsys, argv)
