"""A broker's cache of v5 transaction headers: how participants learn decisions.

PIP-473 participants never hear from the coordinator: they cache the headers of the txns they
hold writes or acks of, and a watch tells them when a header leaves OPEN. One cache serves
every v5 buffer and pending-ack store of a broker, fed by ONE range watch on
`idx:txn-by-final-state` (every header entering COMMITTED/ABORTED) instead of a point watch
per header: the same information, at a cost that does not grow with the number of txns.

Listeners (`subscribe`) run once per txn, when its header is seen final — or gone (collected,
or never created): the caller treats that as aborted, as the spec's "unknown txn at the
retention horizon". A watch notification can be lost (a dropped connection, a bug: the risk
raised when PIP-473 was voted), so `recheck_expired` — run every `recheck_interval_s` —
re-reads each cached OPEN header with listeners whose deadline has passed: a stuck read
horizon is bounded by the txn's timeout plus the coordinator's timeout sweep, never longer.
A watch that fails (for instance compacted history after a long disconnection) is reopened,
backed off while it keeps failing, and every cached OPEN header re-read (also those nobody
subscribed to yet: a participant reads a header, then subscribes later; one whose re-read fails
is re-read at each recheck until it succeeds); a read of a header
in flight across the reopen is repeated, as its answer may predate a decision the broken
watch lost. Cached decided headers are re-read too: those collected meanwhile are dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from pyengine.metadata import MetadataStore, MetadataStoreError, Notification, NotificationType, Watch
from pyengine.transaction.coordinator.clock import Clock, wall_clock_ms
from pyengine.transaction.coordinator.metadata_records import (
    IDX_FINAL,
    CorruptTxnRecordError,
    TxnHeader,
    declare_indexes,
    header_path,
    txn_of_path,
)
from pyengine_kernels import TxnId

log = logging.getLogger(__name__)

Listener = Callable[[TxnId, "TxnHeader | None"], None]
DEFAULT_RECHECK_INTERVAL_S = 0.5
REOPEN_DELAY_MIN_S = 0.01        # first wait before reopening a failed header watch


@dataclass(slots=True)
class CachedHeader:
    header: TxnHeader | None        # None: no such header (collected or never created)
    revision: int                   # the store revision this state is as of


class TxnHeaderCache:
    def __init__(self, store: MetadataStore, *, clock: Clock = wall_clock_ms,
                 recheck_interval_s: float = DEFAULT_RECHECK_INTERVAL_S) -> None:
        if recheck_interval_s <= 0:
            raise ValueError("recheck_interval_s must be > 0")
        self.store = store
        self.clock = clock
        self.recheck_interval_s = recheck_interval_s
        self._entries: dict[TxnId, CachedHeader] = {}
        self._reading: dict[TxnId, int] = {}             # txn -> gets in flight
        self._deleted: dict[TxnId, int] = {}             # txn -> revision of its header's deletion
        #                                                  told while a get of it was in flight
        self._reopens = 0                                # watch generation: bumped by each reopen
        self._unsynced: set[TxnId] = set()               # resync re-reads that failed: redone
        self._uncollected: set[TxnId] = set()            # decided ones to re-read: collected?
        self._listeners: dict[TxnId, list[Listener]] = {}
        self._watch: Watch | None = None
        self._tasks: list[asyncio.Task] = []
        self._closed = False
        self.notifications_applied = 0
        self.rechecks_resolved = 0

    async def start(self) -> TxnHeaderCache:
        declare_indexes(self.store)
        self._watch = await self.store.range_watch(IDX_FINAL)
        self._tasks = [asyncio.create_task(self._follow(), name="v5-header-watch"),
                       asyncio.create_task(self._recheck_loop(), name="v5-header-recheck")]
        return self

    async def close(self) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._listeners.clear()

    # --- reads ----------------------------------------------------------------------------

    def cached(self, txn: TxnId) -> CachedHeader | None:
        return self._entries.get(txn)

    async def get(self, txn: TxnId, *, fresh: bool = False) -> CachedHeader:
        """The header of `txn`: from the cache (kept current by the watch), or read from the
        store when not cached, or cached OPEN and `fresh`. A missing header is not cached."""
        entry = self._entries.get(txn)
        if entry is not None and (not fresh or (entry.header is not None and entry.header.state.final)):
            return entry
        self._reading[txn] = self._reading.get(txn, 0) + 1
        try:
            while True:
                reopens = self._reopens
                record = await self.store.get(header_path(txn))
                if self._reopens == reopens:
                    break
                # The watch was reopened while this read was in flight: its answer may predate
                # a decision the broken watch lost, and the resync did not know of this read.
        finally:
            left = self._reading[txn] - 1
            deleted_at = self._deleted.get(txn)
            if left:
                self._reading[txn] = left
            else:
                del self._reading[txn]
                self._deleted.pop(txn, None)
        if record is not None and deleted_at is not None and record.mod_revision < deleted_at:
            # Read before the GC sweep deleted it, returned after the watch told so: cached,
            # the decided header would stay for good (its deletion is told only once).
            record = None
        if record is None:          # not cached: unknown ids must not fill the memory
            self._entries.pop(txn, None)
            self._fire(txn, None)
            return CachedHeader(None, 0)
        return self._apply(txn, CachedHeader(TxnHeader.decode(record.value, record.path), record.mod_revision))

    def _apply(self, txn: TxnId, state: CachedHeader) -> CachedHeader:
        """Keep the newer of the cached and the given state (a final one is terminal: only
        the header's deletion replaces it); fire the listeners on a final one."""
        current = self._entries.get(txn)
        if current is not None and current.header is not None and (
                current.header.state.final or state.revision < current.revision):
            return current
        self._entries[txn] = state
        if state.header is not None and state.header.state.final:
            self._fire(txn, state.header)
        return state

    # --- listeners ------------------------------------------------------------------------

    def subscribe(self, txn: TxnId, listener: Listener) -> None:
        """`listener(txn, header)` runs once (soon, on the loop) when `txn` is seen final, or
        gone (header None). Subscribe after a `get` that cached the txn."""
        entry = self._entries.get(txn)
        if entry is not None and (entry.header is None or entry.header.state.final):
            asyncio.get_running_loop().call_soon(_safe, listener, txn, entry.header)
            return
        self._listeners.setdefault(txn, []).append(listener)

    def unsubscribe(self, txn: TxnId, listener: Listener) -> None:
        listeners = self._listeners.get(txn)
        if listeners and listener in listeners:
            listeners.remove(listener)
            if not listeners:
                del self._listeners[txn]

    def watched(self) -> list[TxnId]:
        return list(self._listeners)

    def _fire(self, txn: TxnId, header: TxnHeader | None) -> None:
        for listener in self._listeners.pop(txn, ()):
            _safe(listener, txn, header)

    # --- the watch ------------------------------------------------------------------------

    async def _follow(self) -> None:
        delay = REOPEN_DELAY_MIN_S
        while not self._closed:
            watch = self._watch
            assert watch is not None
            try:
                async for notification in watch:
                    self._on_notification(notification)
                    delay = REOPEN_DELAY_MIN_S          # it works: a next failure backs off anew
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("v5 header watch failed (%s): reopening it and re-reading watched headers", exc)
            while not self._closed:
                # Backed off, doubling up to the recheck interval: a watch that fails as soon as
                # it is open (or a store that refuses it) must not spin the event loop.
                await asyncio.sleep(delay)
                delay = min(2 * delay, self.recheck_interval_s)
                try:
                    self._watch = await self.store.range_watch(IDX_FINAL)
                    self._reopens += 1
                    break
                except MetadataStoreError as exc:
                    log.warning("reopening the v5 header watch failed: %s", exc)
            if self._closed:
                if self._watch is not None:
                    self._watch.close()         # reopened as close() ran
                return
            self._unsynced.update(self._maybe_stale())
            await self._resync()
            self._uncollected.update(txn for txn, entry in self._entries.items()
                                     if entry.header is not None and entry.header.state.final)
            await self._forget_collected()

    async def _resync(self) -> None:
        """Re-read the headers whose decision a broken watch may have lost. One whose read
        fails stays to re-read (the recheck loop retries it): skipped, a decision lost with the
        watch would wait for the txn's deadline (hours) to be seen."""
        for txn in list(self._unsynced):
            try:
                await self.get(txn, fresh=True)
            except MetadataStoreError as exc:
                log.warning("re-reading the header of %s failed (retried): %s", txn, exc)
                continue
            except CorruptTxnRecordError as exc:
                log.warning("re-reading the header of %s failed: %s", txn, exc)
            self._unsynced.discard(txn)

    async def _forget_collected(self) -> None:
        """Drop the cached decided headers (`_uncollected`) that are gone: the broken watch may
        have lost their deletion (the GC sweep), the only thing that drops them - cached for
        good, else. One whose re-read fails stays, re-read at the next recheck."""
        for txn in list(self._uncollected):
            try:
                gone = await self.store.get(header_path(txn)) is None
            except MetadataStoreError as exc:
                log.warning("re-reading the header of %s failed (retried): %s", txn, exc)
                continue
            self._uncollected.discard(txn)
            entry = self._entries.get(txn)
            if gone and entry is not None and entry.header is not None and entry.header.state.final:
                del self._entries[txn]

    def _maybe_stale(self) -> list[TxnId]:
        """The txns whose decision a broken watch may have lost: the watched ones, and every
        one cached OPEN (its reader may subscribe only now)."""
        cached_open = (txn for txn, entry in self._entries.items()
                       if entry.header is not None and not entry.header.state.final)
        return list(dict.fromkeys([*self._listeners, *cached_open]))

    def _on_notification(self, notification: Notification) -> None:
        try:
            txn = txn_of_path(notification.path)
        except CorruptTxnRecordError:
            return
        if txn not in self._entries and txn not in self._reading and txn not in self._listeners:
            return              # nobody here cares about this txn
        self.notifications_applied += 1
        if notification.type is NotificationType.DELETED:
            if notification.record is None:     # the header itself is gone (GC)
                if txn in self._reading:
                    self._deleted[txn] = notification.revision
                self._entries.pop(txn, None)
                self._fire(txn, None)
            return
        assert notification.record is not None
        try:
            header = TxnHeader.decode(notification.record.value, notification.path)
        except CorruptTxnRecordError as exc:
            log.error("%s", exc)
            return
        self._apply(txn, CachedHeader(header, notification.revision))

    # --- deadline re-read -----------------------------------------------------------------

    async def recheck_expired(self) -> int:
        """Re-read the cached OPEN headers past their deadline that someone waits on; returns
        how many turned out final (or gone): decisions whose notification never arrived."""
        now = self.clock()
        resolved = 0
        for txn in self.watched():
            entry = self._entries.get(txn)
            if entry is None or entry.header is None or entry.header.state.final:
                continue
            if entry.header.timeout_ms > now:
                continue
            try:
                state = await self.get(txn, fresh=True)
            except (MetadataStoreError, CorruptTxnRecordError) as exc:
                log.warning("re-reading the expired header of %s failed: %s", txn, exc)
                continue
            if state.header is None or state.header.state.final:
                resolved += 1
        self.rechecks_resolved += resolved
        return resolved

    async def _recheck_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.recheck_interval_s)
            try:
                if self._unsynced:
                    await self._resync()
                if self._uncollected:
                    await self._forget_collected()
                await self.recheck_expired()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the v5 header deadline re-read failed; retrying")


def _safe(listener: Listener, txn: TxnId, header: TxnHeader | None) -> None:
    try:
        listener(txn, header)
    except Exception:
        log.exception("a v5 header listener failed for %s", txn)
