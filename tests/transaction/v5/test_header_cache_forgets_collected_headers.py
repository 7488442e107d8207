"""The broker's v5 header cache forgets the decided headers the GC sweep deleted while its
watch was down.

A decided header stays cached until the watch tells its deletion (the GC sweep, after the
retention window). The resync after a reopened watch re-read the headers cached OPEN only:
a decided one collected during the outage stayed cached for good - one entry per txn, each
outage, for the broker's life."""

from __future__ import annotations

from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID, header_path

from .conftest import eventually
from .test_header_watch_reopen import while_the_watch_is_down


async def test_a_decided_header_collected_while_the_watch_was_down_leaves_the_cache(v5, clock, monkeypatch):
    _ledger, buffer = await v5.buffer()
    collected = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    kept = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(collected, b"c")
    await buffer.append(kept, b"k")
    await v5.coordinator.end_transaction(collected, TxnAction.COMMIT)
    await eventually(lambda: buffer.ongoing_txns() == [(kept, buffer.ongoing_txns()[0][1])])
    await buffer.wait_materialised()
    clock.now += 10_000
    await v5.coordinator.end_transaction(kept, TxnAction.ABORT)
    await eventually(lambda: buffer.ongoing_txns() == [])
    await buffer.wait_materialised()
    assert v5.headers.cached(collected).header.state.final

    async def collect():
        assert await v5.coordinator.collect_garbage() == 1       # `collected` only: past retention
        assert await v5.store.get(header_path(collected)) is None

    await while_the_watch_is_down(v5, monkeypatch, collect)
    await eventually(lambda: v5.headers.cached(collected) is None, timeout=1)
    assert v5.headers.cached(kept).header.state.final              # still there: kept cached
