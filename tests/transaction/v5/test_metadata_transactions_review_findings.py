"""Review findings on v5 (PIP-473) metadata-driven transactions."""

from __future__ import annotations

import asyncio

from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID, header_path

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
