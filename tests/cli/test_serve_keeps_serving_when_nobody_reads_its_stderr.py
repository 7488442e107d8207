"""An outside harness often starts `pyengine serve` with `stderr=PIPE`, reads stdout up to the
`ready` line and never reads stderr. Once the pipe's buffer (64 KiB) is full, a log write
would block; it must never block the event loop: the broker keeps serving, and SIGTERM still
stops it (exit 0) while that pipe stays full."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from pyengine.client import Client
from pyengine.testing import serve_command

BROKEN_CONNECTIONS = 800           # one warning line each (~150 bytes): well over 64 KiB


async def test_a_full_stderr_pipe_does_not_stall_the_broker(tmp_path: Path) -> None:
    process = subprocess.Popen(serve_command("--data-dir", str(tmp_path / "data"), "--port", "0", "--http-port", "0",
                                             "--num-coordinators", "1"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        ready = process.stdout.readline()
        assert "ready" in ready, ready
        port = int(ready.split("pulsar=pulsar://127.0.0.1:")[1].split()[0])
        for _ in range(BROKEN_CONNECTIONS):           # a broken frame: logged, that connection closed
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"\xff\xff\xff\xff garbage")
                sock.settimeout(10)
                try:
                    while sock.recv(4096):
                        pass
                except ConnectionResetError:
                    pass
        async with Client(f"pulsar://127.0.0.1:{port}", operation_timeout_seconds=10) as client:
            producer = await client.create_producer("persistent://public/default/stderr-full")
            await producer.send(b"still serving")
        process.terminate()
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()
        process.stderr.close()


def test_the_log_writer_writes_every_line_before_close_and_works_with_a_stand_in_stderr(capsys) -> None:
    import logging

    from pyengine.cli.serve import StderrWriter

    writer = StderrWriter()                    # capsys: sys.stderr has no file descriptor
    writer.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("pyengine.test-log-writer")
    logger.addHandler(writer)
    try:
        for i in range(100):
            logger.warning("line %d", i)
    finally:
        logger.removeHandler(writer)
        writer.close()
        writer.close()                         # logging closes it again at exit: harmless
    assert capsys.readouterr().err.splitlines() == [f"WARNING line {i}" for i in range(100)]
