"""`pyengine perf` stopped (SIGINT, SIGTERM) while it is still connecting or creating its
producers exits at once. Found by an audit: the signal only set the run's stop, which nothing
waits on before the run starts, so Ctrl-C at a broker that does not answer was ignored until
the operation timeout (30 s by default; with a long --operation-timeout, practically never)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

from pyengine.testing import SERVE


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_connecting_stops_perf_at_once(signum):
    with socket.create_server(("127.0.0.1", 0)) as silent:        # accepts, never answers CONNECT
        port = silent.getsockname()[1]
        process = subprocess.Popen(
            [sys.executable, "-c", SERVE, "perf", "produce", "--url", f"pulsar://127.0.0.1:{port}",
             "--operation-timeout", "60", "--quiet"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            silent.settimeout(30)
            connection, _ = silent.accept()
            with connection:
                connection.settimeout(30)
                assert connection.recv(4096)                          # its CONNECT: perf waits for the answer
                process.send_signal(signum)
                out, err = process.communicate(timeout=10)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 128 + signum, err
    assert "interrupted" in err and "Traceback" not in err, err
