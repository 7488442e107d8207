"""The final snapshot a buffer takes when it closes only spares the next recovery a replay. If
its write fails (a full map, a failing disk), close() must still close: it used to raise the
StorageError, so Topic.close stopped before closing the ledger and a topic deletion stopped
before deleting anything."""

from pyengine.transaction.buffer import BufferState
from pyengine_kernels import TxnId
from tests.transaction.buffer.helpers import crash_and_reopen, fail_next_commit, open_buffer, visible_positions

COMMITTED, ABORTED, OPEN = TxnId(1, 1), TxnId(1, 2), TxnId(1, 3)


async def test_close_succeeds_and_recovery_replays_what_the_snapshot_missed(reopen):
    env = reopen()
    ledger, buffer = await open_buffer(env)
    plain = await ledger.append(b"plain")
    committed = await buffer.append(COMMITTED, b"c")
    await buffer.append(ABORTED, b"a")
    await buffer.append(OPEN, b"o")
    await buffer.commit(COMMITTED, -1)
    await buffer.abort(ABORTED, -1)
    expected = visible_positions(ledger, buffer)
    assert expected == {plain, committed}

    fail_next_commit(env)
    await buffer.close()                 # used to raise StorageError("write failed: ...")
    assert buffer.state is BufferState.CLOSED

    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger)
    assert visible_positions(ledger, buffer) == expected
    assert buffer.is_txn_aborted(ABORTED)
    assert [txn for txn, _first in buffer.ongoing_txns()] == [OPEN]
    await buffer.close()
    await ledger.close()
    await env.drain()
