"""`pyengine serve` on a data dir it cannot use exits 1 with one `cannot serve: ...` line and
no `ready` (DESIGN: one broker per LMDB data dir; a restart on the same dir recovers every
committed decision): a path that is a file, an LMDB environment that is not one, and a data dir
another broker is serving — two brokers on one dir would hand out the same transaction ids and
lose each other's commit decisions."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pyengine.testing import ServeProcess, serve_command


def serve_once(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(serve_command("--data-dir", str(data_dir), "--port", "0", "--http-port", "0",
                                        "--num-coordinators", "1"),
                          capture_output=True, text=True, timeout=60)


def assert_refused(result: subprocess.CompletedProcess[str], *reasons: str) -> None:
    assert result.returncode == 1, result.stderr
    assert "ready" not in result.stdout
    assert "cannot serve" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for reason in reasons:
        assert reason in result.stderr, result.stderr


def test_a_data_dir_that_is_a_file_is_refused_as_not_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "data"
    path.write_text("not a data dir")
    assert_refused(serve_once(path), "is not a directory")


def test_a_data_dir_whose_lmdb_environment_is_garbage_is_refused_without_a_traceback(tmp_path: Path) -> None:
    env_dir = tmp_path / "data" / "lmdb"
    env_dir.mkdir(parents=True)
    (env_dir / "data.mdb").write_bytes(bytes(range(256)) * 400)
    assert_refused(serve_once(tmp_path / "data"), "cannot open the LMDB environment")


def test_a_second_broker_on_a_data_dir_in_use_is_refused_and_the_first_keeps_serving(tmp_path: Path) -> None:
    first = ServeProcess(tmp_path / "data", "--num-coordinators", "1").start()
    try:
        assert_refused(serve_once(tmp_path / "data"), "in use by another process", f"pid {first.process.pid}")
        assert "public" in first.admin("GET", "/admin/v2/tenants")
        first.kill()                                   # SIGKILL: the kernel releases the lock
        first.start()
        assert first.stop() == 0
    finally:
        first.kill()
    later = ServeProcess(tmp_path / "data", "--num-coordinators", "1").start()   # free again after a stop
    assert later.stop() == 0
