"""`pyengine perf produce|txn`: a --size no broker could take, or a --batch-delay-ms past an
hour, is a usage error (exit 2 with the reason) before anything is allocated or connected, not
a MemoryError traceback; the bounds themselves are accepted, and a size within them that this
host cannot hold ends the run with a message (exit 1), not a traceback."""

from __future__ import annotations

import argparse

import pytest

from pyengine.cli import main, perf

# Pulsar's maxMessageSize is at most Integer.MAX_VALUE less the 10 KiB frame padding.
LARGEST_MESSAGE = 2**31 - 1 - 10 * 1024
NOWHERE = "pulsar://127.0.0.1:1"      # never reached: the arguments are refused first


@pytest.mark.parametrize("mode", ["produce", "txn"])
@pytest.mark.parametrize("argv, message", [
    (["--size", "100000000000000"], "--size: expected at most 2147473407 bytes"),
    (["--size", str(LARGEST_MESSAGE + 1)], "--size: expected at most 2147473407 bytes"),
    (["--batch-delay-ms", "3600001"], "--batch-delay-ms: expected at most 3600000 ms"),
    (["--batch-delay-ms", str(10**30)], "--batch-delay-ms: expected at most 3600000 ms"),
])
def test_values_past_the_bounds_exit_2_with_the_reason(capsys, mode, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["perf", mode, *argv, "--url", NOWHERE, "--operation-timeout", "0.5", "--quiet"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("mode", ["produce", "txn"])
def test_the_bounds_themselves_are_accepted(mode):
    parser = argparse.ArgumentParser(prog="pyengine")
    perf.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["perf", mode, "--size", str(LARGEST_MESSAGE), "--batch-delay-ms", "3600000"])
    assert args.size == LARGEST_MESSAGE and args.batch_delay_ms == 3_600_000
    args = parser.parse_args(["perf", mode, "--size", "1", "--batch-delay-ms", "0"])
    assert args.size == 1 and args.batch_delay_ms == 0


def test_a_size_this_host_cannot_hold_ends_the_run_with_a_message(monkeypatch, capsys):
    async def out_of_memory(args):
        raise MemoryError
    monkeypatch.setattr(perf, "perf", out_of_memory)
    monkeypatch.setattr(perf, "keep_freed_heap", lambda: None)
    assert main(["perf", "produce", "--size", str(LARGEST_MESSAGE), "--url", NOWHERE, "--quiet"]) == 1
    assert capsys.readouterr().err == (f"pyengine perf: MemoryError: not enough memory for messages of "
                                       f"{LARGEST_MESSAGE} bytes\n")


@pytest.mark.parametrize("mode", ["txn", "consume"])
def test_messages_per_txn_past_what_may_be_in_flight_exits_2(capsys, mode):
    """An unpaced transaction's sends are all made at once: --messages-per-txn had no bound, and
    a value of a few more digits made that many futures before the first was sent."""
    with pytest.raises(SystemExit) as exit_info:
        main(["perf", mode, "--messages-per-txn", str(10**12), "--url", NOWHERE, "--quiet"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--messages-per-txn: expected at most 1000000 messages" in err and "Traceback" not in err
    parser = argparse.ArgumentParser(prog="pyengine")
    perf.add_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["perf", mode, "--messages-per-txn", "1000000"]).messages_per_txn == 1_000_000
