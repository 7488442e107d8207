"""`pyengine serve` as an outside test drives it (DESIGN.md, "Contracts that outside tests rely
on"): started by the `pyengine` console script or `python -m pyengine` from a fresh process,
with a plain stdout pipe (no PYTHONUNBUFFERED), port 0 for both listeners. The `ready` line
arrives while the broker runs, exactly once, and only when both listeners accept; SIGTERM and
SIGINT exit 0; the default metadata store is LMDB inside the data dir; after SIGKILL a restart
recovers acknowledged writes and transaction outcomes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from pyengine.cli import serve
from pyengine.client import Client
from pyengine.testing import ServeProcess

from tests.cli.test_serve import serve_args

CONSOLE_SCRIPT = Path(sys.executable).parent / "pyengine"
READY = re.compile(r"pulsar=pulsar://127\.0\.0\.1:(\d+) http=(http://127\.0\.0\.1:(\d+)) ")


class Child:
    """One `pyengine serve` child with its stdout read line by line, as a test harness would."""

    def __init__(self, command: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.stderr = ""
        self.readers = [threading.Thread(target=self._read, daemon=True),
                        threading.Thread(target=self._drain_stderr, daemon=True)]
        for reader in self.readers:
            reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if "ready" in line:
                self.ready.set()
        self.ready.set()

    def _drain_stderr(self) -> None:
        assert self.process.stderr is not None
        self.stderr = self.process.stderr.read()

    def wait_ready(self) -> tuple[int, str]:
        assert self.ready.wait(60), "no ready line within 60 s"
        assert self.process.poll() is None, f"exited {self.process.returncode}: {self.stderr}"
        match = READY.search(self.lines[-1])
        assert match, self.lines
        return int(match[1]), match[2]

    def signal_and_wait(self, signum: int) -> int:
        self.process.send_signal(signum)
        try:
            return self.process.wait(30)
        finally:
            self.close()

    def close(self) -> None:
        """SIGKILL if still running, then read the pipes to their end and close them."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for reader in self.readers:
            reader.join(10)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200
        return json.loads(reply.read())


def put(url: str, body: object) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.status


def test_the_pyengine_console_script_is_installed_and_lists_the_serve_flags() -> None:
    assert CONSOLE_SCRIPT.is_file() and os.access(CONSOLE_SCRIPT, os.X_OK), CONSOLE_SCRIPT
    result = subprocess.run([str(CONSOLE_SCRIPT), "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for flag in ("--data-dir", "--port", "--http-port", "--metadata-store", "--broker-id"):
        assert flag in result.stdout


def test_serve_defaults_are_ports_6650_and_8080_lmdb_and_broker_0(tmp_path: Path) -> None:
    args = serve_args("--data-dir", str(tmp_path))
    assert (args.port, args.http_port, args.metadata_store, args.broker_id) == (6650, 8080, "lmdb", "0")
    assert serve.broker_config(args).metadata_store == "lmdb"


@pytest.mark.parametrize(("launcher", "signum"), [
    ("console-script", signal.SIGTERM),
    ("python-m", signal.SIGINT),
])
async def test_one_flushed_ready_line_once_both_listeners_accept_then_a_clean_exit(
        tmp_path: Path, launcher: str, signum: int) -> None:
    program = [str(CONSOLE_SCRIPT)] if launcher == "console-script" else [sys.executable, "-m", "pyengine"]
    child = Child([*program, "serve", "--data-dir", str(tmp_path / "data"), "--port", "0", "--http-port", "0",
                   "--broker-id", "grader", "--num-coordinators", "1"])
    try:
        port, http_url = child.wait_ready()
        assert child.lines[-1].startswith("pyengine broker grader ready: ")
        # right away, with no retry: both listeners already accept
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        assert "/admin/v2/tenants" in get_json(f"{http_url}/openapi.json")["paths"]
        with urllib.request.urlopen(f"{http_url}/metrics", timeout=10) as reply:
            assert reply.status == 200
            assert reply.headers["Content-Type"].startswith("text/plain")
        async with Client(f"pulsar://127.0.0.1:{port}") as client:
            producer = await client.create_producer("persistent://public/default/grader")
            txn = await client.new_transaction(timeout_ms=30_000)
            await producer.send(b"x", txn=txn)
            await txn.commit()
        code = child.signal_and_wait(signum)
    finally:
        child.close()
    assert code == 0, child.stderr
    assert [line for line in child.lines if "ready" in line] == child.lines[:1]   # exactly one, the first
    assert "Traceback" not in child.stderr, child.stderr


async def test_the_default_metadata_store_is_lmdb_inside_the_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    broker = ServeProcess(data_dir, "--num-coordinators", "1").start()      # no --metadata-store
    try:
        assert put(f"{broker.http_url}/admin/v2/tenants/acme", {"allowedClusters": ["standalone"]}) == 204
        assert put(f"{broker.http_url}/admin/v2/namespaces/acme/orders", {}) == 204
    finally:
        assert broker.stop() == 0, broker.log_tail()
    assert any(data_dir.iterdir())                                          # stored in the data dir
    broker.start()
    try:
        assert "acme" in get_json(f"{broker.http_url}/admin/v2/tenants")
        assert "acme/orders" in get_json(f"{broker.http_url}/admin/v2/namespaces/acme")
    finally:
        assert broker.stop() == 0, broker.log_tail()


async def test_after_sigkill_a_restart_keeps_acknowledged_writes_and_transaction_outcomes(tmp_path: Path) -> None:
    topic = "persistent://public/default/after-sigkill"
    broker = ServeProcess(tmp_path / "data", "--num-coordinators", "1").start()
    try:
        async with Client(broker.url) as client:
            producer = await client.create_producer(topic)
            await producer.send(b"plain")
            committed = await client.new_transaction(timeout_ms=60_000)
            await producer.send(b"committed", txn=committed)
            await committed.commit()
            aborted = await client.new_transaction(timeout_ms=60_000)
            await producer.send(b"aborted", txn=aborted)
            await aborted.abort()
            await producer.send(b"last")
            broker.kill()                                              # SIGKILL, client still attached
    finally:
        broker.kill()
    broker.start()
    try:
        async with Client(broker.url) as client:
            consumer = await client.subscribe(topic, "check", initial_position="earliest")
            received = [(await consumer.receive(timeout=10)).data for _ in range(3)]
            assert received == [b"plain", b"committed", b"last"]
    finally:
        assert broker.stop() == 0, broker.log_tail()
