"""`pyengine serve` as a child process on loopback, for the tests that need a real broker process
(the official client, SIGTERM/SIGKILL, the CLI contract).

    broker = ServeProcess(tmp_path / "data")
    broker.start()                 # waits for the `ready` line; ports 0 -> the ones it picked
    ... broker.url, broker.http_url ...
    broker.kill()                  # SIGKILL
    broker.start()                 # same data dir, same ports
    assert broker.stop() == 0      # SIGTERM, the exit code

The broker's stderr goes to `serve.log` beside the data dir; a failure to start quotes its tail.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
SERVE = "import sys; from pyengine.cli import main; sys.exit(main())"


def serve_command(*args: str) -> list[str]:
    """The command line of `pyengine serve ARGS` in this interpreter."""
    return [sys.executable, "-c", SERVE, "serve", *args]


class ServeProcess:
    def __init__(self, data_dir: Path, *extra_args: str, port: int = 0, http_port: int = 0) -> None:
        self.data_dir = data_dir
        self.extra_args = extra_args
        self.port = port
        self.http_port = http_port
        self.log_path = data_dir.parent / f"{data_dir.name}-serve.log"
        self.process: subprocess.Popen[str] | None = None
        self.stdout_lines: list[str] = []
        self.ready_line = ""

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> ServeProcess:
        """Start (or restart, on the ports of the last start) and wait for the ready line."""
        command = serve_command("--data-dir", str(self.data_dir), "--host", "127.0.0.1", "--port", str(self.port),
                                "--http-port", str(self.http_port), *self.extra_args)
        ready = threading.Event()
        self.ready_line = ""
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        process = self.process

        def read_stdout() -> None:          # keeps the pipe drained for the broker's whole life
            assert process.stdout is not None
            for line in process.stdout:
                self.stdout_lines.append(line)
                if "ready" in line:
                    self.ready_line = line
                    ready.set()
            ready.set()

        self._reader = threading.Thread(target=read_stdout, daemon=True)
        self._reader.start()
        if not ready.wait(READY_TIMEOUT_S) or not self.ready_line:
            code = self.kill()
            raise RuntimeError(f"pyengine serve did not get ready (exit code {code}):\n{self.log_tail()}")
        self.port = int(_find(r"pulsar=pulsar://[^\s]*:(\d+)", self.ready_line))
        self.http_port = int(_find(r"http=http://[^\s]*:(\d+)", self.ready_line))
        return self

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        """One admin REST call: the decoded JSON reply (None when empty); an HTTP error raises."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.http_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            text = reply.read()
        return json.loads(text) if text else None

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "".join(self.log_path.read_text(errors="replace").splitlines(keepends=True)[-lines:])

    def kill(self) -> int | None:
        """SIGKILL (a crash); the exit code, None if it was not running."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        code = process.wait()
        self._reader.join(5)             # the reader sees EOF once the process is gone
        assert process.stdout is not None
        process.stdout.close()
        return code

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then the exit code (SIGKILL and an error if it does not stop in time)."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"pyengine serve did not stop within {timeout} s of SIGTERM:\n{self.log_tail()}")
        return self.kill()


def _find(pattern: str, line: str) -> str:
    match = re.search(pattern, line)
    if match is None:
        raise RuntimeError(f"{pattern!r} is not in the ready line {line!r}")
    return match[1]
