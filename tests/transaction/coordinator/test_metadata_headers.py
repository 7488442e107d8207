"""The v5 header cache's watch: a failed watch is reopened, backed off while it keeps failing,
and the headers someone waits on are re-read, so no decision is missed."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.metadata import MetadataStoreError, Watch
from pyengine.metadata.memory_store import MemoryMetadataStore
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_coordinator import MetadataTransactionCoordinator
from pyengine.transaction.coordinator.metadata_headers import TxnHeaderCache
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID


class FlakyStore(MemoryMetadataStore):
    """Range watches fail: `broken` ones are open but fail at once, `refused` ones are not
    even opened; then they work again. `range_watches` counts the attempts."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = 0
        self.refused = 0
        self.range_watches = 0
        self.opened: list[Watch] = []

    async def range_watch(self, *args, **kwargs) -> Watch:
        self.range_watches += 1
        if self.refused:
            self.refused -= 1
            raise MetadataStoreError("the store refuses watches")
        watch = await super().range_watch(*args, **kwargs)
        if self.broken:
            self.broken -= 1
            watch._fail(MetadataStoreError("the watch broke"))
        self.opened.append(watch)
        return watch


async def wait_for(predicate, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"not true after {timeout} s"
        await asyncio.sleep(0.005)


@pytest.fixture
async def cache_on_flaky_store():
    store = FlakyStore()
    await store.start()
    coordinator = MetadataTransactionCoordinator(store)
    await coordinator.start(sweep=False)
    cache = await TxnHeaderCache(store, recheck_interval_s=0.2).start()
    yield store, coordinator, cache
    await cache.close()
    await coordinator.close()
    await store.close()


async def decided_while_the_watch_is_down(store, coordinator, cache) -> tuple[list, object]:
    """A txn someone waits on, committed while the cache's watch is broken."""
    txn = await coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await cache.get(txn)
    seen: list = []
    cache.subscribe(txn, lambda t, header: seen.append((t, header.state.name if header else None)))
    cache._watch._fail(MetadataStoreError("connection lost"))
    await coordinator.end_transaction(txn, TxnAction.COMMIT)
    return seen, txn


async def test_a_watch_that_keeps_failing_is_backed_off_and_the_decision_still_arrives(cache_on_flaky_store):
    store, coordinator, cache = cache_on_flaky_store
    store.broken = 1_000_000                      # every reopened watch fails at once
    seen, txn = await decided_while_the_watch_is_down(store, coordinator, cache)
    await wait_for(lambda: seen)                  # re-read after a reopening
    assert seen == [(txn, "COMMITTED")]
    attempts = store.range_watches
    await asyncio.sleep(0.5)
    # Backed off (0.01 s doubling up to the 0.2 s recheck interval): a handful of attempts,
    # where reopening at once would spin the event loop through thousands.
    assert 1 <= store.range_watches - attempts <= 6
    store.broken = 0
    await wait_for(lambda: store.opened and not store.opened[-1].closed)
    later = await coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await cache.get(later)
    await coordinator.end_transaction(later, TxnAction.ABORT)
    await wait_for(lambda: cache.notifications_applied > 0)   # the watch itself works again
    assert cache.cached(later).header.state.name == "ABORTED"


async def test_a_store_that_refuses_the_watch_is_retried_until_it_takes_it(cache_on_flaky_store):
    store, coordinator, cache = cache_on_flaky_store
    store.refused = 4
    seen, txn = await decided_while_the_watch_is_down(store, coordinator, cache)
    await wait_for(lambda: seen, timeout=5.0)
    assert seen == [(txn, "COMMITTED")]
    assert store.refused == 0 and not store.opened[-1].closed


async def test_closing_during_the_back_off_ends_the_follower(cache_on_flaky_store):
    store, coordinator, cache = cache_on_flaky_store
    store.broken = 1_000_000
    cache._watch._fail(MetadataStoreError("connection lost"))
    await asyncio.sleep(0.05)
    await cache.close()
    assert all(task.done() for task in cache._tasks)
    assert all(watch.closed for watch in store.opened)
