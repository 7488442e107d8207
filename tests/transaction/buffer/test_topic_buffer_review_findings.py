"""Findings of a second review of the v4 transaction buffer (one test per bug, named by what
went wrong)."""

import asyncio

import pytest

from pyengine.errors import NotAllowedError
from pyengine.storage import ManagedLedgerConfig
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine_kernels import TxnId
from tests.transaction.buffer.helpers import crash_and_reopen, open_buffer

NO_TIMER = TopicTransactionBufferConfig(snapshot_min_interval_ms=3_600_000)


async def test_a_snapshot_taken_between_a_markers_commit_and_its_end_does_not_skip_the_marker(reopen):
    """A marker is durable (the LAC moves past it) one loop turn before the end it carries is
    applied. A snapshot taken in that turn (its timer firing then) recorded the LAC as its max
    read position but not the end: recovery replays only after that position, so it never saw
    the marker and forgot the txn had ended. A late send of the txn (a producer's retry) was
    then taken after a crash, and held the read horizon back (consumers stalled) until a low
    watermark passed it."""
    env = reopen()
    ledger, buffer = await open_buffer(env, NO_TIMER)
    await buffer.commit(TxnId(1, 0), -1)                # the topic is transactional from here on
    await ledger.append(b"plain")
    txn = TxnId(1, 1)                                   # it wrote nothing on this topic
    ended = buffer.end_now(txn, TxnAction.ABORT, -1)
    assert ended is not None
    # A write in the marker's group commit: its callback runs in the turn the LAC moves,
    # before the end is applied (as the snapshot timer can).
    env.submit(lambda txn: None).add_done_callback(lambda _: buffer._on_snapshot_timer())
    await ended
    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger, NO_TIMER)
    with pytest.raises(NotAllowedError):
        await buffer.append(txn, b"late")
    plain = await ledger.append(b"after")
    assert buffer.max_read_position() == plain
    await buffer.close()
    await ledger.close()
    await env.drain()


async def test_a_trim_between_a_markers_commit_and_its_end_does_not_delete_the_marker(reopen):
    """The same turn, for a trim: its bound (the read horizon, then the LAC) let it delete the
    ledger that the marker closed, while the snapshot written with it did not hold the end
    yet. The marker was gone and the end with it: after a crash the txn was forgotten."""
    ledger_config = ManagedLedgerConfig(max_entries_per_ledger=2)
    env = reopen()
    ledger, buffer = await open_buffer(env, NO_TIMER, ledger_config)
    await buffer.commit(TxnId(1, 0), -1)                # the topic is transactional from here on
    await ledger.append(b"plain")
    await ledger.append(b"plain")
    txn = TxnId(1, 1)                                   # it wrote nothing on this topic
    ended = buffer.end_now(txn, TxnAction.ABORT, -1)    # its marker fills (and closes) a ledger
    assert ended is not None
    ledger.set_retention(0, -1)                         # no subscription keeps anything
    same_commit = env.submit(lambda txn: None)

    async def trim_in_that_turn():
        await same_commit
        await ledger.trim(now_ms=1 << 62)

    trimmed = asyncio.ensure_future(trim_in_that_turn())
    await ended
    await trimmed
    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger, NO_TIMER, ledger_config)
    with pytest.raises(NotAllowedError):
        await buffer.append(txn, b"late")
    await buffer.close()
    await ledger.close()
    await env.drain()
