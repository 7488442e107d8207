"""Findings of a review of the command line (`pyengine perf`, `pyengine serve`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from pyengine.cli import main
from pyengine.cli.perf import Latency, Visibility
from pyengine.testing import ServeProcess
from tests.cli.serve_flags import assert_refused_before_start, serve_args

NOWHERE = "pulsar://127.0.0.1:1"      # never reached: the arguments are refused first


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[ServeProcess]:
    with ServeProcess(tmp_path_factory.mktemp("cli-review-broker") / "data", "--num-coordinators", "2",
                      fsync=False) as process:
        yield process


def perf(capsys, *argv: str) -> tuple[int, dict, str]:
    """Run `pyengine perf ARGV --json --quiet` in this process: exit code, the JSON line, stderr."""
    code = main(["perf", *argv, "--json", "--quiet"])
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    return code, json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}, err


@pytest.mark.parametrize("value", ["0.0001", "1e-9"])
def test_an_operation_timeout_below_a_millisecond_is_a_usage_error(capsys, value):
    """`--operation-timeout` took any number above 0, but the client's connection timeout is
    whole milliseconds of at least 1: below 1 ms it became 0, and `pyengine perf` ended in a
    ValueError traceback of the client's argument check instead of a usage error."""
    with pytest.raises(SystemExit) as exit_info:
        main(["perf", "produce", "--url", NOWHERE, "--operation-timeout", value, "--duration", "0.1", "--quiet"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--operation-timeout: expected a number of seconds >= 0.001" in err and "Traceback" not in err


def test_an_operation_timeout_of_a_millisecond_is_accepted(capsys):
    """The smallest accepted value runs (and fails to connect, exit 1, with a clear line)."""
    assert main(["perf", "produce", "--url", NOWHERE, "--operation-timeout", "0.001", "--duration", "0.1",
                 "--quiet"]) == 1
    assert capsys.readouterr().err.startswith("pyengine perf: ")


@pytest.mark.parametrize("rate, per_txn, most", [("2", "100", 3), ("0.5", "1", 1)])
def test_a_paced_txn_run_sends_nothing_after_its_end(broker, capsys, rate, per_txn, most):
    """At the end of --duration, the open transaction of a paced `perf txn` sent the rest of
    its messages at once and committed them: `--rate 2 --messages-per-txn 100 --duration 1`
    reported 100 messages (100 msg/s). Now it commits what it sent on time (and aborts a
    transaction it sent nothing in), and each transaction committed is still seen by the
    commit-to-visible consumer."""
    code, result, err = perf(capsys, "txn", "persistent://public/default/review-paced-end", "--url", broker.url,
                             "--rate", rate, "--messages-per-txn", per_txn, "--duration", "1")
    assert code == 0, err
    assert result["errors"] == 0 and result["committed_not_seen"] == 0
    assert 1 <= result["messages"] <= most
    assert result["latency_ms"]["publish"]["count"] == result["messages"]
    assert result["latency_ms"]["commit-to-visible"]["count"] == result["transactions"]


def test_commit_to_visible_counts_no_transaction_of_the_warmup(broker, capsys):
    """Publish and end-txn leave out a transaction begun in the warm-up, but commit-to-visible
    recorded every one whose commit or first message came after it: `--warmup 0.5 --messages
    300 --messages-per-txn 10` reported 30 transactions and 33 commit-to-visible samples."""
    code, result, err = perf(capsys, "txn", "persistent://public/default/review-warmup-visible", "--url", broker.url,
                             "--warmup", "0.5", "--messages", "300", "--duration", "0", "--messages-per-txn", "10")
    assert code == 0, err
    assert result["transactions"] == 30 and result["errors"] == 0 and result["committed_not_seen"] == 0
    latency = result["latency_ms"]
    assert latency["commit-to-visible"]["count"] == latency["end-txn"]["count"] == result["transactions"]
    assert result["visible_before_commit_ack"] <= result["transactions"]


def test_a_warmup_transaction_is_matched_but_not_recorded():
    """The model of the run above: a transaction of the warm-up committed (or seen) after the
    warm-up's figures were discarded is paired with its message, and neither recorded nor
    counted as early, whichever of the two comes first."""
    latency = Latency("commit-to-visible")
    visibility = Visibility(latency)
    visibility.on_commit(1, 10.0, measured=False)
    visibility.on_message(1, 10.5)
    visibility.on_message(2, 10.5)
    visibility.on_commit(2, 11.0, measured=False)
    visibility.on_commit(3, 12.0)
    visibility.on_message(3, 12.25)
    assert (visibility.measured, visibility.early) == (1, 0)
    assert not visibility.committed and not visibility.seen and not visibility.unmeasured
    assert latency.roll()[0] == 1


@pytest.mark.parametrize("value", ["10001", "100000000"])
def test_serve_refuses_more_coordinators_than_the_admin_api_allows(tmp_path, capsys, value):
    """`--num-coordinators` had no upper bound while the admin API lets them grow to 10000 at
    most: every one is started at once, and `--num-coordinators 100000000` held the start for
    minutes and ran the host out of memory. Now a usage error before anything starts."""
    assert_refused_before_start(tmp_path, capsys, ("--num-coordinators", value))


def test_serve_takes_as_many_coordinators_as_the_admin_api_allows():
    assert serve_args("--data-dir", "d", "--num-coordinators", "10000").num_coordinators == 10_000


@pytest.mark.parametrize("partitions", [0, 2])
def test_a_paced_send_due_after_the_warmup_is_measured(broker, capsys, partitions):
    """A paced producer decided whether a send was measured before waiting for its turn: with
    `--rate 1 --warmup 0.5 --duration 2` the send due at 1 s (after the warm-up) was left out,
    and the run reported 1 message (0.5 msg/s) of the 2 sent in the measured period."""
    topic = f"persistent://public/default/review-warmup-paced-{partitions}"
    if partitions:
        assert main(["admin", "--url", broker.http_url, "topics", "create-partitioned-topic", topic,
                     "-p", str(partitions)]) == 0
    code, result, err = perf(capsys, "produce", topic, "--url", broker.url, "--rate", "1", "--warmup", "0.5",
                             "--duration", "2")
    assert code == 0, err
    assert (result["messages"], result["messages_with_warmup"]) == (2, 3)
    assert result["latency_ms"]["publish"]["count"] == 2
