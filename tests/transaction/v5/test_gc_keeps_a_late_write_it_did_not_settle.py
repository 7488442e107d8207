"""The coordinator's GC sweep settles the op records it lists (an aborted txn's abort is added
to each listed segment's stored aborted set), then deletes the op records and the header. A
late write (sent on a stale OPEN header, landing after the abort) whose op record is created
between the listing and the deletion was deleted unsettled: its segment's aborted set never
got the abort, and a broker crash before its buffer saved the abort itself exposed the aborted
txn's entry after the restart (no op record, no header, not in the aborted set: a collected
commit)."""

from __future__ import annotations

import pytest

from pyengine.errors import TransactionConflictError
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_headers import CachedHeader
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID, header_path, op_prefix
from pyengine_kernels import Position


def visible(ledger, buffer) -> list[bytes]:
    horizon = buffer.max_read_position()
    return [bytes(e.data) for e in ledger.read_entries(Position.EARLIEST, 10**6, horizon) if not buffer.hides(e)]


async def test_a_late_write_recorded_after_the_gc_listing_stays_aborted(v5, clock):
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    stale = await v5.headers.get(txn)                       # OPEN, as a lagging cache holds it
    stale = CachedHeader(stale.header, stale.revision)
    await ledger.append(b"plain")
    await v5.coordinator.end_transaction(txn, TxnAction.ABORT)
    clock.now += 10_000

    real_get = v5.headers.get

    async def stale_get(asked, **kwargs):
        return stale if asked == txn else await real_get(asked, **kwargs)

    # The broker crashes before its buffer materialises the abort (saves it, deletes the record).
    buffer._on_decided = lambda *args: None
    real_list = v5.store.list_prefix
    late: list[BaseException] = []

    async def list_prefix(prefix, *args, **kwargs):
        page = await real_list(prefix, *args, **kwargs)
        if prefix == op_prefix(txn) and not late:
            # Just after the sweep listed the txn's op records: the late write lands.
            v5.headers.get = stale_get
            with pytest.raises(TransactionConflictError) as rejected:
                await buffer.append(txn, b"late")
            v5.headers.get = real_get
            late.append(rejected.value)
        return page

    v5.store.list_prefix = list_prefix
    await v5.coordinator.collect_garbage()
    v5.store.list_prefix = real_list
    assert late, "the late write did not run inside the sweep"

    await v5.restart()
    ledger, buffer = await v5.buffer()
    await buffer.wait_materialised()
    assert visible(ledger, buffer) == [b"plain"]
    assert buffer.is_txn_aborted(txn)

    # The next sweeps settle the late record (its abort stored) and collect the txn.
    await v5.coordinator.collect_garbage()
    await buffer.wait_materialised()
    assert await v5.store.get(header_path(txn)) is None
    await v5.restart()
    ledger, buffer = await v5.buffer()
    assert visible(ledger, buffer) == [b"plain"]
