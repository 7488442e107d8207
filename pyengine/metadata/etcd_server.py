"""A throwaway single-member etcd on loopback, for tests, benchmarks and local clusters.

`LocalEtcd(data_dir).start()` runs Debian's `etcd` (package `etcd-server`; `scripts/apt-install`
installs it) listening on 127.0.0.1 only, on free client and peer ports unless given, and
waits until it answers. `stop()` terminates it (SIGKILL with `kill=True`, as a crash);
`start()` again reuses the data dir and the ports. Short heartbeat and election timeouts make
etcd's minimum lease TTL 1 s (default settings: 2 s), so tests can let sessions expire quickly.

    python -m pyengine.metadata.etcd_server DATA_DIR [--port P]   # runs until interrupted
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


class EtcdUnavailableError(RuntimeError):
    """etcd is not installed or did not start."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalEtcd:
    def __init__(self, data_dir: str | Path, *, port: int | None = None, peer_port: int | None = None,
                 executable: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.peer_port = peer_port or free_port()
        self.executable = executable or shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
        self.process: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def url(self) -> str:
        return f"etcd://{self.host}:{self.port}"

    def command(self) -> list[str]:
        client = f"http://{self.host}:{self.port}"
        peer = f"http://{self.host}:{self.peer_port}"
        return [
            str(self.executable), "--name", "pyengine", "--data-dir", str(self.data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"pyengine={peer}", "--initial-cluster-state", "new",
            "--heartbeat-interval", "10", "--election-timeout", "100",
            "--logger", "zap", "--log-level", "error",
        ]

    def start(self, timeout: float = 15.0) -> LocalEtcd:
        if self.executable is None:
            raise EtcdUnavailableError(
                "etcd is not installed: `apt-get install -y etcd-server` (or scripts/apt-install)")
        if self.running:
            return self
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EtcdUnavailableError(f"etcd exited with code {self.process.returncode}: {self._log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.05)
        self.stop(kill=True)
        raise EtcdUnavailableError(f"etcd did not become healthy within {timeout} s: {self._log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.port}/health", timeout=1) as reply:
                return json.loads(reply.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> LocalEtcd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run a loopback single-member etcd until interrupted")
    parser.add_argument("data_dir")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--peer-port", type=int, default=None)
    args = parser.parse_args(argv)
    etcd = LocalEtcd(args.data_dir, port=args.port, peer_port=args.peer_port)

    # SIGTERM's default action would end this process and leave etcd (in a session of its
    # own) running: it interrupts the wait as SIGINT does, and etcd is stopped either way
    def interrupted(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        try:
            etcd.start()
        except EtcdUnavailableError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"ready {etcd.url} (pid {etcd.process.pid if etcd.process else '?'})", flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        return 0
    finally:
        # a repeated signal must not cut the stop short either
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        etcd.stop()


if __name__ == "__main__":
    raise SystemExit(main())
