"""Appends queued behind a group commit that fails: no acknowledged entry may sit behind a gap
(where cursors and a restart would never find it), and the LAC never names an entry that was
not written."""

import asyncio
import threading

import pytest

from pyengine.storage import ManagedLedger, StorageEnvironment, StorageError

TOPIC = "persistent://public/default/t"


def doomed(release: threading.Event):
    """A write of another component that holds the writer thread until `release`, then fails
    its whole batch (as a full map or a failing disk would)."""
    def write(txn):
        release.wait(10)
        raise RuntimeError("injected write failure")
    return write


async def test_appends_sealed_behind_a_failed_batch_are_not_acknowledged_past_the_gap(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    try:
        ml = await ManagedLedger.open(env, TOPIC)
        cursor = await ml.open_cursor("sub", "earliest")
        before = await ml.append(b"before")
        await cursor.ack([before])
        release = threading.Event()
        first = ml.append(b"first")
        failed_write = env.submit(doomed(release))      # shares the group commit of `first`
        await asyncio.sleep(0)                          # that commit is with the writer now
        second = ml.append(b"second")       # sealed as soon as the failed commit returns
        release.set()
        for future in (failed_write, first):
            with pytest.raises(StorageError, match="injected"):
                await future
        # Either `second` fails too, or it is acknowledged and a subscription finds it, now and
        # after a restart: an entry acknowledged behind a hole is skipped by the cursor.
        outcome = (await asyncio.gather(second, return_exceptions=True))[0]
        later = await ml.append(b"later")
        acknowledged = [later] + ([] if isinstance(outcome, BaseException) else [outcome])
        assert cursor.backlog() == len(acknowledged)
        await ml.close()
        env.close()

        env = StorageEnvironment(tmp_path / "data")
        ml = await ManagedLedger.open(env, TOPIC)
        cursor = await ml.open_cursor("sub", "earliest")
        assert cursor.backlog() == len(acknowledged)
        delivered = [e.position for e in ml.read_entries(cursor.read_position, 10)]
        assert set(delivered) >= set(acknowledged), (delivered, acknowledged)
        assert [e.data for e in ml.read_entries(ml.first_position(), 10) if e.data in (b"first", b"second")] \
            == ([] if isinstance(outcome, BaseException) else [b"second"])
    finally:
        env.close()


async def test_a_dropped_append_batch_never_moves_the_lac(env):
    """An append made after the failed commit returned but before the ledger handled the
    failure is dropped with it: it fails, and the LAC stays at the last durable entry."""
    ml = await ManagedLedger.open(env, TOPIC)
    before = await ml.append(b"before")
    release = threading.Event()
    failed_write = env.submit(doomed(release))
    first = ml.append(b"first")
    late: list[asyncio.Future] = []
    failed_write.add_done_callback(lambda _: late.append(ml.append(b"late")))
    await asyncio.sleep(0)
    release.set()
    for future in (failed_write, first):
        with pytest.raises(StorageError):
            await future
    assert late
    with pytest.raises(StorageError):
        await late[0]
    await env.barrier()
    await asyncio.sleep(0)
    assert ml.lac == before
    assert [e.data for e in ml.read_entries(ml.first_position(), 10)] == [b"before"]
    after = await ml.append(b"after")
    assert ml.lac == after
    assert [e.data for e in ml.read_entries(ml.first_position(), 10)] == [b"before", b"after"]


async def test_closing_the_environment_under_queued_appends_fails_them_instead_of_hanging(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    ml = await ManagedLedger.open(env, TOPIC)
    kept = await ml.append(b"kept")
    release = threading.Event()
    failing = env.submit(doomed(release))
    in_flight = ml.append(b"in flight")          # shares the failing commit
    await asyncio.sleep(0)
    queued = ml.append(b"queued")                # still queued when the environment closes
    release.set()
    env.close()                                  # waits for the commit in flight
    results = await asyncio.wait_for(asyncio.gather(failing, in_flight, queued, return_exceptions=True), 5)
    assert all(isinstance(result, StorageError) for result in results), results

    env = StorageEnvironment(tmp_path / "data")
    try:
        ml = await ManagedLedger.open(env, TOPIC)
        assert [e.data for e in ml.read_entries(ml.first_position(), 10)] == [b"kept"]
        assert ml.lac == kept
    finally:
        env.close()
