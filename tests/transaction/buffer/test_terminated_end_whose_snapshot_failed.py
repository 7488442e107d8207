"""A transaction ended on a terminated topic has no marker: its end is recorded by a snapshot
alone. When that snapshot cannot be written (a full map, a failing disk), the end must fail
so that the coordinator repeats it. It used to be answered done: the coordinator then wrote
the end and forgot the transaction, while after a crash the topic found it open again (its
entries held back the read horizon, until a low watermark aborted it, a commit included)."""

import pytest

from pyengine.errors import PersistenceError
from pyengine_kernels import TxnId
from tests.transaction.buffer.helpers import (TOPIC, fail_next_commit, open_buffer, restart_without_closing,
                                             visible_positions)

ENDED = TxnId(1, 2)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
async def test_an_end_whose_snapshot_failed_is_repeated_until_it_is_durable(reopen, commit):
    env = reopen()
    ledger, buffer = await open_buffer(env)
    plain = await ledger.append(b"plain")
    written = [await buffer.append(ENDED, b"e%d" % i) for i in range(3)]
    await ledger.terminate()
    end = buffer.commit if commit else buffer.abort
    fail_next_commit(env)
    failures = 0
    while True:                         # as the coordinator repeats an end until it is confirmed
        try:
            await end(ENDED, -1)
            break
        except PersistenceError:
            failures += 1
            assert failures < 3
    expected = {plain, *written} if commit else {plain}
    assert visible_positions(ledger, buffer) == expected
    env, ledger, buffer = await restart_without_closing(env, reopen)
    assert buffer.ongoing_txns() == []
    assert buffer.is_txn_aborted(ENDED) is not commit
    assert visible_positions(ledger, buffer) == expected
    assert failures == 1
    env.close()
