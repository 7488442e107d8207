"""A counter's high-water mark whose group commit failed goes again with the next commit (a
suspicion of an audit, reproduced here): before, it was never written again, so a write using
the id that landed in a later commit (a ledger's record) could be durable while a restart
found the counter below the id and gave it out a second time."""

from __future__ import annotations

import pytest

from pyengine.storage import StorageEnvironment, StorageError


def failing(txn):
    raise RuntimeError("injected: the disk is failing")


async def test_an_id_allocated_in_a_failed_commit_is_not_given_again_after_a_restart(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    meta = env.db("meta")
    try:
        first = env.next_id("ledger")
        doomed = env.submit(failing)                # the same group commit as the counter's write
        with pytest.raises(StorageError, match="injected"):
            await doomed
        # The id's user writes its record in a later commit, which succeeds.
        await env.submit(lambda txn: txn.put(b"ledger-record", str(first).encode(), db=meta))
    finally:
        env.close()
    env = StorageEnvironment(tmp_path / "data")
    try:
        assert env.next_id("ledger") == first + 1
    finally:
        env.close()


async def test_the_counter_goes_again_only_once_it_is_written(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    meta = env.db("meta")
    commits = []
    original = env._write_batch
    env._write_batch = lambda writes: commits.append(len(writes)) or original(writes)
    try:
        env.next_id("topic")
        with pytest.raises(StorageError):
            await env.submit(failing)
        await env.submit(lambda txn: txn.put(b"a", b"1", db=meta))     # carries the counter again
        await env.submit(lambda txn: txn.put(b"b", b"2", db=meta))     # nothing more to carry
        assert commits == [2, 2, 1]
    finally:
        env.close()
