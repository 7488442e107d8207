"""A v5 buffer's save of its trimmed aborted set, still under way when its segment is deleted,
does not write the set again after the deletion cleared it.

A trim of the segment's ledgers drops the aborts whose entries went with them and saves the
smaller set in the background. The buffer's close did not wait for that save: a deletion
right after the trim cleared `/txn-buffer/<segment>`, then the save (a compare-and-set loop,
which finds the record gone and creates it) wrote it again - state of a segment that no
longer exists, loaded by a segment created again under the name."""

from __future__ import annotations

import asyncio

from pyengine.storage import ManagedLedgerConfig
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer.metadata_buffer import clear_segment_state
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID, buffer_path

from .conftest import SEGMENT, Gate, eventually


async def test_a_trimmed_aborted_set_being_saved_during_the_deletion_goes_with_the_segment(v5):
    ledger, buffer = await v5.buffer(config=ManagedLedgerConfig(max_entries_per_ledger=2))
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"aborted")
    await v5.coordinator.end_transaction(txn, TxnAction.ABORT)
    await eventually(lambda: buffer.is_txn_aborted(txn))
    await buffer.wait_materialised()
    for i in range(4):
        await ledger.append(b"p%d" % i)
    cursor = await ledger.open_cursor("all", "earliest")
    await cursor.ack_cumulative(ledger.lac)
    ledger.set_retention(0, -1)

    gate, put = Gate(), v5.store.put
    v5.store.put = gate.wrap(put, lambda path, *rest: path == buffer_path(SEGMENT))
    await ledger.trim(now_ms=1 << 62)                   # drops the abort: its save is held
    await asyncio.wait_for(gate.held.wait(), 2)

    async def delete_the_segment():
        await buffer.close()
        await ledger.close()
        v5.buffers.remove(buffer)
        v5.ledgers.remove(ledger)
        await clear_segment_state(v5.store, SEGMENT)     # what the buffer's delete() does

    deletion = asyncio.ensure_future(delete_the_segment())
    await asyncio.sleep(0.05)                           # the deletion gets as far as it can
    gate.released.set()
    await asyncio.wait_for(deletion, 2)
    await asyncio.sleep(0.05)                           # a save still under way lands
    v5.store.put = put
    assert await v5.store.get(buffer_path(SEGMENT)) is None
