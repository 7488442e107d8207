"""Review findings on v5 (PIP-473) metadata-driven transactions."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_records import (
    ID_BLOCK_PATH,
    V5_COORDINATOR_ID,
    CorruptTxnRecordError,
    header_path,
)

from .conftest import eventually
from .test_header_watch_reopen import HeldRead


async def test_a_header_read_that_straddles_its_collection_is_not_cached_for_good(v5, clock, monkeypatch):
    """A read of a decided header answered before the GC sweep deleted it, and returned after
    the watch told the deletion, cached the decided header again: nothing removes it then (the
    deletion was told already), so every such read left one entry for the broker's life, and
    the cache answered "committed" for a txn that is gone."""
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await v5.coordinator.end_transaction(txn, TxnAction.COMMIT)
    clock.now += 10_000                             # past the retention
    held = HeldRead(v5, header_path(txn), monkeypatch)
    reading = asyncio.create_task(v5.headers.get(txn))      # a late ack's header check, say
    await held.answered.wait()                      # COMMITTED, not returned yet
    assert await v5.coordinator.collect_garbage() == 1
    await eventually(lambda: v5.headers.notifications_applied >= 1, timeout=2)
    held.release()
    state = await reading
    assert state.header is None or state.header.state.final
    assert v5.headers.cached(txn) is None


@pytest.mark.parametrize("value", [b"oops", b"-3", b"1.5", b"true", b"[1]", str(2**64).encode()])
async def test_a_corrupt_id_allocator_record_is_reported_as_corrupt(v5, value):
    """The allocator record `/txn-coordinator/v5/next-id` was read with `int(json.loads())`:
    `1.5` or `true` were taken as 1 (ids handed out again: NEW_TXN then failed on the header
    that exists), and text, a negative or an oversized number failed NEW_TXN with a
    ValueError/TypeError/OverflowError (an UnknownError on the wire), unlike every other
    corrupt v5 record (CorruptTxnRecordError, a MetadataError)."""
    await v5.store.put(ID_BLOCK_PATH, value, -1)
    with pytest.raises(CorruptTxnRecordError, match="next-id"):
        await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 1000)
    assert (await v5.store.get(ID_BLOCK_PATH)).value == value      # left as it is
