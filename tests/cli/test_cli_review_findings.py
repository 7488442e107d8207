"""Findings of a review of the command line (`pyengine perf`, `pyengine serve`)."""

from __future__ import annotations

import pytest

from pyengine.cli import main

NOWHERE = "pulsar://127.0.0.1:1"      # never reached: the arguments are refused first


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
