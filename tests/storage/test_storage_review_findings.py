"""Storage findings of a review: each test failed before its fix."""

import asyncio
import threading

import pytest

from pyengine.storage import ManagedLedger, StorageEnvironment, StorageError
from tests.storage.helpers import fail_next_save
from tests.storage.test_deleted_ledger_is_not_written_again import stored_keys

TOPIC = "persistent://public/default/t"


def holding(started: threading.Event, release: threading.Event):
    """A write that holds the writer thread (its group commit in flight) until `release`."""
    def write(txn):
        started.set()
        release.wait(10)
    return write


async def test_an_append_taken_while_close_saves_the_cursors_is_settled_before_the_deletion(tmp_path):
    """close() waited for the appends in flight, then saved the cursors, and only then refused
    appends: one taken meanwhile was still in flight when delete() wrote the deletion, and its
    failure then wrote its ledger's record back, left for good under a topic id nothing uses."""
    env = StorageEnvironment(tmp_path / "data")
    try:
        ml = await ManagedLedger.open(env, TOPIC)
        await ml.open_cursor("sub", "earliest")
        await ml.append(b"m")
        deleting = asyncio.ensure_future(ml.delete())
        await asyncio.sleep(0)                      # close() has queued the cursor's save
        started, release = threading.Event(), threading.Event()
        env.submit(holding(started, release))       # that save's commit stays in flight
        await asyncio.to_thread(started.wait, 10)
        fail_next_save(env, "append")
        late = ml.append(b"late")                   # taken: the ledger is not closed yet
        release.set()
        await deleting
        with pytest.raises(StorageError):
            await late
        await env.drain()
        assert stored_keys(env, ml._prefix) == {"topics": [], "ledgers": [], "entries": [], "cursors": []}
    finally:
        env.close()
