"""A connect that took a key's epoch (its record is durable) can still fail afterwards: the
decision to abort the fenced transaction is written next, and that write can fail (a failing
disk). The client is answered with the error and never learns the epoch, so its connection does
not hold the key. Found by an audit: the key kept that connection as its holder — listed as
connected, the closed connection kept in memory, and never released when it closed (the
connection only releases keys it was answered for)."""

from __future__ import annotations

import pytest

from pyengine.transaction import TxnStatus
from pyengine.transaction.coordinator.keys import ANONYMOUS
from tests.storage.helpers import fail_next_save
from tests.transaction.coordinator.test_keys import Holder, connect, harness, open_transaction_of  # noqa: F401
from tests.waiting import eventually

KEY = "job"


async def test_a_connect_whose_abort_decision_fails_does_not_hold_the_key(harness, monkeypatch):
    service = harness.service
    keys = service.keys
    zombie = Holder()
    await connect(service, KEY, holder=zombie)
    txn = await open_transaction_of(service, KEY, 0)
    persist = keys._persist

    async def persist_then_fail_the_next_write(state):
        await persist(state)
        fail_next_save(harness.env)            # the abort's decision, written next
    monkeypatch.setattr(keys, "_persist", persist_then_fail_the_next_write)
    task2 = Holder()
    with pytest.raises(Exception, match="injected"):
        await connect(service, KEY, holder=task2)
    monkeypatch.setattr(keys, "_persist", persist)

    state = keys.find(ANONYMOUS, KEY)
    assert state.epoch == 1 and zombie.closed            # the fence itself stands (it is durable)
    assert state.holder is None and not keys.info(state).connected
    # The client retries as a new task: it gets the next epoch and the abort is decided.
    task3 = Holder()
    assert await connect(service, KEY, holder=task3) == 2
    assert keys.info(state).connected and not task3.closed
    assert service.get(txn).status in (TxnStatus.ABORTING, TxnStatus.ABORTED)


async def test_a_fenced_transaction_whose_abort_decision_failed_is_aborted_without_another_connect(harness, monkeypatch):
    """The zombie's transaction is fenced (nothing of it can commit) but stayed OPEN when the
    abort's decision could not be written: until its timeout (a minute here; the clock is a
    fake that never moves) it held its partitions' read horizon, unless the key happened to be
    connected again. The abort is now decided again in the background, with back-off."""
    service = harness.service
    keys = service.keys
    await connect(service, KEY, holder=Holder())
    txn = await open_transaction_of(service, KEY, 0)
    persist = keys._persist
    failed: list = []

    async def persist_then_fail_the_next_write(state):
        await persist(state)
        fail_next_save(harness.env, failed=failed)         # the abort's decision
    monkeypatch.setattr(keys, "_persist", persist_then_fail_the_next_write)
    with pytest.raises(Exception, match="injected"):
        await connect(service, KEY, holder=Holder())
    monkeypatch.setattr(keys, "_persist", persist)
    failed.clear()
    fail_next_save(harness.env, failed=failed)             # and its first repeat fails too
    assert keys.fenced(txn)

    await eventually(lambda: service.get(txn).status in (TxnStatus.ABORTING, TxnStatus.ABORTED), timeout_s=5)
    assert failed                                          # (the repeat that failed did run)
    await service.wait_for_endings()
    assert service.get(txn).status == TxnStatus.ABORTED
    assert keys.find(ANONYMOUS, KEY).epoch == 1            # no connect was needed


async def test_a_txn_no_longer_fenced_is_not_aborted_by_the_repeat(harness, monkeypatch):
    """The background repeat aborts only a txn that is still fenced and open."""
    service = harness.service
    keys = service.keys
    await connect(service, KEY, holder=Holder())
    txn = await open_transaction_of(service, KEY, 0)
    monkeypatch.setattr(keys, "fenced", lambda t: False)   # as if its binding were gone
    assert await service._decide_fenced_abort(txn, only_if_fenced=True) is None
    assert service.get(txn).status == TxnStatus.OPEN
