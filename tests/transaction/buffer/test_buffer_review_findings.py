"""Findings of a review of the v4 transaction buffer (one test per bug, named by what went wrong)."""

import asyncio

import pytest

from pyengine.errors import PersistenceError
from pyengine.storage import StorageError
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine_kernels import TxnId
from tests.transaction.buffer.helpers import fail_next_commit, open_buffer, restart_without_closing, visible_positions


async def test_aborts_sharing_a_marker_position_are_all_kept_by_a_sealed_snapshot(reopen):
    """Txns aborted on a terminated topic have no marker: each is remembered at the LAC, all
    at the same position. Sealing a snapshot segment cut them at `snapshot_segment_aborts`
    and kept as unsealed only the aborts after the segment's last marker: the others at that
    same position were in neither, so after a restart their entries were visible."""
    config = TopicTransactionBufferConfig(snapshot_segment_aborts=2)
    env = reopen()
    ledger, buffer = await open_buffer(env, config)
    plain = await ledger.append(b"plain")
    written = [await buffer.append(TxnId(1, least), b"x") for least in range(3)]
    await ledger.terminate()
    for least in range(3):
        await buffer.abort(TxnId(1, least), -1)
    assert visible_positions(ledger, buffer) == {plain}
    await buffer.take_snapshot()
    env, ledger, buffer = await restart_without_closing(env, reopen)
    assert all(buffer.is_txn_aborted(TxnId(1, least)) for least in range(3))
    assert visible_positions(ledger, buffer) == {plain}
    assert not set(written) & visible_positions(ledger, buffer)


async def test_a_commit_on_a_terminated_topic_stays_committed_across_a_replay(reopen):
    """A txn committed on the terminated topic (no marker), whose ended record a later low
    watermark pruned, was known nowhere. A replay after a crash (the snapshot's horizon before
    its entries, held by another coordinator's open txn) found its entries and no marker: it
    was open again, and the low watermark then aborted it: committed messages were hidden."""
    env = reopen()
    ledger, buffer = await open_buffer(env)
    plain = await ledger.append(b"plain")
    other = TxnId(2, 1)
    held = await buffer.append(other, b"another coordinator's, still open")
    committed = TxnId(1, 1)
    written = [await buffer.append(committed, b"c%d" % i) for i in range(3)]
    await ledger.terminate()
    await buffer.commit(committed, -1)
    await buffer.commit(TxnId(1, 5), 3)                # a low watermark past it: its record goes
    await buffer.take_snapshot()                       # as the snapshot timer would
    env, ledger, buffer = await restart_without_closing(env, reopen)
    assert [txn for txn, _ in buffer.ongoing_txns()] == [other]
    assert not buffer.is_txn_aborted(committed)
    await buffer.commit(other, -1)
    assert buffer.max_read_position() == ledger.lac
    assert visible_positions(ledger, buffer) == {plain, held, *written}


async def test_an_end_on_a_terminated_topic_waits_for_the_decision_and_fails_with_it(env):
    """The coordinator tells a partition its decision while writing it (`after`): a marker is
    written with it, or not at all. On a terminated topic, which takes no marker, the end was
    applied (and its snapshot written) at once: when the decision's write then failed, the
    txn was open again at the coordinator but committed here for good, and its abort (the
    client's, or the timeout's) was refused as a conflict, retried forever."""
    ledger, buffer = await open_buffer(env)
    plain = await ledger.append(b"plain")
    txn = TxnId(1, 1)
    written = await buffer.append(txn, b"x")
    await ledger.terminate()
    decision = asyncio.get_running_loop().create_future()
    commit = asyncio.ensure_future(buffer.commit(txn, -1, after=decision))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not commit.done() and txn in dict(buffer.ongoing_txns())     # not before the decision
    decision.set_exception(StorageError("the decision was not written"))
    with pytest.raises(PersistenceError):
        await commit
    assert txn in dict(buffer.ongoing_txns())
    await buffer.abort(txn, -1)                        # the coordinator decided again
    assert buffer.is_txn_aborted(txn)
    assert visible_positions(ledger, buffer) == {plain}
    assert written not in visible_positions(ledger, buffer)
    landed = asyncio.get_running_loop().create_future()
    landed.set_result(None)
    other = TxnId(1, 2)
    await buffer.commit(other, -1, after=landed)


async def test_a_snapshot_write_cancelled_with_its_storage_is_no_error_in_a_callback(reopen):
    """The storage closed with a snapshot's write pending cancels its future; the buffer's
    done-callback asked it for its exception, which raises CancelledError there (an
    "Exception in callback" in the log, and the next snapshot not retried)."""
    env = reopen()
    ledger, buffer = await open_buffer(env, TopicTransactionBufferConfig())
    written = await buffer.append(TxnId(1, 0), b"x")
    saved = asyncio.get_running_loop().create_future()
    saved.cancel()
    buffer._queued_snapshot_position = written
    buffer._snapshot_written(written, 0, set(), saved)
    assert buffer._queued_snapshot_position is None
