"""Findings of the review of `pyengine serve` as an operator runs it (flags, start-up, signals)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from pyengine.testing import serve_command
from tests.cli.serve_flags import serve_args


@pytest.mark.parametrize("host", ["", " "])
def test_an_empty_host_is_refused_before_anything_starts(capsys, host: str) -> None:
    """`--host ""` (a script's unset variable) was taken: the broker listened on every interface
    and announced `pulsar://:PORT` and `http://:PORT` in its ready line, and handed the same
    host-less URLs to clients in HTTP lookups: URLs no client can connect to. (Parsed only: the
    flags once taken started a broker.)"""
    with pytest.raises(SystemExit) as exit_info:
        serve_args("--data-dir", "data", "--host", host)
    assert exit_info.value.code == 2
    assert "--host: an empty address" in capsys.readouterr().err


def test_an_empty_data_dir_is_refused_before_anything_starts(capsys) -> None:
    """`--data-dir ""` (a script's unset variable) was taken as the current directory: the
    broker created its LMDB environment wherever it was started from."""
    with pytest.raises(SystemExit) as exit_info:
        serve_args("--data-dir", "")
    assert exit_info.value.code == 2
    assert "--data-dir: an empty path" in capsys.readouterr().err


def test_ctrl_c_while_serve_starts_stops_it_without_a_traceback(tmp_path: Path) -> None:
    """A SIGINT in the second or more `pyengine serve` spends importing the broker, before it
    handles signals itself, ended in a KeyboardInterrupt traceback of the import."""
    process = subprocess.Popen(serve_command("--data-dir", str(tmp_path / "data"), "--port", "0", "--http-port", "0",
                                             "--num-coordinators", "1"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert process.returncode in (0, 130), err
