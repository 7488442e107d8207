"""The v4 transaction metadata store of one coordinator: state in memory, every change logged
to LMDB first (Pulsar's MLTransactionMetadataStore, with LMDB's `txn_log` database in place of
the `__transaction_log_<tcId>` managed ledger).

Changes are applied to memory when they are submitted, so the next request already sees them
and the log's order is the submission order, and the caller is answered once the write is
durable. A write that fails is undone in memory (nothing acts on a change before it is
durable: the service tells participants only after the decision is written).

Trimming: when a txn ends, its op records are deleted and one compact FINISHED record is
written in the same LMDB write transaction, so no restart can see a half-trimmed txn. FINISHED
records answer repeated END_TXNs (and `get`) for `finished_retention_ms` after the end, then
`purge_finished` deletes them (also the oldest beyond `finished_max_records`, which bounds the
memory at high rates, as Pulsar does). A header record keeps the next txn sequence, so ids are
never reused once every record of the old txns is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import heapq
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import lmdb

from pyengine.errors import (
    InvalidTxnStatusError,
    NotAllowedError,
    PersistenceError,
    ServiceNotReadyError,
    TransactionNotFoundError,
)
from pyengine.storage import StorageEnvironment
from pyengine.storage.errors import CorruptRecordError, StorageError
from pyengine.transaction import TxnStatus
from pyengine.transaction.coordinator import TransactionMetadataStore, TxnMeta
from pyengine.transaction.coordinator import log_records as records
from pyengine.transaction.coordinator.clock import Clock, wall_clock_ms
from pyengine.transaction.coordinator.validation import (
    check_int,
    check_partitions,
    check_status,
    check_subscriptions,
    check_txn,
)
from pyengine.transaction.outcome import Outcome
from pyengine_kernels import TxnId

log = logging.getLogger(__name__)

DEFAULT_FINISHED_RETENTION_MS = 60 * 60 * 1000   # Pulsar's transactionEndedStatusRetentionTimeMs
DEFAULT_FINISHED_MAX_RECORDS = 100_000            # Pulsar's transactionEndedStatusMaxRecordCount

# The moves a coordinator makes; TIME_OUT is the end of an abort decided by the timeout.
LEGAL_TRANSITIONS = frozenset({
    (TxnStatus.OPEN, TxnStatus.COMMITTING),
    (TxnStatus.COMMITTING, TxnStatus.COMMITTED),
    (TxnStatus.OPEN, TxnStatus.ABORTING),
    (TxnStatus.ABORTING, TxnStatus.ABORTED),
    (TxnStatus.ABORTING, TxnStatus.TIME_OUT),
})


@dataclass
class _LiveTxn:
    """A txn not yet terminal, with the keys of its op records (deleted on its end)."""

    meta: TxnMeta
    log_keys: list[bytes]
    partition_set: set[str] = field(default_factory=set)
    subscription_set: set[tuple[str, str]] = field(default_factory=set)
    last_write: asyncio.Future[Any] | None = None     # its latest write, maybe still in flight


class _FinishedTxn(NamedTuple):
    status: TxnStatus
    start_ms: int
    timeout_ms: int
    finished_ms: int
    log_key: bytes


_TERMINAL_STATUS = {status.value: status for status in TxnStatus if status.is_terminal}


class LogTransactionMetadataStore(TransactionMetadataStore):
    def __init__(self, env: StorageEnvironment, coordinator_id: int, *, clock: Clock = wall_clock_ms,
                 finished_retention_ms: int = DEFAULT_FINISHED_RETENTION_MS,
                 finished_max_records: int = DEFAULT_FINISHED_MAX_RECORDS) -> None:
        for name, value in (("coordinator_id", coordinator_id), ("finished_retention_ms", finished_retention_ms),
                            ("finished_max_records", finished_max_records)):
            if check_int(value, name) < 0:
                raise ValueError(f"{name} must be >= 0, not {value}")
        self.coordinator_id = coordinator_id
        self.finished_retention_ms = finished_retention_ms
        self.finished_max_records = finished_max_records
        self._env = env
        self._clock = clock
        self._db = env.db("txn_log")
        self._prefix = records.coordinator_prefix(coordinator_id)
        self._live: dict[int, _LiveTxn] = {}            # txn sequence -> live txn
        self._live_heap: list[int] = []                 # live sequences (lazy deletion)
        self._finished: dict[int, _FinishedTxn] = {}    # txn sequence -> end, within retention
        self._finished_counts = dict.fromkeys(TxnStatus, 0)
        self._finish_order: deque[tuple[int, int]] = deque()   # (sequence, finished_ms), oldest first
        self._finishing: dict[int, asyncio.Future[Any]] = {}   # FINISHED writes in flight
        # Writes in flight -> their outcome, which callers await (see `_await_write`).
        self._in_flight: dict[asyncio.Future[Any], Outcome[None]] = {}
        self._next_txn_sequence = 0
        self._next_log_sequence = 0
        self._state = "new"
        # When the last recovery started and ended (ms by its clock; 0: not yet), as Pulsar's
        # TransactionCoordinatorStats recoverStartTime / recoverEndTime.
        self.recover_start_ms = 0
        self.recover_end_ms = 0

    # --- recovery -------------------------------------------------------------------------

    async def recover(self) -> list[TxnMeta]:
        """Replay the log: live txns come back with their partitions, subscriptions and
        status; FINISHED records within retention are kept to answer repeated END_TXNs."""
        if self._state != "new":
            raise ServiceNotReadyError(f"transaction coordinator {self.coordinator_id} is {self._state}")
        self.recover_start_ms = self._clock()
        cid, prefix = self.coordinator_id, self._prefix
        header_key = records.log_key(prefix, records.HEADER_SEQUENCE)
        header_next, max_sequence, last_key = 0, -1, None
        orphans: list[bytes] = []
        live, finished, finish_order = self._live, self._finished, self._finish_order
        parse, finished_op = records.TxnLogRecord.FromString, records.FINISHED
        # The loop is the cost of a restart with many finished txns: keep it tight, and pause
        # the cyclic GC, which would otherwise rescan the growing maps again and again.
        with self._env.read() as txn, _gc_paused():
            cursor = txn.cursor(db=self._db)
            if cursor.set_range(prefix):
                for key, raw in cursor.iternext():
                    if key[:8] != prefix:
                        break
                    if key == header_key:
                        header_next = records.decode_header(raw)
                        continue
                    last_key = key
                    try:
                        record = parse(raw)
                    except Exception as exc:
                        raise CorruptRecordError(f"transaction log {cid}, record "
                                                 f"{records.log_sequence(key)}: {exc}") from exc
                    least = record.txn_least
                    if record.txn_most != cid:
                        raise CorruptRecordError(f"transaction log {cid}, record {records.log_sequence(key)}: "
                                                 f"it belongs to coordinator {record.txn_most}")
                    if least > max_sequence:
                        max_sequence = least
                    if record.op == finished_op:
                        status = _TERMINAL_STATUS.get(record.new_status)
                        if status is None:
                            raise CorruptRecordError(f"transaction log {cid}: txn {least} finished "
                                                     f"with status {record.new_status}")
                        finished_ms = record.modified_ms
                        finished[least] = _FinishedTxn(status, record.start_ms, record.timeout_ms, finished_ms, key)
                        finish_order.append((least, finished_ms))
                    else:
                        self._replay_op(record, key, orphans)
        for sequence in [s for s in live if s in finished]:
            orphans.extend(live.pop(sequence).log_keys)        # cannot happen: ended atomically
        for end in finished.values():
            self._finished_counts[end.status] += 1
        self._next_txn_sequence = max(header_next, max_sequence + 1)
        self._next_log_sequence = records.log_sequence(last_key) + 1 if last_key is not None else 0
        self._live_heap = sorted(live)
        self._state = "ready"
        if orphans:
            log.warning("transaction coordinator %d: deleting %d records of unknown txns", cid, len(orphans))
            await self._await_write(self._submit(_delete_fn(orphans, self._db)))
        await self.purge_finished()
        self.recover_end_ms = self._clock()
        return [_copy(state.meta) for state in live.values()]

    def _replay_op(self, record: records.TxnLogRecord, key: bytes, orphans: list[bytes]) -> None:
        least = record.txn_least
        if record.op == records.NEW:
            if least in self._live:
                raise CorruptRecordError(f"transaction log {self.coordinator_id}: txn {least} opened twice")
            meta = TxnMeta(TxnId(self.coordinator_id, least), TxnStatus.OPEN, record.timeout_ms,
                           record.start_ms, record.modified_ms)
            self._live[least] = _LiveTxn(meta, [key])
            return
        state = self._live.get(least)
        if state is None:
            orphans.append(key)
            return
        state.log_keys.append(key)
        meta = state.meta
        meta.last_modified_ms = record.modified_ms
        if record.op == records.ADD_PARTITION:
            _add_new(record.partitions, meta.partitions, state.partition_set)
        elif record.op == records.ADD_SUBSCRIPTION:
            subs = [(s.topic, s.subscription) for s in record.subscriptions]
            _add_new(subs, meta.subscriptions, state.subscription_set)
        elif record.op == records.UPDATE:
            expected, new = TxnStatus(record.expected_status), TxnStatus(record.new_status)
            if meta.status != expected or (expected, new) not in LEGAL_TRANSITIONS or new.is_terminal:
                raise CorruptRecordError(f"transaction log {self.coordinator_id}: txn {least} cannot move "
                                         f"{expected.name} -> {new.name} while {meta.status.name}")
            meta.status = new
            meta.timed_out = record.timed_out
        else:
            raise CorruptRecordError(f"transaction log {self.coordinator_id}: unknown op {record.op}")

    # --- operations -----------------------------------------------------------------------

    async def new_transaction(self, timeout_ms: int) -> TxnMeta:
        self._check_ready()
        check_int(timeout_ms, "timeout_ms")
        if timeout_ms <= 0:
            raise NotAllowedError(f"transaction timeout must be > 0 ms, not {timeout_ms}")
        sequence = self._next_txn_sequence
        self._next_txn_sequence += 1
        now = self._clock()
        meta = TxnMeta(TxnId(self.coordinator_id, sequence), TxnStatus.OPEN, timeout_ms, now, now)
        key = self._allocate_log_key()
        state = _LiveTxn(meta, [key])
        self._live[sequence] = state
        heapq.heappush(self._live_heap, sequence)
        value = records.new_record(self.coordinator_id, sequence, timeout_ms, now)
        header_key = records.log_key(self._prefix, records.HEADER_SEQUENCE)
        header = records.encode_header(sequence + 1)
        db = self._db

        def write(txn: lmdb.Transaction) -> None:
            txn.put(key, value, db=db)
            txn.put(header_key, header, db=db)

        def undo() -> None:      # the txn was never created; its sequence is simply skipped
            self._live.pop(sequence, None)

        state.last_write = self._submit(write, undo)
        await self._await_write(state.last_write)
        return _copy(meta)

    async def add_produced_partitions(self, txn: TxnId, partitions: list[str]) -> None:
        await self._await_write(self.register_produced_partitions(txn, partitions))

    async def add_acked_subscriptions(self, txn: TxnId, subscriptions: list[tuple[str, str]]) -> None:
        await self._await_write(self.register_acked_subscriptions(txn, subscriptions))

    def register_produced_partitions(self, txn: TxnId, partitions: list[str]) -> asyncio.Future[Any]:
        """Like `add_produced_partitions`, but the record is submitted before this returns
        (errors are raised at once) and its write is returned to be awaited later (it fails
        with a StorageError): a caller that appends the txn's first entry in the same
        event-loop turn gets both into one LMDB transaction — the entry can never be durable
        without its partition's registration."""
        self._check_ready()
        partitions = check_partitions(partitions)
        state = self._open_txn(check_txn(txn))
        added = _add_new(partitions, state.meta.partitions, state.partition_set)
        if not added:
            return self._last_write(state)
        now = self._clock()
        value = records.add_partitions_record(self.coordinator_id, txn.least_bits, added, now)

        def undo() -> None:
            _remove(added, state.meta.partitions, state.partition_set)

        return self._submit_op(state, value, now, undo)

    def partition_registered(self, txn: TxnId, partition: str) -> bool:
        """Whether `txn` is OPEN with `partition` durably registered (every write of the txn
        settled): then an append to it needs neither a registration nor a condition."""
        state = self._live.get(txn.least_bits) if txn.most_bits == self.coordinator_id else None
        if state is None or state.meta.status != TxnStatus.OPEN or partition not in state.partition_set:
            return False
        last = state.last_write
        return last is None or (last.done() and not last.cancelled() and last.exception() is None)

    def register_acked_subscriptions(self, txn: TxnId, subscriptions: list[tuple[str, str]]) -> asyncio.Future[Any]:
        """`add_acked_subscriptions` with the record submitted before this returns (see
        `register_produced_partitions`)."""
        self._check_ready()
        subscriptions = check_subscriptions(subscriptions)
        state = self._open_txn(check_txn(txn))
        added = _add_new(subscriptions, state.meta.subscriptions, state.subscription_set)
        if not added:
            return self._last_write(state)
        now = self._clock()
        value = records.add_subscriptions_record(self.coordinator_id, txn.least_bits, added, now)

        def undo() -> None:
            _remove(added, state.meta.subscriptions, state.subscription_set)

        return self._submit_op(state, value, now, undo)

    async def update_status(self, txn: TxnId, new: TxnStatus, expected: TxnStatus, *,
                            timed_out: bool = False) -> TxnMeta:
        self._check_ready()
        check_txn(txn)
        new = check_status(new, "new")
        expected = check_status(expected, "expected")
        if not isinstance(timed_out, bool):
            raise TypeError(f"timed_out must be a bool, not {type(timed_out).__name__}")
        if timed_out and (expected, new) != (TxnStatus.OPEN, TxnStatus.ABORTING):
            raise ValueError("timed_out marks an OPEN -> ABORTING move only")
        sequence = self._sequence_of(txn)
        state = self._live.get(sequence)
        end = self._finished_within_retention(sequence) if state is None else None
        if state is None and end is None:
            raise self._not_found(txn)
        current = state.meta.status if state is not None else end.status
        if current == new:                       # a repeat: succeeds once the change is durable
            if state is not None:
                await self._settled(state)
                return self.get(txn)
            pending = self._finishing.get(sequence)
            if pending is not None:
                await self._await_write(pending)
            return self._finished_meta(txn, end)
        if current != expected:
            raise InvalidTxnStatusError(f"transaction {txn}: expected {expected.name} but is {current.name}")
        if state is None or (expected, new) not in LEGAL_TRANSITIONS:
            raise InvalidTxnStatusError(f"transaction {txn}: cannot move from {expected.name} to {new.name}")
        if new.is_terminal:
            return await self._finish(sequence, state, new)
        return await self._decide(state, new, timed_out)

    def get(self, txn: TxnId) -> TxnMeta:
        self._check_ready()
        sequence = self._sequence_of(check_txn(txn))
        state = self._live.get(sequence)
        if state is not None:
            return _copy(state.meta)
        end = self._finished_within_retention(sequence)
        if end is None:
            raise self._not_found(txn)
        return self._finished_meta(txn, end)

    def low_watermark(self) -> int:
        """Pulsar's lowWaterMark (the first live sequence - 1), except that with no live txn it
        is the last sequence handed out rather than 0: no txn at or below it can still write,
        while 0 would wrongly cover a txn 0 not created yet."""
        heap = self._live_heap
        while heap and heap[0] not in self._live:
            heapq.heappop(heap)
        return heap[0] - 1 if heap else self._next_txn_sequence - 1

    @property
    def state(self) -> str:
        """"new", "ready" (recovered) or "closed"."""
        return self._state

    @property
    def last_sequence(self) -> int:
        """The sequence (least bits) of the last txn handed out, -1 before the first."""
        return self._next_txn_sequence - 1

    async def stored_log(self) -> tuple[int, int]:
        """The log records stored now (durable; the header record left out) and the bytes of
        their values: the size of this coordinator's log (admin's coordinatorInternalStats)."""
        return await self._env.prefix_usage(self._db, self._prefix, records.log_key(self._prefix, 0))

    def live_transactions(self) -> list[TxnMeta]:
        """Every txn not yet terminal (a copy)."""
        return [_copy(state.meta) for state in self._live.values()]

    def status_counts(self) -> dict[TxnStatus, int]:
        """Live txns by status, and the finished ones still retained by terminal status."""
        counts = dict(self._finished_counts)
        for state in self._live.values():
            counts[state.meta.status] += 1
        return counts

    async def purge_finished(self) -> int:
        """Delete the FINISHED records older than the retention, and the oldest beyond
        `finished_max_records`; returns how many."""
        self._check_ready()
        horizon = self._clock() - self.finished_retention_ms
        order = self._finish_order
        expired = []
        while order and (order[0][1] <= horizon or len(self._finished) > self.finished_max_records):
            sequence, finished_ms = order[0]
            if sequence in self._finishing:
                break                     # its FINISHED record is not durable yet
            order.popleft()
            end = self._finished.get(sequence)
            if end is not None and end.finished_ms == finished_ms:
                self._forget_finished(sequence)
                expired.append(end.log_key)
        if expired:
            await self._await_write(self._submit(_delete_fn(expired, self._db)))
        return len(expired)

    async def close(self) -> None:
        if self._state == "closed":
            return
        self._state = "closed"
        if self._in_flight:
            await asyncio.wait(set(self._in_flight))     # never cancels the writes themselves

    # --- changes --------------------------------------------------------------------------

    def _submit_op(self, state: _LiveTxn, value: bytes, now: int, undo: Callable[[], None], *,
                   linger: bool = False) -> asyncio.Future[Any]:
        key = self._allocate_log_key()
        state.log_keys.append(key)
        state.meta.last_modified_ms = now
        db = self._db

        def undo_op() -> None:
            undo()
            _discard(state.log_keys, key)

        # Chained on the txn's write still in flight: if that one fails, so does this one. So
        # `last_write` stands for every registration before it, and an append made conditional
        # on it (ServerConnection._publish_in_txn) is never durable without its partition's.
        previous = state.last_write if state.last_write is not None and not state.last_write.done() else None
        state.last_write = self._submit(lambda txn: txn.put(key, value, db=db), undo_op, linger=linger,
                                        after=previous)
        return state.last_write

    def submit_decision(self, txn: TxnId, new: TxnStatus, *, timed_out: bool = False) -> tuple[TxnMeta, asyncio.Future[Any]]:
        """Move an OPEN txn to COMMITTING or ABORTING now and queue the record, without waiting
        for it: returns the txn as decided and the record's write, for participants whose own
        writes go into the same group commit (StorageEnvironment.depend). If the write fails
        the txn is OPEN again; `written` waits for it as `update_status` would."""
        self._check_ready()
        new = check_status(new, "new")
        if new not in (TxnStatus.COMMITTING, TxnStatus.ABORTING):
            raise ValueError(f"a decision is COMMITTING or ABORTING, not {new.name}")
        if not isinstance(timed_out, bool):
            raise TypeError(f"timed_out must be a bool, not {type(timed_out).__name__}")
        if timed_out and new != TxnStatus.ABORTING:
            raise ValueError("timed_out marks an OPEN -> ABORTING move only")
        state = self._open_txn(check_txn(txn))
        written = self._submit_decision(state, new, timed_out, linger=True)
        return _copy(state.meta), written

    async def written(self, write: asyncio.Future[Any]) -> None:
        """Wait for a write of this store (StorageError -> PersistenceError)."""
        await self._await_write(write)

    async def _decide(self, state: _LiveTxn, new: TxnStatus, timed_out: bool) -> TxnMeta:
        await self._await_write(self._submit_decision(state, new, timed_out))
        return _copy(state.meta)

    def _submit_decision(self, state: _LiveTxn, new: TxnStatus, timed_out: bool, *,
                         linger: bool = False) -> asyncio.Future[Any]:
        meta = state.meta
        previous, now = meta.status, self._clock()
        meta.status, meta.timed_out, meta.last_modified_ms = new, timed_out, now
        value = records.update_record(self.coordinator_id, meta.txn_id.least_bits, previous, new, timed_out, now)

        def undo() -> None:
            if meta.status == new:
                meta.status, meta.timed_out = previous, False

        return self._submit_op(state, value, now, undo, linger=linger)

    def submit_final_status(self, txn: TxnId, new: TxnStatus, expected: TxnStatus) -> asyncio.Future[Any]:
        """`update_status` to a terminal status for a caller that need not wait for the record:
        the txn is finished when this returns, and the record's write is returned (it fails
        with a StorageError, and the txn is then `expected` again, as after a failed
        `update_status`)."""
        self._check_ready()
        check_txn(txn)
        new = check_status(new, "new")
        expected = check_status(expected, "expected")
        sequence = self._sequence_of(txn)
        state = self._live.get(sequence)
        if state is None:
            if self._finished_within_retention(sequence) is None:
                raise self._not_found(txn)
            raise InvalidTxnStatusError(f"transaction {txn} has already finished")
        if not new.is_terminal or (expected, new) not in LEGAL_TRANSITIONS:
            raise InvalidTxnStatusError(f"transaction {txn}: cannot move from {expected.name} to {new.name} "
                                        "as its final status")
        if state.meta.status != expected:
            raise InvalidTxnStatusError(f"transaction {txn}: expected {expected.name} but is {state.meta.status.name}")
        return self._submit_finish(sequence, state, new)[1]

    async def _finish(self, sequence: int, state: _LiveTxn, status: TxnStatus) -> TxnMeta:
        end, future = self._submit_finish(sequence, state, status)
        await self._await_write(future)
        return self._finished_meta(state.meta.txn_id, end)

    def _submit_finish(self, sequence: int, state: _LiveTxn,
                       status: TxnStatus) -> tuple[_FinishedTxn, asyncio.Future[Any]]:
        meta = state.meta
        now = self._clock()
        key = self._allocate_log_key()
        end = _FinishedTxn(status, meta.start_ms, meta.timeout_ms, now, key)
        del self._live[sequence]
        self._compact_live_heap()
        self._remember_finished(sequence, end)
        self._finish_order.append((sequence, now))
        value = records.finished_record(self.coordinator_id, sequence, status, meta.start_ms,
                                        meta.timeout_ms, now)
        trimmed = list(state.log_keys)
        db = self._db

        def write(txn: lmdb.Transaction) -> None:
            for op_key in trimmed:
                txn.delete(op_key, db=db)
            txn.put(key, value, db=db)

        def undo() -> None:
            if self._finished.get(sequence) is end:
                self._forget_finished(sequence)
                self._live[sequence] = state
                heapq.heappush(self._live_heap, sequence)

        # The terminal record only lets the log be trimmed (a crash before it lands resumes the
        # ending, which is idempotent): it joins the next group commit instead of taking one of
        # its own, which the txns opened next would have to queue behind.
        future = self._submit(write, undo, lazy=True)
        self._finishing[sequence] = future
        future.add_done_callback(lambda _: self._finishing.pop(sequence, None))
        return end, future

    # --- helpers --------------------------------------------------------------------------

    def _submit(self, write: Callable[[lmdb.Transaction], Any], undo: Callable[[], None] | None = None, *,
                linger: bool = False, lazy: bool = False,
                after: asyncio.Future[Any] | None = None) -> asyncio.Future[Any]:
        future = self._env.submit(write, linger=linger, lazy=lazy, after=after)
        self._in_flight[future] = Outcome()
        future.add_done_callback(partial(self._write_settled, undo))     # one callback, one loop hop
        return future

    def _write_settled(self, undo: Callable[[], None] | None, future: asyncio.Future[Any]) -> None:
        outcome = self._in_flight.pop(future)
        if future.cancelled():
            outcome.cancel()
        elif (failure := future.exception()) is not None:
            if undo is not None:
                undo()      # as soon as the batch failed, before any later batch can complete
            outcome.set_exception(failure)
        else:
            outcome.set_result(None)

    async def _await_write(self, future: asyncio.Future[Any]) -> None:
        # A cancelled caller must not make a write that may still land look failed.
        outcome = self._in_flight.get(future)
        try:
            await (outcome.waiter() if outcome is not None else asyncio.shield(future))   # shield: settled
        except StorageError as exc:
            raise PersistenceError(f"transaction coordinator {self.coordinator_id}: {exc}") from exc

    def _last_write(self, state: _LiveTxn) -> asyncio.Future[Any]:
        """A no-op request succeeds once the change it repeats is durable."""
        if state.last_write is not None and not state.last_write.done():
            return state.last_write
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def _settled(self, state: _LiveTxn) -> None:
        """A no-op request succeeds once the change it repeats is durable."""
        if state.last_write is not None and not state.last_write.done():
            await self._await_write(state.last_write)

    def _compact_live_heap(self) -> None:
        # Ended txns leave the heap lazily, from its top only (low_watermark): txns ended
        # behind a long-lived one, or on a coordinator whose watermark nobody asks for (txns
        # without participants), would stay in it for good.
        if len(self._live_heap) > 2 * len(self._live) + 64:
            self._live_heap = sorted(self._live)

    def _remember_finished(self, sequence: int, end: _FinishedTxn) -> None:
        self._finished[sequence] = end
        self._finished_counts[end.status] += 1

    def _forget_finished(self, sequence: int) -> None:
        self._finished_counts[self._finished.pop(sequence).status] -= 1

    def _allocate_log_key(self) -> bytes:
        sequence = self._next_log_sequence
        self._next_log_sequence += 1
        return records.log_key(self._prefix, sequence)

    def _not_found(self, txn: TxnId) -> TransactionNotFoundError:
        """Not found: never handed out, or ended so long ago that its outcome is no longer kept.
        Pulsar answers both alike, and a client committing after a long pause cannot tell a
        lost outcome from a wrong id (apache/flink #17452); the sequence tells them apart."""
        if txn.least_bits < self._next_txn_sequence:
            return TransactionNotFoundError(
                f"transaction {txn} not found: it ended and its outcome is no longer kept (finished "
                f"transactions are remembered for {self.finished_retention_ms} ms, at most "
                f"{self.finished_max_records})")
        return TransactionNotFoundError(f"transaction {txn} not found: coordinator {self.coordinator_id} "
                                        "never handed it out")

    def _sequence_of(self, txn: TxnId) -> int:
        if txn.most_bits != self.coordinator_id:
            raise TransactionNotFoundError(f"transaction {txn} does not belong to coordinator {self.coordinator_id}")
        return txn.least_bits

    def _open_txn(self, txn: TxnId) -> _LiveTxn:
        sequence = self._sequence_of(txn)
        state = self._live.get(sequence)
        if state is None:
            end = self._finished_within_retention(sequence)
            if end is None:
                raise self._not_found(txn)
            raise InvalidTxnStatusError(f"transaction {txn}: expected OPEN but is {end.status.name}")
        if state.meta.status != TxnStatus.OPEN:
            raise InvalidTxnStatusError(f"transaction {txn}: expected OPEN but is {state.meta.status.name}")
        return state

    def _finished_within_retention(self, sequence: int) -> _FinishedTxn | None:
        end = self._finished.get(sequence)
        if end is None or end.finished_ms + self.finished_retention_ms <= self._clock():
            return None
        return end

    @staticmethod
    def _finished_meta(txn: TxnId, end: _FinishedTxn) -> TxnMeta:
        """A finished txn keeps only its outcome: partitions and subscriptions were trimmed."""
        return TxnMeta(txn, end.status, end.timeout_ms, end.start_ms, end.finished_ms,
                       timed_out=end.status == TxnStatus.TIME_OUT)

    def _check_ready(self) -> None:
        if self._state != "ready":
            raise ServiceNotReadyError(f"transaction coordinator {self.coordinator_id} is {self._state}")


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No await happens inside, so nothing else runs on the event loop meanwhile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _delete_fn(keys: list[bytes], db: Any) -> Callable[[lmdb.Transaction], None]:
    def write(txn: lmdb.Transaction) -> None:
        for key in keys:
            txn.delete(key, db=db)

    return write


def _copy(meta: TxnMeta) -> TxnMeta:
    return TxnMeta(meta.txn_id, meta.status, meta.timeout_ms, meta.start_ms, meta.last_modified_ms,
                   list(meta.partitions), list(meta.subscriptions), meta.timed_out)


def _add_new(items: Any, ordered: list[Any], seen: set[Any]) -> list[Any]:
    """Append the items not yet present (in order, once each); returns those appended."""
    added = []
    for item in items:
        if item not in seen:
            seen.add(item)
            ordered.append(item)
            added.append(item)
    return added


def _remove(items: list[Any], ordered: list[Any], seen: set[Any]) -> None:
    for item in items:
        seen.discard(item)
        _discard(ordered, item)


def _discard(items: list[Any], item: Any) -> None:
    try:
        items.remove(item)
    except ValueError:
        pass
