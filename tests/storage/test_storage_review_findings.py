"""Storage findings of a review: each test failed before its fix."""

import asyncio
import threading

import pytest

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment, StorageError
from pyengine_kernels import Position
from tests.storage.helpers import fail_next_save, settled
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


@pytest.mark.parametrize("limit", [dict(max_entries_per_ledger=3), dict(max_ledger_bytes=3 * 40)])
async def test_a_ledger_filled_by_an_append_is_closed_and_trimmed_without_another_append(env, limit):
    """The ledger an append filled (by count or by size) stayed open, the current ledger,
    until the next append rolled it over; trims never take the current ledger, so on a topic
    that got no append after it, its entries were kept for good, however long ago every
    cursor consumed them. Pulsar closes a ledger with the add that fills it."""
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(retention_ms=0, retention_bytes=0, **limit))
    cursor = await ml.open_cursor("sub", "earliest")
    positions = [await ml.append(b"m" * 10) for _ in range(3)]
    assert {p.ledger_id for p in positions} == {positions[0].ledger_id}
    await cursor.ack_cumulative(positions[-1])
    await settled(ml)
    await ml.trim()
    assert positions[0].ledger_id not in ml.ledgers
    assert ml.read_entries(Position(-1, -1), 10) == []
    assert cursor.backlog() == 0
    later = await ml.append(b"later")                   # a new ledger takes the next append
    assert later.ledger_id > positions[-1].ledger_id
    assert [e.position for e in ml.read_entries(cursor.read_position, 10)] == [later]
    assert cursor.backlog() == 1
