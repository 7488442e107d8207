"""Review findings: the v4 coordinator service and its transaction keys."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pyengine.errors import NotAllowedError, PersistenceError
from pyengine.storage import StorageEnvironment
from pyengine.storage.errors import StorageError
from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator.keys import ANONYMOUS
from pyengine.transaction.coordinator.service import TransactionCoordinatorService
from tests.transaction.coordinator.helpers import FAST_BACKOFF


class HeldFailingEnvironment(StorageEnvironment):
    """`fail_next`: the next group commit is held in the writer until `release` is set, then
    fails (`entered` is set once it is held)."""

    fail_next = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.entered = threading.Event()
        self.release = threading.Event()

    def _write_batch(self, writes):
        if self.fail_next:
            self.fail_next = False
            self.entered.set()
            self.release.wait(10)
            raise StorageError("injected write failure")
        return super()._write_batch(writes)


async def _until(condition) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never met")


async def test_no_second_open_transaction_of_a_key_while_the_first_ones_decision_is_written(
        data_dir, participants, clock):
    """A key's NEW_TXN counted its transaction as no longer open as soon as its end was
    submitted (COMMITTING in memory), before the decision was durable. If that write then
    failed, the first transaction was OPEN again next to the new one: two open transactions
    of one key, and a later fence aborted only the newer (the other, its requests refused as
    expired, held the topics' read horizon back until its timeout). NEW_TXN now waits for
    the decision to be written: a failed one leaves the first transaction open, and refuses."""
    env = HeldFailingEnvironment(data_dir)
    service = TransactionCoordinatorService(env, participants, clock=clock, num_coordinators=1,
                                            backoff=FAST_BACKOFF)
    await service.start()
    keys = service.keys
    try:
        epoch = await keys.connect(ANONYMOUS, "task", 0, -1)
        first = await keys.new_transaction(ANONYMOUS, "task", epoch, 0, 60_000)
        env.fail_next = True
        commit = asyncio.ensure_future(service.end_transaction(first, TxnAction.COMMIT))
        await _until(env.entered.is_set)                   # the decision's commit is being written
        assert service.get(first).status == TxnStatus.COMMITTING
        second = asyncio.ensure_future(keys.new_transaction(ANONYMOUS, "task", epoch, 0, 60_000))
        await asyncio.sleep(0.01)
        env.release.set()
        with pytest.raises(PersistenceError):
            await commit
        assert service.get(first).status == TxnStatus.OPEN
        with pytest.raises(NotAllowedError, match="open transaction"):
            await second
        # A new task's connect aborts the key's one open transaction.
        await keys.connect(ANONYMOUS, "task", 0, -1)
        await service.wait_for_endings()
        assert service.get(first).status == TxnStatus.ABORTED
    finally:
        env.release.set()
        await service.close()
        env.close()
