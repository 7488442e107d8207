"""`pyengine serve` as a child process on loopback, for tests and benchmarks that need a real
broker process (the official client, SIGTERM/SIGKILL, the CLI contract, load generators in a
process of their own).

    with ServeProcess(tmp_path / "data", "--num-coordinators", "2") as broker:
        ... broker.url, broker.http_url ...
        broker.kill()                  # SIGKILL (a crash)
        broker.start()                 # same data dir, same ports
        assert broker.stop() == 0      # SIGTERM, then the exit code

`start()` waits for the `ready` line and learns the ports the broker picked (port 0 means a free
one), so a restart comes back on the same ones. The broker's stderr goes to a log file beside
the data dir (`log_tail()`); a failure to start quotes its tail. `cpu_seconds()` reads the
child's CPU time from /proc, so a benchmark can say how busy the broker was.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
SERVE = "import sys; from pyengine.cli import main; sys.exit(main())"


def serve_command(*args: str) -> list[str]:
    """The command line of `pyengine serve ARGS` in this interpreter."""
    return [sys.executable, "-c", SERVE, "serve", *args]


class ServeProcess:
    """One `pyengine serve` child on 127.0.0.1. `fsync=False` adds `--no-fsync`; `loop` sets
    PYENGINE_EVENT_LOOP (`uvloop`, the default, or `asyncio`)."""

    def __init__(self, data_dir: Path, *extra_args: str, port: int = 0, http_port: int = 0,
                 fsync: bool = True, loop: str | None = None) -> None:
        self.data_dir = data_dir
        self.extra_args = (*extra_args, *(() if fsync else ("--no-fsync",)))
        self.port = port
        self.http_port = http_port
        self.loop = loop
        self.log_path = data_dir.parent / f"{data_dir.name}-serve.log"
        self.process: subprocess.Popen[str] | None = None
        self.stdout_lines: list[str] = []
        self.ready_line = ""
        self._reader: threading.Thread | None = None

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
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.loop is not None:
            env["PYENGINE_EVENT_LOOP"] = self.loop
        ready = threading.Event()
        self.ready_line = ""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        process = self.process

        def read_stdout() -> None:          # keeps the pipe drained for the broker's whole life
            assert process.stdout is not None
            for line in process.stdout:
                self.stdout_lines.append(line)
                if "ready" in line and not ready.is_set():
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

    def log_lines(self, lines: int = 30) -> list[str]:
        """The last `lines` lines of the broker's log (its stderr)."""
        if not self.log_path.exists():
            return []
        return self.log_path.read_text(errors="replace").splitlines(keepends=True)[-lines:]

    def log_tail(self, lines: int = 30) -> str:
        return "".join(self.log_lines(lines))

    def cpu_seconds(self) -> float:
        """User + system CPU time the broker process has used so far."""
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> int | None:
        """SIGKILL (a crash); the exit code, None if it was not running."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        code = process.wait()
        if self._reader is not None:
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
            raise RuntimeError(f"pyengine serve did not stop within {timeout} s of SIGTERM:\n{self.log_tail()}") from None
        return self.kill()

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


@contextlib.contextmanager
def serving(data_dir: Path, *extra_args: str, **options: Any) -> Iterator[ServeProcess]:
    """A started `pyengine serve` (ServeProcess's arguments), stopped afterwards; an exit other
    than a clean one is an error that carries its log."""
    process = ServeProcess(data_dir, *extra_args, **options).start()
    try:
        yield process
    finally:
        code = process.stop()
        if code not in (0, None):
            raise RuntimeError(f"pyengine serve exited with {code}:\n{process.log_tail()}")


def _find(pattern: str, line: str) -> str:
    match = re.search(pattern, line)
    if match is None:
        raise RuntimeError(f"{pattern!r} is not in the ready line {line!r}")
    return match[1]
