"""A transaction ended on a terminated topic has no marker: its end is recorded by a snapshot
alone. When that snapshot cannot be written (a full map, a failing disk), the end must fail
so that the coordinator repeats it. It used to be answered done: the coordinator then wrote
the end and forgot the transaction, while after a crash the topic found it open again (its
entries held back the read horizon, until a low watermark aborted it, a commit included)."""

import pytest

from pyengine.errors import PersistenceError
from pyengine.storage import ManagedLedger
from pyengine.transaction.buffer.topic_buffer import TopicTransactionBuffer
from pyengine_kernels import TxnId
from tests.transaction.buffer.helpers import TOPIC, open_buffer, visible_positions

ENDED = TxnId(1, 2)


def fail_next_commit(env) -> None:
    """Make the next group commit of `env` fail (nothing of it becomes durable)."""
    original = env._write_batch

    def failing(writes):
        env._write_batch = original
        raise OSError("injected write failure")

    env._write_batch = failing


async def restart_without_closing(env, reopen):
    """The process dies after its last commit: no final snapshot, nothing closed."""
    await env.drain()
    env = reopen(env)
    ledger = await ManagedLedger.open(env, TOPIC)
    buffer = TopicTransactionBuffer(ledger)
    await buffer.recover()
    return env, ledger, buffer


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
