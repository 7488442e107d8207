"""Findings of the review of `pyengine serve` as an operator runs it (flags, start-up, signals)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pyengine.cli import serve
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
    # Not a fixed 0.3 s: a loaded machine can still be starting the interpreter then (a SIGINT in
    # its `site` import is Python's own fatal error). The commands' imports in main() load the
    # native kernels first (`demo`), before the broker's: once they are mapped, main() is running.
    maps, deadline = Path(f"/proc/{process.pid}/maps"), time.monotonic() + 60
    while "pyengine_kernels" not in maps.read_text():
        assert process.poll() is None and time.monotonic() < deadline, "pyengine never began importing its commands"
        time.sleep(0.002)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert process.returncode in (0, 130), err


async def test_sigterm_during_start_up_stops_without_announcing_ready(tmp_path: Path, monkeypatch, capsys) -> None:
    """A SIGTERM that arrived while the broker started (loading its coordinators from the data
    dir can take a while) was handled only after the start: the broker printed its ready line,
    which tells a supervisor or a test harness to connect, and stopped right after it."""
    start_service = serve.start_service

    async def start_service_and_receive_sigterm(*args):
        service = await start_service(*args)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(3):                       # the loop's signal handler runs on a later turn
            await asyncio.sleep(0.01)
        return service

    monkeypatch.setattr(serve, "start_service", start_service_and_receive_sigterm)
    args = serve_args("--data-dir", str(tmp_path / "data"), "--port", "0", "--http-port", "0",
                      "--num-coordinators", "1")
    await asyncio.wait_for(serve.run_broker(args), 60)
    assert "ready" not in capsys.readouterr().out
