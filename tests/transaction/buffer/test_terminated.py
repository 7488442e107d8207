"""Ending transactions on a terminated topic: the ledger takes no entry, not even a marker, so
the outcome is applied without one and recorded in a snapshot (before, the end was retried
forever and the coordinator's commit or abort never returned)."""

import pytest

from pyengine_kernels import TxnId
from tests.transaction.buffer.helpers import TOPIC, open_buffer, restart_without_closing, visible_positions

OPEN, ENDED, NEVER_WROTE = TxnId(1, 1), TxnId(1, 2), TxnId(1, 3)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
async def test_a_txn_with_entries_ends_on_a_terminated_topic_and_stays_ended(reopen, commit):
    env = reopen()
    ledger, buffer = await open_buffer(env)
    plain = await ledger.append(b"plain")
    await buffer.append(OPEN, b"still open")          # keeps the snapshot's horizon before ENDED
    written = [await buffer.append(ENDED, b"e%d" % i) for i in range(3)]
    await ledger.terminate()
    end = buffer.commit if commit else buffer.abort
    await end(ENDED, -1)
    await end(ENDED, -1)                               # idempotent
    await end(NEVER_WROTE, -1)                         # registered, but every append failed
    assert [txn for txn, _ in buffer.ongoing_txns()] == [OPEN]
    assert buffer.is_txn_aborted(ENDED) is not commit
    await buffer.abort(OPEN, -1)
    expected = {plain, *written} if commit else {plain}
    assert visible_positions(ledger, buffer) == expected
    env, ledger, buffer = await restart_without_closing(env, reopen)
    assert buffer.ongoing_txns() == []
    assert visible_positions(ledger, buffer) == expected


async def test_an_abort_known_only_to_the_aborted_set_stays_ended_across_a_replay(reopen):
    """A txn aborted on the terminated topic (no marker), whose ended record a later low
    watermark pruned, is known only through the aborted set. A replay after a crash reads its
    entries again (the snapshot's horizon is before them, held by another coordinator's open
    txn): they must not make it ongoing again, or the horizon stays before them for good."""
    env = reopen()
    ledger, buffer = await open_buffer(env)
    plain = await ledger.append(b"plain")
    other = TxnId(2, 1)
    held = await buffer.append(other, b"another coordinator's, still open")
    written = [await buffer.append(ENDED, b"e%d" % i) for i in range(3)]
    await ledger.terminate()
    await buffer.abort(ENDED, -1)
    await buffer.commit(TxnId(1, 5), 3)                # a low watermark past ENDED: its record goes
    assert buffer.is_txn_aborted(ENDED)
    await buffer.take_snapshot()                       # as the snapshot timer would
    env, ledger, buffer = await restart_without_closing(env, reopen)
    assert [txn for txn, _ in buffer.ongoing_txns()] == [other]
    assert buffer.is_txn_aborted(ENDED)
    await buffer.commit(other, -1)
    assert buffer.max_read_position() == ledger.lac
    assert visible_positions(ledger, buffer) == {plain, held}
    assert not set(written) & visible_positions(ledger, buffer)
