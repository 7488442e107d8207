"""The v5 coordinator's sweeps go on past a transaction whose records cannot be decoded.

One corrupt op record (or header) raised out of the sweep, which stopped there: the timeout
and GC sweeps of every other transaction after it in the index failed at each interval, for
good - the oldest finalized txn is always swept first, so one bad record blocked the GC of
every transaction (and the timeout of every one past its deadline after it)."""

from __future__ import annotations

from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_records import (
    V5_COORDINATOR_ID,
    HeaderState,
    TxnHeader,
    header_path,
    op_prefix,
    txn_key,
)


async def test_the_gc_sweep_collects_the_txns_after_one_with_a_corrupt_op_record(v5, clock):
    broken = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    fine = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await v5.store.put(op_prefix(broken), b"garbage", sequential=True, partition_key=txn_key(broken))
    await v5.coordinator.end_transaction(broken, TxnAction.ABORT)
    clock.now += 1
    await v5.coordinator.end_transaction(fine, TxnAction.ABORT)
    clock.now += 10_000
    assert await v5.coordinator.collect_garbage() == 1
    assert await v5.store.get(header_path(fine)) is None
    assert await v5.store.get(header_path(broken)) is not None      # kept: its records are not understood
    assert len(await v5.store.list_prefix(op_prefix(broken))) == 1


async def test_the_timeout_sweep_aborts_the_txns_after_one_whose_header_turned_corrupt(v5, clock):
    broken = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 1000)
    fine = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 2000)
    clock.now += 5000
    query = v5.store.range_query

    async def corrupting_after_the_query(*args, **kwargs):
        found = await query(*args, **kwargs)
        await v5.store.put(header_path(broken), b"garbage")     # between the query and the abort
        return found

    v5.store.range_query = corrupting_after_the_query
    assert await v5.coordinator.sweep_timeouts() == 1
    v5.store.range_query = query
    header = TxnHeader.decode((await v5.store.get(header_path(fine))).value)
    assert header.state is HeaderState.ABORTED
