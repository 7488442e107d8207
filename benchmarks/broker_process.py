"""`pyengine serve` as a child process on loopback, for the broker benchmarks and the perf tests.

    with BrokerProcess(data_dir, fsync=True) as broker:
        ... broker.url ...

Starts the broker on a free port, waits for its `ready` line, and on exit stops it with
SIGTERM (SIGKILL if it does not stop within 10 s). `cpu_seconds()` reads the child's CPU time
from /proc, so a benchmark can say how busy the broker was.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType

READY_TIMEOUT_S = 60.0
SERVE = "import sys; from pyengine.cli import main; sys.exit(main())"


class BrokerProcess:
    def __init__(self, data_dir: Path, *, fsync: bool = True, loop: str = "uvloop",
                 extra_args: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir
        self.fsync = fsync
        self.loop = loop
        self.extra_args = extra_args
        self.process: subprocess.Popen[str] | None = None
        self.url = ""
        self.http_url = ""
        self.stderr_tail: list[str] = []
        self._stdout_reader: threading.Thread | None = None
        self._stderr_reader: threading.Thread | None = None

    def start(self) -> BrokerProcess:
        command = [sys.executable, "-c", SERVE, "serve", "--data-dir", str(self.data_dir), "--host", "127.0.0.1",
                   "--port", "0", "--http-port", "0", *(() if self.fsync else ("--no-fsync",)), *self.extra_args]
        env = dict(os.environ, PYENGINE_EVENT_LOOP=self.loop)
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self._stderr_reader = threading.Thread(target=self._drain_stderr, args=(self.process,), daemon=True)
        self._stderr_reader.start()
        ready = threading.Event()
        lines: list[str] = []

        def read_ready(process: subprocess.Popen[str]) -> None:
            assert process.stdout is not None
            for line in process.stdout:
                if not ready.is_set():
                    lines.append(line)
                    if "ready" in line:
                        ready.set()
            ready.set()

        self._stdout_reader = threading.Thread(target=read_ready, args=(self.process,), daemon=True)
        self._stdout_reader.start()
        if not ready.wait(READY_TIMEOUT_S) or not lines or "ready" not in lines[-1]:
            self.stop()
            raise RuntimeError(f"pyengine serve did not get ready: {''.join(lines)}{''.join(self.stderr_tail)}")
        match = re.search(r"pulsar=(pulsar://\S+)", lines[-1])
        if match is None:
            self.stop()
            raise RuntimeError(f"no pulsar URL in the ready line {lines[-1]!r}")
        self.url = match[1]
        http = re.search(r"http=(http://\S+)", lines[-1])
        self.http_url = http[1] if http else ""
        return self

    def _drain_stderr(self, process: subprocess.Popen[str]) -> None:
        """Keep the last lines of the broker's log (and never let its pipe fill up)."""
        assert process.stderr is not None
        for line in process.stderr:
            self.stderr_tail.append(line)
            del self.stderr_tail[:-50]

    def cpu_seconds(self) -> float:
        """User + system CPU time the broker process has used so far."""
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for reader in (self._stdout_reader, self._stderr_reader):
            if reader is not None:
                reader.join(timeout=5)          # both end at the pipes' EOF
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
