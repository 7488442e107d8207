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
