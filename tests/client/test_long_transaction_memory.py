"""A long transaction keeps only the sends and acks still under way or failed (its commit
needs nothing else), not a future per operation done; a failure among many is still what its
commit reports."""

import asyncio

import pytest

from pyengine.client.transaction import Transaction
from pyengine_kernels import TxnId


class Coordinator:
    def __init__(self) -> None:
        self.ended: list[int] = []

    async def end(self, txn_id, action) -> None:
        self.ended.append(action)


def done(result=None, error: BaseException | None = None) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
    return future


async def test_operations_done_are_not_kept_and_a_failure_among_them_aborts_the_commit():
    coordinator = Coordinator()
    txn = Transaction(coordinator, txn_id=TxnId(0, 1), timeout_ms=60_000)
    pending = asyncio.get_running_loop().create_future()
    txn._track(pending)
    for i in range(20_000):
        txn._track(done(i))
        if i == 7_000:
            txn._track(done(error=RuntimeError("send 7000 failed")))
    assert len(txn._operations) < 1_000
    assert pending in txn._operations
    pending.set_result(None)
    with pytest.raises(RuntimeError, match="send 7000 failed"):
        await txn.commit()
    assert coordinator.ended == [1]            # aborted (pb.ABORT)
