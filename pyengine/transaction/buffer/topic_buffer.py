"""v4 transaction buffer of a `persistent://` topic (Pulsar's TopicTransactionBuffer, PIP-31).

Transactional entries go straight into the topic's managed ledger; a commit or abort appends a
marker entry. The buffer keeps what READ_COMMITTED readers need:

* the ongoing txns, each with the position of its first entry: readers stop before the first
  entry of the oldest one (the max read position), which otherwise follows the LAC;
* the aborted txns with their abort marker positions: their entries are never delivered;
* per coordinator, the low watermark (every txn up to it has ended) and the txns that ended
  here above it: none of them may write here again.

Positions are registered the moment the ledger assigns them, before the entry is durable and
before any reader can reach it, so a plain entry appended after a txn entry can never move the
horizon past it. The horizon is computed from the LAC on demand, so it follows plain appends
whenever no txn is open, also right after recovery (Pulsar #14097, #12382).

State survives restarts through the stream itself (markers) plus periodic snapshots; recovery
loads the snapshot and replays the entries after its max read position in chunks.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyengine.errors import (
    InvalidTxnStatusError,
    NotAllowedError,
    PersistenceError,
    PulsarError,
    ServiceNotReadyError,
    TopicTerminatedError,
)
from pyengine.storage import ManagedLedger, StorageError
from pyengine.storage import TopicTerminatedError as LedgerTerminatedError
from pyengine.storage.entry import Entry
from pyengine.storage.environment import WriteFn
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer import BufferState, TransactionBuffer
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine.transaction.buffer.ended import EndedTxns
from pyengine.transaction.buffer.markers import marker_entry
from pyengine.transaction.buffer.replay import load_snapshot, read_horizon, replay_entry
from pyengine.transaction.buffer.snapshot import SnapshotStore, TransactionBufferSnapshot
from pyengine.transaction.outcome import Outcome, mark_retrieved
from pyengine_kernels import AbortedTxnSet, OngoingTxnMap, Position, TxnId

log = logging.getLogger(__name__)

# PIP-373: the managed-ledger property saying the topic has held transactional entries. A topic
# without it has nothing to recover: its buffer is ready at once, with no replay.
TXN_PROPERTY = "__contains_txn_messages"


@dataclass(slots=True)
class _QueuedAppend:
    txn: TxnId
    data: bytes
    num_messages: int
    publish_time: int
    future: asyncio.Future[Position]
    after: asyncio.Future[Any] | None


class TopicTransactionBuffer(TransactionBuffer):
    """The transaction buffer of one managed ledger. Call `await recover()` before serving.

    Additions to the interface: `take_snapshot()` (write a snapshot now: admin, tests),
    `ongoing_txns()` and `low_watermark()` (introspection for the dispatcher and admin).
    """

    def __init__(self, ledger: ManagedLedger, config: TopicTransactionBufferConfig | None = None) -> None:
        if not isinstance(ledger, ManagedLedger):
            raise TypeError(f"ledger must be a ManagedLedger, not {type(ledger).__name__}")
        if config is not None and not isinstance(config, TopicTransactionBufferConfig):
            raise TypeError(f"config must be a TopicTransactionBufferConfig, not {type(config).__name__}")
        self.ledger = ledger
        self.config = config or TopicTransactionBufferConfig()
        self.state = BufferState.NONE
        self._ongoing = OngoingTxnMap()
        self._ongoing_least_bits: dict[int, list[int]] = {}     # coordinator -> heap (may hold stale ids)
        self._aborted = AbortedTxnSet()
        self._ended = EndedTxns()
        # txn -> (action, outcome, its marker's position: None if the append failed at once)
        self._ending: dict[TxnId, tuple[TxnAction, Outcome[None], Position | None]] = {}
        self._queued: deque[_QueuedAppend] = deque()
        self._transactional = ledger.properties.get(TXN_PROPERTY) == "true"
        self._marking: asyncio.Task | None = None     # writing the PIP-373 property
        self._verified = Position.EARLIEST      # replay progress while INITIALIZING
        self._recovered: asyncio.Future[None] | None = None
        self._listeners: list[Callable[[], None]] = []
        self._background: set[asyncio.Task] = set()
        self._snapshots = SnapshotStore(ledger.env, ledger.topic_id,
                                        segment_aborts=self.config.snapshot_segment_aborts)
        self._snapshot_timer: asyncio.TimerHandle | None = None
        self._ended_since_snapshot = 0
        self._queued_snapshot_position: Position | None = None
        self._last_snapshot_ms = 0
        self._last_snapshot_position: Position | None = None
        self._trim_snapshot: tuple[Position, int] | None = None     # carried by a trim not settled yet
        # Txns ended on the terminated topic (no marker) whose snapshot is not durable yet: a
        # repeated end writes it again before it answers.
        self._unsaved_ends: set[TxnId] = set()
        self._committed_total = 0
        self._aborted_total = 0
        self._recover_start_ms = 0
        self._recover_end_ms = 0
        self._replayed_entries = 0
        ledger.add_listener(self._on_lac_moved)
        ledger.add_trim_writer(self._snapshot_for_trim)
        ledger.add_trim_listener(self._on_trimmed)
        ledger.add_trim_bound(self._trim_bound)     # an open transaction's entries stay
        ledger.add_failure_listener(self._on_append_failed)

    # --- reads ----------------------------------------------------------------------------

    def max_read_position(self) -> Position:
        if self.state is BufferState.INITIALIZING:
            return self._horizon(self._verified)
        if self.state is BufferState.NONE:
            return Position.EARLIEST        # nothing verified yet
        return self._horizon(self.ledger.lac)

    def is_txn_aborted(self, txn: TxnId) -> bool:
        _check_txn(txn)
        return txn in self._aborted

    @property
    def aborted(self) -> AbortedTxnSet:
        """Recovery replaces the set (it loads the snapshot's): read it through this property."""
        return self._aborted

    def ongoing_txns(self) -> list[tuple[TxnId, Position]]:
        """The open txns with the position of their first entry, oldest first."""
        return self._ongoing.items()

    def low_watermark(self, coordinator_id: int) -> int:
        """The low watermark of `coordinator_id` known here (-1: none yet)."""
        return self._ended.low_watermark(coordinator_id)

    def _horizon(self, limit: Position) -> Position:
        """`limit`, or the position just before the first entry of the oldest open txn if lower.
        A txn's first position may not be durable yet (it can lie beyond `limit`): hence the min."""
        return read_horizon(self._ongoing, limit, self.ledger.previous_position)

    # --- appends --------------------------------------------------------------------------

    def append(self, txn: TxnId, data: bytes, *, num_messages: int = 1,
               publish_time: int = 0) -> asyncio.Future[Position]:
        if type(txn) is not TxnId:
            _check_txn(txn)
        if type(data) is not bytes:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"data must be bytes, not {type(data).__name__}")
            data = bytes(data)
        if type(num_messages) is not int or num_messages < 1:
            _check_int("num_messages", num_messages, minimum=1)
        if type(publish_time) is not int or publish_time < 0:
            _check_int("publish_time", publish_time, minimum=0)
        return self.append_checked(txn, data, num_messages, publish_time)

    def append_checked(self, txn: TxnId, data: bytes, num_messages: int, publish_time: int,
                       after: asyncio.Future[Any] | None = None) -> asyncio.Future[Position]:
        """`append` without the checks of its arguments: the broker's publish path, whose
        callers decoded or built them (`after`: see TransactionBuffer.append_checked)."""
        if after is not None and after.done():
            if after.cancelled() or after.exception() is not None:
                return _failed(asyncio.get_running_loop(), StorageError(
                    f"not written: the registration of {self.ledger.name} with {txn} failed"))
            after = None
        if self.state is not BufferState.READY or not self._transactional or self._queued:
            return self._append_queued(txn, data, num_messages, publish_time, after)
        # A txn already open here (and not being ended) has not ended: skip the checks.
        ongoing = txn in self._ongoing and txn not in self._ending
        if not ongoing and self._has_ended(txn):
            # Apache's answer (TopicTransactionBuffer): NotAllowedException, this message.
            return _failed(asyncio.get_running_loop(), NotAllowedError(
                f"Transaction [{txn}] has been ended. Please use a new transaction to send message."))
        try:
            position, durable = self.ledger.append_entry(
                data, txn_most=txn.most_bits, txn_least=txn.least_bits,
                num_messages=num_messages, publish_time=publish_time, after=after)
        except StorageError as exc:
            return _failed(asyncio.get_running_loop(), exc)
        if position is not None and not ongoing:
            self._register(txn, position)
        return durable

    def _append_queued(self, txn: TxnId, data: bytes, num_messages: int, publish_time: int,
                       after: asyncio.Future[Any] | None) -> asyncio.Future[Position]:
        loop = asyncio.get_running_loop()
        if self.state is BufferState.CLOSED:
            return _failed(loop, ServiceNotReadyError(f"the transaction buffer of {self.ledger.name} is closed"))
        # Until recovery is over (the ended txns are not all known yet), and until the topic is
        # durably marked as transactional, appends wait here in order (as Pulsar's do).
        future: asyncio.Future[Position] = loop.create_future()
        self._queued.append(_QueuedAppend(txn, data, num_messages, publish_time, future, after))
        if self.state is BufferState.READY:
            self._release_queue()
        return future

    def _on_append_failed(self, first_failed: Position) -> None:
        """Appends failed: nothing from `first_failed` on is durable, so a txn whose first
        position is there has no entry on this topic (its later appends failed too)."""
        gone = [txn for txn, first in self._ongoing.items() if first >= first_failed]
        for txn in gone:
            self._ongoing.remove(txn)
        if gone:
            self._notify()

    def _register(self, txn: TxnId, position: Position) -> None:
        if self._ongoing.add(txn, position):
            heapq.heappush(self._ongoing_least_bits.setdefault(txn.most_bits, []), txn.least_bits)

    def _has_ended(self, txn: TxnId) -> bool:
        return (txn in self._ending or self._ended.outcome(txn) is not None or txn in self._aborted
                or self._ended.is_below_low_watermark(txn))

    def _release_queue(self) -> None:
        if self._transactional:
            self._flush_queue()
        else:
            self._mark_transactional()

    def _mark_transactional(self) -> asyncio.Task:
        """First transactional entry ever (a txn's entry, or a marker): make the PIP-373
        property durable before any such entry can be (else a crash could leave them on a topic
        that recovers without replay), then release the queued appends."""
        if self._marking is None:
            self._marking = self._spawn(self._write_txn_property())
        return self._marking

    async def _write_txn_property(self) -> None:
        try:
            await self.ledger.set_property(TXN_PROPERTY, "true")
        except (StorageError, PulsarError) as exc:
            self._marking = None
            error = PersistenceError(f"cannot mark {self.ledger.name} as transactional: {exc}")
            self._fail_queue(error)
            raise error from exc
        self._marking = None
        self._transactional = True
        if self.state is not BufferState.READY:
            return
        self._write_snapshot()        # recovery starts here (Pulsar's first snapshot)
        self._schedule_snapshot_timer()
        self._flush_queue()

    def _flush_queue(self) -> None:
        # Taken all at once: with the queue empty, each append goes through in its turn.
        queued, self._queued = self._queued, deque()
        for item in queued:
            if not item.future.done():
                _chain(self.append_checked(item.txn, item.data, item.num_messages, item.publish_time, item.after),
                       item.future)

    def _fail_queue(self, error: Exception) -> None:
        while self._queued:
            item = self._queued.popleft()
            if not item.future.done():
                item.future.set_exception(error)

    # --- commit and abort -----------------------------------------------------------------

    async def commit(self, txn: TxnId, low_watermark: int, *, after: asyncio.Future[Any] | None = None) -> None:
        await self._end(txn, TxnAction.COMMIT, low_watermark, after)

    async def abort(self, txn: TxnId, low_watermark: int, *, after: asyncio.Future[Any] | None = None) -> None:
        await self._end(txn, TxnAction.ABORT, low_watermark, after)

    def end_now(self, txn: TxnId, action: TxnAction, low_watermark: int, *,
                after: asyncio.Future[Any] | None = None) -> asyncio.Future[None] | None:
        """`commit` / `abort` without a coroutine, when the buffer can take the marker at once
        (ready, transactional, not terminated, `txn` not ended or ending here): the marker is
        queued before this returns (so with `after`, the decision's write, it joins that
        group commit) and the future resolves as the coroutine would return. None: anything
        else (a repeat, a recovering buffer, ...): await `commit` / `abort`, which handle it."""
        _check_end(txn, low_watermark, after)
        if (self.state is not BufferState.READY or not self._transactional or self.ledger.terminated_at is not None
                or self._known_outcome(txn) is not None
                or (txn not in self._ongoing and self._ended.is_below_low_watermark(txn))):
            return None
        try:
            done, durable = self._queue_marker(txn, action, after)
        except StorageError:
            return None                     # the coroutine raises it as the caller expects
        ended = asyncio.get_running_loop().create_future()
        durable.add_done_callback(partial(self._marker_written_now, txn, action, done, low_watermark, ended))
        return ended

    def _marker_written_now(self, txn: TxnId, action: TxnAction, done: Outcome[None], low_watermark: int,
                            ended: asyncio.Future[None], durable: asyncio.Future[Position]) -> None:
        """`end_now`'s marker is settled: what `_end` does after `_end_on_topic` returns."""
        self._marker_written(txn, action, done, durable)
        error = durable.exception()
        if error is not None:
            if not ended.done():            # done: its caller was cancelled
                ended.set_exception(_persistence_error(error))
            return
        aborts = self._apply_low_watermark(txn.most_bits, low_watermark)
        self._after_end()
        if not aborts:
            if not ended.done():
                ended.set_result(None)
            return
        # As `_end` waits for them (quietly: each one logs its own failure).
        gathered = asyncio.gather(*aborts, return_exceptions=True)
        gathered.add_done_callback(lambda _: None if ended.done() else ended.set_result(None))

    async def _end(self, txn: TxnId, action: TxnAction, low_watermark: int,
                   after: asyncio.Future[Any] | None) -> None:
        _check_end(txn, low_watermark, after)
        await self._wait_ready()
        await self._end_on_topic(txn, action, after)
        aborts = self._apply_low_watermark(txn.most_bits, low_watermark)
        self._after_end()
        if aborts:
            await asyncio.gather(*aborts, return_exceptions=True)

    async def _end_on_topic(self, txn: TxnId, action: TxnAction, after: asyncio.Future[Any] | None = None) -> None:
        """Write the marker (durable with or after `after`, the decision) and, once it is
        durable, end `txn` here. Idempotent."""
        while True:
            if self.state is not BufferState.READY:
                raise ServiceNotReadyError(f"the transaction buffer of {self.ledger.name} is {self.state.value}")
            known = self._known_outcome(txn)
            if known is not None and known is not action:
                raise InvalidTxnStatusError(
                    f"cannot {action.name.lower()} txn {txn} on {self.ledger.name}: it already ended "
                    f"with {known.name.lower()}")
            ending = self._ending.get(txn)
            if ending is not None:
                await ending[1].waiter()        # a cancelled caller cancels nothing else
                return
            if known is action:
                if txn in self._unsaved_ends:
                    await self._save_terminated_end(txn)
                return
            if txn not in self._ongoing and self._ended.is_below_low_watermark(txn):
                return      # ended long ago (its coordinator says so); nothing of it is here to decide
            if self._transactional:
                break
            # A marker is a transactional entry too: recovery must replay it. Then look again,
            # the txn may have moved on while the property was written.
            await asyncio.shield(self._mark_transactional())
        if self.ledger.terminated_at is not None:
            if after is not None:
                # No marker is written with the decision here: applied before it is durable,
                # the end stayed though the decision failed (the txn open again, and its abort
                # then a conflict). Then look again: the txn may have moved on meanwhile.
                await asyncio.wait([after])
                if after.cancelled() or after.exception() is not None:
                    raise PersistenceError(f"cannot end txn {txn} on {self.ledger.name}: its coordinator's "
                                           f"decision was not written")
                await self._end_on_topic(txn, action)
                return
            await self._end_on_terminated_topic(txn, action)
            return
        try:
            done, durable = self._queue_marker(txn, action, after)
        except StorageError as exc:
            raise _persistence_error(exc) from exc
        durable.add_done_callback(partial(self._marker_written, txn, action, done))
        await done.waiter()

    def _queue_marker(self, txn: TxnId, action: TxnAction,
                      after: asyncio.Future[Any] | None) -> tuple[Outcome[None], asyncio.Future[Position]]:
        """Append `txn`'s marker (durable with or after `after`) and count the txn as ending
        here: its outcome, and the marker's write (raises StorageError)."""
        data, marker_type, publish_time = marker_entry(action, txn)
        position, durable = self.ledger.append_entry(
            data, txn_most=txn.most_bits, txn_least=txn.least_bits, marker_type=marker_type,
            publish_time=publish_time, after=after)
        done: Outcome[None] = Outcome()
        self._ending[txn] = (action, done, position)
        return done, durable

    async def _end_on_terminated_topic(self, txn: TxnId, action: TxnAction) -> None:
        """A terminated ledger takes no entry, not even a marker; retrying one would never end
        (the coordinator's end of the txn hung). No late write can reach this topic either, so
        the outcome needs no marker to refuse one: it is applied here, and when the txn has
        entries (written before the termination) a snapshot records it, which recovery's
        replay of those entries obeys."""
        had_entries = txn in self._ongoing
        # An aborted txn's entries are hidden as if its marker were the last entry.
        self._apply_end(txn, action, self.ledger.lac if had_entries else None)
        if had_entries:
            if action is TxnAction.COMMIT:
                # Nothing else would tell a replay of its entries that it ended, once a low
                # watermark pruned its record (it was open again, then aborted by that watermark).
                self._ended.add_unmarked_commits(txn.most_bits, [txn.least_bits])
            self._unsaved_ends.add(txn)
            await self._save_terminated_end(txn)

    async def _save_terminated_end(self, txn: TxnId) -> None:
        """Write the snapshot that records `txn`'s end on the terminated topic. A failure is
        the end's: answered done, the coordinator would forget the txn while a restart found it
        open here again (and a later low watermark aborted it, a commit included)."""
        try:
            await self._write_snapshot()
        except (StorageError, PulsarError) as exc:      # the snapshot timer tries again too
            self._schedule_snapshot_timer()
            raise _persistence_error(exc) from exc
        self._unsaved_ends.discard(txn)

    def _marker_written(self, txn: TxnId, action: TxnAction, done: Outcome[None],
                        durable: asyncio.Future[Position]) -> None:
        del self._ending[txn]
        error = durable.exception()
        if error is not None:
            if txn in self._ongoing:        # still open: let a later watermark find it again
                heapq.heappush(self._ongoing_least_bits.setdefault(txn.most_bits, []), txn.least_bits)
            done.set_exception(_persistence_error(error))
            return
        self._apply_end(txn, action, durable.result())
        done.set_result(None)

    def _apply_end(self, txn: TxnId, action: TxnAction, abort_position: Position | None) -> None:
        """`txn` ended here; if aborted, its entries are hidden, the abort being remembered
        at `abort_position` (its marker's: aborts are trimmed with the ledgers before it)."""
        if action is TxnAction.ABORT:
            if abort_position is not None:
                self._aborted.add(txn, abort_position)
            self._aborted_total += 1
        else:
            self._committed_total += 1
        self._ongoing.remove(txn)
        self._ended.add(txn, action)
        self._ended_since_snapshot += 1

    def _known_outcome(self, txn: TxnId) -> TxnAction | None:
        ending = self._ending.get(txn)
        if ending is not None:
            return ending[0]
        outcome = self._ended.outcome(txn)
        if outcome is not None:
            return outcome
        return TxnAction.ABORT if txn in self._aborted else None

    def _after_end(self) -> None:
        if self._ended_since_snapshot >= self.config.snapshot_max_txn_count:
            self._write_snapshot()
        self._notify()

    def _apply_low_watermark(self, coordinator_id: int, low_watermark: int) -> list[asyncio.Task]:
        """Pulsar's handleLowWaterMark: raise the coordinator's watermark, then abort every txn
        of it still open here at or below the watermark. The coordinator ended those without
        this topic hearing of it (a late write, a lost end request): left open, they would hold
        the max read position back forever (Pulsar #19200)."""
        self._ended.advance_low_watermark(coordinator_id, low_watermark)
        current = self._ended.low_watermark(coordinator_id)
        heap = self._ongoing_least_bits.get(coordinator_id)
        aborts = []
        while heap and heap[0] <= current:
            txn = TxnId(coordinator_id, heapq.heappop(heap))
            if txn in self._ongoing and txn not in self._ending:
                log.warning("%s: aborting txn %s, below the low watermark %d of its coordinator",
                            self.ledger.name, txn, current)
                aborts.append(self._spawn(self._abort_ended_txn(txn)))
        return aborts

    async def _abort_ended_txn(self, txn: TxnId) -> None:
        try:
            await self._end_on_topic(txn, TxnAction.ABORT)
        except PulsarError as exc:
            log.warning("%s: could not abort txn %s below the low watermark: %s", self.ledger.name, txn, exc)
            return
        except Exception:               # its caller gathers these quietly: say it here
            log.exception("%s: aborting txn %s below the low watermark failed", self.ledger.name, txn)
            raise
        self._after_end()

    async def _wait_ready(self) -> None:
        if self.state is BufferState.INITIALIZING and self._recovered is not None:
            await asyncio.shield(self._recovered)
        if self.state is not BufferState.READY:
            raise ServiceNotReadyError(f"the transaction buffer of {self.ledger.name} is {self.state.value}")

    # --- recovery -------------------------------------------------------------------------

    async def recover(self) -> None:
        if self.state is BufferState.READY:
            return
        if self.state is BufferState.CLOSED:
            raise ServiceNotReadyError(f"the transaction buffer of {self.ledger.name} is closed")
        if self.state is BufferState.INITIALIZING and self._recovered is not None:
            await asyncio.shield(self._recovered)
            return
        recovered = asyncio.get_running_loop().create_future()
        recovered.add_done_callback(mark_retrieved)
        self._recovered = recovered
        self.state = BufferState.INITIALIZING
        self._recover_start_ms = _now_ms()
        try:
            if self._transactional:
                await self._replay()
        except BaseException as exc:
            failure = ServiceNotReadyError(f"transaction buffer recovery of {self.ledger.name} failed: {exc!r}")
            if self.state is BufferState.INITIALIZING:
                self.state = BufferState.NONE     # recover() may be called again
            self._fail_queue(failure)
            recovered.set_exception(failure)
            raise
        if self.state is not BufferState.INITIALIZING:      # closed meanwhile
            closed = ServiceNotReadyError(f"the transaction buffer of {self.ledger.name} was closed while recovering")
            recovered.set_exception(closed)
            raise closed
        self.state = BufferState.READY
        self._recover_end_ms = _now_ms()
        recovered.set_result(None)
        self._schedule_snapshot_timer()
        aborts = [task for coordinator_id, low_watermark in self._ended.low_watermarks().items()
                  for task in self._apply_low_watermark(coordinator_id, low_watermark)]
        if self._queued:
            self._release_queue()
        self._notify()
        if aborts:
            await asyncio.gather(*aborts, return_exceptions=True)

    async def _replay(self) -> None:
        """Load the snapshot, then rebuild the rest from the entries after its max read
        position, in chunks. Reads skip deleted ledgers (the key range simply has no entries
        there) and only ever move forward to the LAC taken at the start, so a trimmed ledger
        or a snapshot pointing into one can neither fail nor loop (Pulsar #11318, #12494)."""
        first = self.ledger.first_position()
        start = first
        snapshot = self._snapshots.load(first)
        end = self.ledger.lac
        self._ongoing.clear()              # a retry after a failed recovery starts afresh
        self._replayed_entries = 0
        self._ongoing_least_bits = {}
        self._verified = Position.EARLIEST
        self._aborted = AbortedTxnSet()
        self._ended = EndedTxns()
        if snapshot is not None:
            self._aborted, self._ended, start = load_snapshot(snapshot, first)
            self._last_snapshot_ms, self._last_snapshot_position = snapshot.taken_ms, snapshot.max_read_position
            self._queued_snapshot_position = snapshot.max_read_position
            self._verified = min(snapshot.max_read_position, end)
        chunk = self.config.replay_chunk_entries
        while start <= end and self.state is BufferState.INITIALIZING:
            entries = self.ledger.read_entries(start, chunk, end)
            if not entries:
                break
            for entry in entries:
                self._replay_entry(entry)
            self._replayed_entries += len(entries)
            self._verified = entries[-1].position
            start = self._verified.next()
            self._notify()
            await asyncio.sleep(0)
        self._verified = end

    def _replay_entry(self, entry: Entry) -> None:
        started = replay_entry(self._ongoing, self._aborted, self._ended, entry.position,
                               entry.txn_most, entry.txn_least, entry.marker_type)
        if started is not None:
            heapq.heappush(self._ongoing_least_bits.setdefault(started.most_bits, []), started.least_bits)

    # --- snapshots ------------------------------------------------------------------------

    async def take_snapshot(self) -> None:
        """Write a snapshot of the current state now and wait until it is durable. Does
        nothing on a topic that never held transactional entries, or with snapshots off."""
        if self.state is BufferState.READY and self._transactional:
            await self._write_snapshot()

    def _write_snapshot(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        if not self.config.snapshots_enabled:
            done: asyncio.Future[None] = loop.create_future()
            done.set_result(None)
            return done
        position = self._snapshot_position(self.ledger.lac)
        taken_ms = _now_ms()
        snapshot = TransactionBufferSnapshot(position, self._aborted, self._ended, taken_ms)
        self._ended_since_snapshot = 0
        self._queued_snapshot_position = position
        saved = self._snapshots.save(snapshot)
        saved.add_done_callback(partial(self._snapshot_written, position, taken_ms, set(self._unsaved_ends)))
        return saved

    def _snapshot_position(self, limit: Position) -> Position:
        """The max read position a snapshot may record: the horizon, but before every marker
        not applied yet. A marker is durable (the LAC past it) a loop turn before its end is
        applied; a snapshot taken in between (its timer, a trim) without that end but past its
        marker made recovery skip the marker and forget the txn ended."""
        return self._before_unapplied_markers(self._horizon(limit))

    def _trim_bound(self) -> Position:
        # Nor may a trim delete such a marker: its snapshot does not hold the end either.
        return self._before_unapplied_markers(self.max_read_position())

    def _before_unapplied_markers(self, position: Position) -> Position:
        for _action, _done, marker in self._ending.values():
            if marker is not None and marker <= position:
                position = self.ledger.previous_position(marker)
        return position

    def _snapshot_written(self, position: Position, taken_ms: int, ends: set[TxnId],
                          saved: asyncio.Future[None]) -> None:
        if saved.cancelled():                   # the storage closed with it pending
            self._queued_snapshot_position = None
            return
        error = saved.exception()
        if error is not None:
            log.warning("%s: transaction-buffer snapshot failed: %s", self.ledger.name, error)
            self._queued_snapshot_position = None        # the next timer tick retries
            return
        self._unsaved_ends -= ends              # it recorded them
        if taken_ms >= self._last_snapshot_ms:
            self._last_snapshot_ms, self._last_snapshot_position = taken_ms, position

    def _schedule_snapshot_timer(self) -> None:
        if (self._snapshot_timer is None and self.config.snapshots_enabled and self._transactional
                and self.state is BufferState.READY):
            self._snapshot_timer = asyncio.get_running_loop().call_later(
                self.config.snapshot_min_interval_ms / 1000, self._on_snapshot_timer)

    def _on_snapshot_timer(self) -> None:
        self._snapshot_timer = None
        if self.state is not BufferState.READY:
            return
        # Also when no txn ended: the horizon moves with plain appends too, and a snapshot
        # taken only after aborts would leave a commit-only topic to a full replay (Pulsar #12219).
        if self._ended_since_snapshot or self._horizon(self.ledger.lac) != self._queued_snapshot_position:
            self._write_snapshot()
        self._schedule_snapshot_timer()

    # --- notification, trimming -----------------------------------------------------------

    def add_listener(self, listener: Callable[[], None]) -> None:
        if not callable(listener):
            raise TypeError("listener must be callable")
        self._listeners.append(listener)

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                log.exception("%s: transaction-buffer listener failed", self.ledger.name)

    def _on_lac_moved(self) -> None:
        if self.state is BufferState.READY:
            self._notify()

    def _snapshot_for_trim(self, first_position: Position) -> WriteFn | None:
        """The snapshot a trim writes in the LMDB transaction that deletes its ledgers (every
        entry before `first_position`). The deleted markers told which txns ended here (late
        writes of those must stay refused), and the replay after a stored snapshot taken
        before them would no longer find them: written after the deletion, the snapshot could
        be lost to a crash in between; written before it, a crash in between would leave the
        aborted entries without their aborts. In the same write, neither can happen. Its
        aborted set already leaves out the aborts whose marker goes (nothing of them is left);
        the one in memory follows when the trim has committed (`_on_trimmed`), as do the
        snapshot segments it deletes."""
        if not self._transactional or not self.config.snapshots_enabled:
            return None
        if self.state is BufferState.READY or (self.state is BufferState.CLOSED and self._recover_end_ms):
            limit = self.ledger.lac           # everything written here is known (closed: was ready)
        elif self.state is BufferState.INITIALIZING and first_position <= self._verified.next():
            limit = self._verified            # the replay has read all that goes
        else:
            # Entries the buffer has not read (yet): the trim waits for a later attempt.
            raise StorageError(f"not trimmed: the transaction buffer of {self.ledger.name} is "
                               f"{self.state.value} and has not read the entries to delete yet")
        position, taken_ms = self._snapshot_position(limit), _now_ms()
        write = self._snapshots.write_of(TransactionBufferSnapshot(position, self._aborted, self._ended, taken_ms),
                                         first_kept=first_position)
        self._trim_snapshot = (position, taken_ms)
        return write

    def _on_trimmed(self, first_position: Position) -> None:
        # Aborts whose marker is gone have no entries left either (entries precede markers).
        self._aborted.trim_before(first_position)
        self._snapshots.trimmed(first_position)
        # The trim's own write held the snapshot that keeps what the deleted markers told.
        carried, self._trim_snapshot = self._trim_snapshot, None
        if carried is not None and carried[1] >= self._last_snapshot_ms:
            self._last_snapshot_ms, self._last_snapshot_position = carried[1], carried[0]

    # --- stats, lifecycle -----------------------------------------------------------------

    def snapshot_segments(self) -> list[tuple[TxnId | None, Position]]:
        """The sealed snapshot segments, oldest first, as Pulsar's segment index lists them:
        the last aborted txn of each (None if its abort is no longer held) and the position of
        that txn's abort marker."""
        segments = self._snapshots.segments
        if not segments:
            return []
        wanted = {segment.last_marker for segment in segments}
        last_txn = {marker: txn for txn, marker in self._aborted.items() if marker in wanted}
        return [(last_txn.get(segment.last_marker), segment.last_marker) for segment in segments]

    async def stored_snapshot(self) -> tuple[int | None, int, int]:
        """What the topic's snapshot store holds now: see SnapshotStore.stored."""
        return await self._snapshots.stored()

    def stats(self) -> dict:
        last = self._last_snapshot_position
        return {
            "state": self.state.value,
            "max_read_position": str(self.max_read_position()),
            "ongoing_txn_count": len(self._ongoing),
            "aborted_txn_count": len(self._aborted),
            "committed_total": self._committed_total,
            "aborted_total": self._aborted_total,
            "low_watermarks": self._ended.low_watermarks(),
            "last_snapshot_timestamp": self._last_snapshot_ms,
            "last_snapshot_position": str(last) if last is not None else None,
            "recover_start_time": self._recover_start_ms,
            "recover_end_time": self._recover_end_ms,
            "recover_replayed_entries": self._replayed_entries,
            "snapshot_segments": len(self._snapshots.segments),
            "snapshot_segment_capacity": self.config.snapshot_segment_aborts,
            "unsealed_aborted_txn_count": self._snapshots.unsealed_count(self._aborted),
            "last_snapshot_segment_timestamp": self._snapshots.last_sealed_ms,
        }

    async def close(self) -> None:
        """Refuse new work, let automatic aborts finish, and take a final snapshot."""
        if self.state is BufferState.CLOSED:
            return
        was_ready = self.state is BufferState.READY
        self.state = BufferState.CLOSED
        if self._snapshot_timer is not None:
            self._snapshot_timer.cancel()
            self._snapshot_timer = None
        self._fail_queue(ServiceNotReadyError(f"the transaction buffer of {self.ledger.name} is closed"))
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        self.ledger.remove_listener(self._on_lac_moved)
        if was_ready and self._transactional:
            # Only spares the next recovery a replay: if it fails, the topic must still close
            # (raised, it left the topic's ledger open and its deletion undone).
            try:
                await self._write_snapshot()
            except (StorageError, PulsarError) as exc:
                log.warning("%s: final transaction-buffer snapshot failed (recovery replays instead): %s",
                            self.ledger.name, exc)

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(mark_retrieved)
        return task

    def __repr__(self) -> str:
        return (f"TopicTransactionBuffer({self.ledger.name!r}, {self.state.value}, "
                f"max_read={self.max_read_position()}, ongoing={len(self._ongoing)}, aborted={len(self._aborted)})")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_txn(txn: object) -> None:
    if not isinstance(txn, TxnId):
        raise TypeError(f"txn must be a TxnId, not {type(txn).__name__}")


def _check_end(txn: object, low_watermark: object, after: object) -> None:
    _check_txn(txn)
    _check_int("low_watermark", low_watermark, minimum=-1)
    if after is not None and not isinstance(after, asyncio.Future):
        raise TypeError(f"after must be an asyncio.Future, not {type(after).__name__}")


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value}")


def _failed(loop: asyncio.AbstractEventLoop, error: BaseException) -> asyncio.Future:
    future = loop.create_future()
    future.set_exception(error)
    return future


def _chain(source: asyncio.Future, target: asyncio.Future) -> None:
    def copy(done: asyncio.Future) -> None:
        error = done.exception()
        if target.done():
            return
        if error is not None:
            target.set_exception(error)
        else:
            target.set_result(done.result())
    source.add_done_callback(copy)


def _persistence_error(error: BaseException) -> PulsarError:
    if isinstance(error, PulsarError):
        return error
    if isinstance(error, LedgerTerminatedError):
        return TopicTerminatedError(str(error))
    return PersistenceError(f"cannot write the transaction marker: {error}")
