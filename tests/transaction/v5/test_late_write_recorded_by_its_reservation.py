"""A late write (after its txn's commit) whose op record is the reservation of its txn's first
entry on the segment (a metadata store apart from the data dir: etcd) stays hidden after a
restart that comes before its hiding could be saved.

The reservation names a lower bound of the entry's position, not the position: another entry
appended while it was written takes that position. The recovery hid the position the record
named - the other entry, delivered until then - and delivered the late write, whose sender was
told it had failed."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import PersistenceError, TransactionConflictError
from pyengine.storage import StorageError
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID, op_prefix

from .conftest import Gate
from .test_failed_writes import fail_once, visible

SEPARATE_STORES = pytest.mark.parametrize("backend_name", ["memory", "etcd"])


@SEPARATE_STORES
async def test_a_late_write_recorded_by_its_reservation_is_hidden_at_its_own_position_after_a_restart(v5):
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await v5.headers.get(txn)                                   # cached OPEN here
    v5.headers._on_notification = lambda notification: None     # the commit is not seen yet
    await v5.coordinator.end_transaction(txn, TxnAction.COMMIT)
    gate, put = Gate(), v5.store.put
    v5.store.put = gate.wrap(put, lambda path, *rest: path == op_prefix(txn))
    late = asyncio.ensure_future(buffer.append(txn, b"late"))
    await asyncio.wait_for(gate.held.wait(), 2)
    await ledger.append(b"plain")                 # takes the position the reservation names
    v5.store.put = put
    failed = fail_once(ledger, "_put_topic_record", StorageError("the group commit failed"))
    gate.released.set()
    with pytest.raises((TransactionConflictError, PersistenceError)):
        await late
    assert failed
    assert visible(ledger, buffer) == [b"plain"]
    await v5.restart()                            # before the commit is materialised here
    ledger, buffer = await v5.buffer()
    assert visible(ledger, buffer) == [b"plain"]
    await buffer.wait_materialised()
    assert visible(ledger, buffer) == [b"plain"]
