"""A GC sweep under way when a segment is deleted stores no abort for the deleted segment.

The sweep reads the op records an aborted txn's participants left, then adds the txn to the
aborted set of each segment they name. A segment's deletion clears its op records, then its
stored aborted set (last: a sweep finding no op record stores nothing). But a sweep that had
read the op records before the deletion stored the abort after it, in an aborted set created
again for a segment that no longer exists (for good; a segment created again under the name
loads it). Now the sweep's write is guarded by an op record it read: once the deletion has
removed it, the write is refused and the sweep stores nothing."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID, buffer_path

from .conftest import SEGMENT, Gate


@pytest.mark.parametrize("backend_name", ["memory", "lmdb"])
async def test_an_abort_being_stored_during_the_deletion_goes_with_the_segment(v5, clock):
    ledger, buffer = await v5.buffer(SEGMENT)
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"in a txn")
    await buffer.close()                    # unloaded: its op record is left for the sweep
    await v5.coordinator.end_transaction(txn, TxnAction.ABORT)
    clock.now += 2 * v5.coordinator.retention_ms
    store = v5.store
    gate, get = Gate(), store.get
    store.get = gate.wrap(get, lambda path, *rest: path == buffer_path(SEGMENT))
    sweep = asyncio.ensure_future(v5.coordinator.collect_garbage())
    await gate.held.wait()                  # the sweep read the op record, and stores the abort
    await buffer.delete()                   # the segment is deleted meanwhile
    gate.released.set()
    await sweep
    store.get = get
    assert await store.get(buffer_path(SEGMENT)) is None
    assert await v5.coordinator.count_op_records() == 0
