"""Findings of the metadata-store review (memory, lmdb, etcd, leader election)."""

from __future__ import annotations

import pytest

from pyengine.metadata import CompactedError, NotificationType
from pyengine.metadata.etcd_server import LocalEtcd
from pyengine.metadata.etcd_store import EtcdMetadataStore, _op_put
from pyengine.metadata.keys import encode_remote




async def test_a_watch_resumes_after_a_compaction_of_what_it_delivered(own_etcd):
    """After a broken stream the etcd watch resumed at the revision it had last delivered,
    not after it. When etcd had compacted up to the next revision meanwhile (nothing the
    watch still needed was gone), the resume was refused and the watch failed with
    CompactedError: the consumer had to re-read although no change was lost."""
    store = await EtcdMetadataStore(own_etcd.host, own_etcd.port, root="/resume").start()
    try:
        watch = await store.watch("/w/", prefix=True)
        await store.put("/w/a", b"1")
        assert (await watch.next(5)).path == "/w/a"
        other = await store.put("/o", b"x")          # outside the watch: the next revision
        await store.client.compact(other.mod_revision, physical=True)
        own_etcd.stop()                                   # the watch stream breaks
        own_etcd.start()
        written = await store.put("/w/b", b"2")
        try:
            second = await watch.next(10)
        except CompactedError as exc:
            pytest.fail(f"the watch failed although it had missed nothing: {exc}")
        assert (second.type, second.path, second.revision) == (NotificationType.CREATED, "/w/b",
                                                               written.mod_revision)
        assert watch.pending() == 0
        watch.close()
    finally:
        await store.close()


async def test_a_revision_cut_by_a_failed_conversion_is_resumed_without_duplicates(own_etcd):
    """The other side of the resume point: when the watch stopped in the middle of a
    revision (converting one of its events failed), it resumes at that revision and
    delivers only the events of it not delivered yet."""
    store = await EtcdMetadataStore(own_etcd.host, own_etcd.port, root="/cut").start()
    try:
        watch = await store.watch("/w/", prefix=True)
        record = store._record
        failed = []

        def failing_once(kv):
            if kv.key.endswith(b"/w/b") and not failed:
                failed.append(kv.key)
                raise RuntimeError("conversion failed")
            return record(kv)

        store._record = failing_once
        # one revision with two records (as a foreign multi-key transaction writes them)
        reply = await store._txn([], [_op_put(store._rkey(p), encode_remote(None, [], b"v")) for p in ("/w/a", "/w/b")])
        got = [await watch.next(10), await watch.next(10)]
        assert failed
        assert [(n.path, n.revision) for n in got] == [("/w/a", reply.header.revision),
                                                       ("/w/b", reply.header.revision)]
        later = await store.put("/w/c", b"c")
        assert (await watch.next(10)).revision == later.mod_revision
        assert watch.pending() == 0
        watch.close()
    finally:
        await store.close()


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_etcd_runner_stops_its_etcd_on_sigterm(tmp_path):
    """`python -m pyengine.metadata.etcd_server DIR` "runs until interrupted", but only
    SIGINT stopped its etcd: it waited in `sigwait` without blocking the signals, so SIGTERM
    (a supervisor's or CI's stop) killed it by the default action and left the etcd (in a
    session of its own) running, holding its ports and data dir."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    from pyengine.metadata.etcd_server import LocalEtcd

    if LocalEtcd(tmp_path / "probe").executable is None:
        pytest.fail("this test needs a local etcd (etcd-server)", pytrace=False)
    runner = subprocess.Popen([sys.executable, "-m", "pyengine.metadata.etcd_server", str(tmp_path / "data")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    etcd_pid = None
    try:
        line = runner.stdout.readline()
        found = re.search(r"ready .* \(pid (\d+)\)", line)
        assert found, f"the runner did not start: {line!r}"
        etcd_pid = int(found.group(1))
        runner.send_signal(signal.SIGTERM)
        runner.wait(20)
        deadline = time.monotonic() + 5
        while _running(etcd_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(etcd_pid), "etcd kept running after its runner was terminated"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        runner.stdout.close()
        if etcd_pid is not None and _running(etcd_pid):
            os.kill(etcd_pid, signal.SIGKILL)


async def test_delete_recursive_of_a_tree_holding_its_guard_record(store):
    """`delete_recursive` guarded by a record inside the tree it deletes (a leader removing a
    tree with its own election record). The local stores delete the tree at once while the
    guard holds; etcd deleted record by record in path order, so the guard record went
    before the records after it, whose deletes then failed their guard: GuardFailedError
    and half a tree left. The guard record now goes last."""
    for path in ("/t", "/t/a", "/t/leader", "/t/z", "/t/z/y"):
        await store.put(path, b"v")
    await store.put("/t/seq/", b"s", sequential=True)
    leader = await store.get("/t/leader")
    await store.delete_recursive("/t", guard_path="/t/leader", guard_mod_revision=leader.mod_revision)
    assert (await store.list_prefix("/t")).records == []
    assert (await store.put("/t/seq/", b"s", sequential=True)).path == "/t/seq/0000000000"
