"""One process writes a data dir at a time: a second read-write open (another broker, an
embedded one, a tool) is refused while the first holds it, and readers are not affected. The
kernel drops the lock with its process, so a restart after kill -9 takes it again."""

import os
import subprocess
import sys
import textwrap

import pytest

from pyengine.storage import StorageEnvironment, StorageError
from pyengine.storage.errors import DataDirInUseError

OPEN_AND_REPORT = textwrap.dedent("""
    import sys
    from pyengine.storage import StorageEnvironment
    from pyengine.storage.errors import DataDirInUseError
    from pyengine.storage.reader import StoreReader
    try:
        StorageEnvironment(sys.argv[1]).close()
    except DataDirInUseError as exc:
        print("refused:", exc)
    else:
        print("opened")
    with StoreReader(sys.argv[1]) as reader:        # readers take no lock
        print("read", reader.topic_names())
""")


def open_elsewhere(path) -> str:
    return subprocess.run([sys.executable, "-c", OPEN_AND_REPORT, str(path)], capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()


def test_a_second_writer_is_refused_while_the_first_holds_the_data_dir(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    try:
        refused, read = open_elsewhere(tmp_path / "data").splitlines()
        assert refused.startswith("refused:") and "in use by another process" in refused, refused
        assert f"(pid {os.getpid()})" in refused
        assert read == "read []"
    finally:
        env.close()
    assert open_elsewhere(tmp_path / "data").splitlines() == ["opened", "read []"]


def test_a_writer_killed_hard_leaves_the_data_dir_free(tmp_path):
    with subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from pyengine.storage import StorageEnvironment
        env = StorageEnvironment(sys.argv[1])
        print("held", flush=True)
        time.sleep(60)
    """), str(tmp_path / "data")], stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout.readline().strip() == "held"
            with pytest.raises(DataDirInUseError, match=f"pid {holder.pid}"):
                StorageEnvironment(tmp_path / "data")
        finally:
            holder.kill()
    StorageEnvironment(tmp_path / "data").close()


def test_a_data_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "data").write_text("not a data dir")
    with pytest.raises(StorageError, match="is not a directory"):
        StorageEnvironment(tmp_path / "data")
