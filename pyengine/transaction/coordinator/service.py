"""The transaction coordinator service of a broker (Pulsar's TransactionMetadataStoreService):
N v4 coordinators (ids 0..N-1), each a `LogTransactionMetadataStore`, plus what turns their
state into outcomes — ending transactions on their participants, timeouts, recovery.

Ending a transaction (END_TXN, or a timeout):
1. write COMMITTING / ABORTING: the decision. Nothing of the outcome becomes durable anywhere
   before it: the produced partitions are told at once, and their markers are conditional
   writes in the decision's group commit (StorageEnvironment.depend); the acked subscriptions
   are told once it is durable (their acks go into cursors shared with plain acks);
2. every call is repeated with back-off until it confirms (a participant that no longer
   exists counts as confirmed); once all did, answer;
3. write COMMITTED / ABORTED (TIME_OUT when the timeout decided), lazily: it only lets the log
   be trimmed, and a restart before it lands resumes the (idempotent) ending.
Every END_TXN for a txn being ended joins the same completion; the same decision again, also
after the end (within the FINISHED retention, also across restarts), succeeds; the other
decision is InvalidTxnStatusError. After a restart, `start()` resumes every decided txn at
step 2 and re-arms the timeouts of the OPEN ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pyengine.errors import (
    InvalidTxnStatusError,
    NotAllowedError,
    PersistenceError,
    ServiceNotReadyError,
    TransactionCoordinatorNotFoundError,
    TransactionNotFoundError,
)
from pyengine.storage import StorageEnvironment
from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator import TransactionParticipants, TxnMeta
from pyengine.transaction.coordinator.clock import Clock, wall_clock_ms
from pyengine.transaction.coordinator.keys import TransactionKeys
from pyengine.transaction.coordinator.log_store import (
    DEFAULT_FINISHED_MAX_RECORDS,
    DEFAULT_FINISHED_RETENTION_MS,
    LogTransactionMetadataStore,
)
from pyengine.transaction.coordinator.retry import GONE_ERRORS, Backoff, until_confirmed
from pyengine.transaction.coordinator.stats import CoordinatorStats, Counters
from pyengine.transaction.coordinator.timeouts import TimeoutTracker
from pyengine.transaction.coordinator.validation import (
    check_action,
    check_int,
    check_partitions,
    check_subscriptions,
    check_txn,
)
from pyengine.transaction.outcome import Outcome, mark_retrieved
from pyengine_kernels import TxnId

log = logging.getLogger(__name__)

DEFAULT_NUM_COORDINATORS = 16          # Pulsar's transaction_coordinator_assign partitions
# Pulsar itself sets no upper bound (the client default is 60 s); an absurd timeout would hold
# every reader's max read position back for that long, so we cap it, leaving room for Flink's
# Pulsar sink (3 h transaction timeout by default).
DEFAULT_MAX_TIMEOUT_MS = 6 * 60 * 60 * 1000
DEFAULT_PURGE_INTERVAL_MS = 60 * 1000

# topic:// names have no ledger (PIP-468): the broker refuses to load them as topics.
SCALABLE_DOMAIN = "topic://"

_DECIDING = {TxnAction.COMMIT: TxnStatus.COMMITTING, TxnAction.ABORT: TxnStatus.ABORTING}


@dataclass
class _Ending:
    """One txn being ended: every END_TXN for it awaits `done`; a transaction key's fence
    awaits `decided` (the decision is durable: from then on the txn can only end this way, also
    after a restart)."""

    action: TxnAction
    timed_out: bool
    done: Outcome[TxnStatus]
    task: asyncio.Task[None] | None = None
    decided: Outcome[None] = field(default_factory=Outcome)


class TransactionCoordinatorService:
    def __init__(self, env: StorageEnvironment, participants: TransactionParticipants, *,
                 num_coordinators: int = DEFAULT_NUM_COORDINATORS, clock: Clock = wall_clock_ms,
                 finished_retention_ms: int = DEFAULT_FINISHED_RETENTION_MS,
                 finished_max_records: int = DEFAULT_FINISHED_MAX_RECORDS,
                 max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS,
                 purge_interval_ms: int = DEFAULT_PURGE_INTERVAL_MS,
                 backoff: Backoff | None = None) -> None:
        for name, value in (("num_coordinators", num_coordinators), ("max_timeout_ms", max_timeout_ms),
                            ("purge_interval_ms", purge_interval_ms)):
            if check_int(value, name) <= 0:
                raise ValueError(f"{name} must be > 0, not {value}")
        self.env = env
        self.participants = participants
        self.max_timeout_ms = max_timeout_ms
        self.purge_interval_ms = purge_interval_ms
        self.backoff = backoff or Backoff()
        self._clock = clock
        self._store_options = {"clock": clock, "finished_retention_ms": finished_retention_ms,
                               "finished_max_records": finished_max_records}
        self._stores = {cid: LogTransactionMetadataStore(env, cid, **self._store_options)
                        for cid in range(num_coordinators)}
        self._growing = asyncio.Lock()          # add_coordinators, one at a time
        self._endings: dict[TxnId, _Ending] = {}
        # Terminal records being written, which no task waits for, and the tasks repeating
        # those whose write failed (`wait_for_endings` waits for both).
        self._final_writes: set[asyncio.Future[Any]] = set()
        self._final_retries: set[asyncio.Task[Any]] = set()
        # Fenced txns whose abort decision could not be written, being decided again (else
        # they would stay OPEN, holding their partitions' read horizon, until their timeout).
        self._fence_retries: dict[TxnId, asyncio.Task[Any]] = {}
        self._timeouts = TimeoutTracker(clock, self._on_timeout)
        self._counters = Counters()
        self._purge_timer: asyncio.TimerHandle | None = None
        self._purge_task: asyncio.Task[None] | None = None
        self._state = "new"
        self.keys = TransactionKeys(env, self, clock)

    @property
    def coordinator_ids(self) -> list[int]:
        return list(self._stores)

    def store(self, coordinator_id: int) -> LogTransactionMetadataStore:
        store = self._stores.get(check_int(coordinator_id, "coordinator_id"))
        if store is None:
            raise TransactionCoordinatorNotFoundError(
                f"transaction coordinator {coordinator_id} not found (this broker runs 0..{len(self._stores) - 1})")
        return store

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover every coordinator, resume ending the decided txns and re-arm the timeouts
        of the OPEN ones (aborting at once those already expired). Returns once recovered:
        resumed endings go on in the background (`wait_for_endings` waits for them)."""
        if self._state != "new":
            raise ServiceNotReadyError(f"the transaction coordinator service is {self._state}")
        self._state = "starting"
        decided, fenced = [], []
        try:
            self.keys.recover()
            for store in self._stores.values():
                self._sort_recovered(store, await store.recover(), decided, fenced)
        except BaseException:
            await self.close()
            raise
        if self._state != "starting":
            # Closed while the last store recovered: running now would arm timers that no
            # close stops, over stores already closed.
            raise ServiceNotReadyError("the transaction coordinator service was closed while starting")
        # Only now: a participant reached by a resumed ending may already ask any coordinator
        # (Pulsar #18923 ended txns before their coordinator was registered).
        self._state = "running"
        self._resume_recovered(decided, fenced)
        self._timeouts.start()
        self._arm_purge()

    def _sort_recovered(self, store: LogTransactionMetadataStore, recovered: list[TxnMeta],
                        decided: list[tuple[LogTransactionMetadataStore, TxnMeta]],
                        fenced: list[tuple[LogTransactionMetadataStore, TxnMeta]]) -> None:
        """Re-arm the timeouts of a recovered store's OPEN txns; collect those to end."""
        for meta in recovered:
            if meta.status == TxnStatus.OPEN:
                self._timeouts.add(meta.txn_id, meta.start_ms + meta.timeout_ms)
                # Its key took a newer epoch (or was deleted) and the process died
                # before the abort that goes with the fence was decided: nobody else
                # will abort it (its own requests are refused as expired).
                if self.keys.fenced(meta.txn_id):
                    fenced.append((store, meta))
            else:
                decided.append((store, meta))

    def _resume_recovered(self, decided: list[tuple[LogTransactionMetadataStore, TxnMeta]],
                          fenced: list[tuple[LogTransactionMetadataStore, TxnMeta]]) -> None:
        for store, meta in decided:
            self._resume_ending(store, meta)
        for store, meta in fenced:
            log.info("transaction %s was fenced by its transaction key before a restart: aborting it", meta.txn_id)
            self._begin_ending(store, meta.txn_id, TxnAction.ABORT, timed_out=False, decided=False)

    async def add_coordinators(self, total: int) -> list[int]:
        """Run `total` coordinators, adding the ids from the current number up to `total - 1`
        to the running service (Pulsar's scaleTransactionCoordinators grows the partitions of
        transaction_coordinator_assign, and each new partition's coordinator is loaded). Each
        new store is recovered (its log is empty unless a data dir ran it before) and served
        only once recovered; none is ever removed. The caller makes `total` durable first (the
        broker's partition count of the assign topic): a txn of a new coordinator must be
        recovered by the next start. Returns the ids added ([] if `total` is not more)."""
        if check_int(total, "total") <= 0:
            raise ValueError(f"total must be > 0, not {total}")
        async with self._growing:
            self._check_running()
            added = {cid: LogTransactionMetadataStore(self.env, cid, **self._store_options)
                     for cid in range(len(self._stores), total)}
            recovered = []
            try:
                for store in added.values():
                    recovered.append((store, await store.recover()))
                self._check_running()              # closed meanwhile: not served
            except BaseException:
                for store in added.values():
                    await store.close()
                raise
            self._stores.update(added)             # served from here on (lookups count them)
            decided: list[tuple[LogTransactionMetadataStore, TxnMeta]] = []
            fenced: list[tuple[LogTransactionMetadataStore, TxnMeta]] = []
            for store, metas in recovered:
                self._sort_recovered(store, metas, decided, fenced)
            self._resume_recovered(decided, fenced)
            if added:
                log.info("transaction coordinators %d..%d added: %d running", min(added), max(added), len(self._stores))
            return list(added)

    async def close(self) -> None:
        """Stop: endings in progress stop where they are (a durable decision is resumed by the
        next start; one not yet written may be lost with its markers: the txn is OPEN again) and
        their waiters get ServiceNotReadyError."""
        if self._state == "closed":
            return
        self._state = "closed"
        self._timeouts.stop()
        if self._purge_timer is not None:
            self._purge_timer.cancel()
        endings = dict(self._endings)
        tasks = [ending.task for ending in endings.values() if ending.task is not None]
        tasks += self._final_retries     # (a stopped one is resumed by recovery)
        tasks += self._fence_retries.values()   # (recovery aborts fenced txns too)
        if self._purge_task is not None:
            tasks.append(self._purge_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for txn, ending in endings.items():       # also those whose task never got to run
            _stopped(txn, ending)
        self._endings.clear()
        for store in list(self._stores.values()):
            await store.close()

    async def wait_for_endings(self) -> None:
        """Wait until no transaction is being ended and every terminal record is written (for
        a graceful stop, and for tests)."""
        while self._endings or self._final_writes or self._final_retries or self._fence_retries:
            await asyncio.wait([*(ending.task for ending in self._endings.values() if ending.task is not None),
                                *self._final_writes, *self._final_retries, *self._fence_retries.values()])

    # --- transactions ---------------------------------------------------------------------

    async def new_transaction(self, coordinator_id: int, timeout_ms: int) -> TxnId:
        self._check_running()
        store = self.store(coordinator_id)
        check_int(timeout_ms, "timeout_ms")
        if not 0 < timeout_ms <= self.max_timeout_ms:
            raise NotAllowedError(f"transaction timeout must be between 1 and {self.max_timeout_ms} ms, "
                                  f"not {timeout_ms}")
        meta = await store.new_transaction(timeout_ms)
        self._timeouts.add(meta.txn_id, meta.start_ms + meta.timeout_ms)
        self._counters.created += 1
        return meta.txn_id

    async def add_produced_partitions(self, txn: TxnId, partitions: list[str]) -> None:
        await self.register_produced_partitions(txn, partitions)

    async def add_acked_subscriptions(self, txn: TxnId, subscriptions: list[tuple[str, str]]) -> None:
        await self.register_acked_subscriptions(txn, subscriptions)

    def register_produced_partitions(self, txn: TxnId, partitions: list[str]) -> asyncio.Future[Any]:
        """Submit the registration now, await it later: an in-process producer appends the
        txn's entry in the same event-loop turn, so both are written in one LMDB transaction
        and the send costs no extra commit (the entry is never durable without it)."""
        self._check_running()
        self.keys.check_txn(check_txn(txn))
        partitions = check_partitions(partitions)
        _check_participants(partitions)
        return self._store_of(txn).register_produced_partitions(txn, partitions)

    def partition_registered(self, txn: TxnId, partition: str) -> bool:
        """Whether an append of `txn` to `partition` may go without registering it again: the
        txn is OPEN, not fenced, and its registration there is durable. False says nothing:
        `register_produced_partitions` then answers (and raises what is wrong)."""
        store = self._stores.get(txn.most_bits)
        if store is None or self._state != "running" or not store.partition_registered(txn, partition):
            return False
        self.keys.check_txn(txn)
        return True

    def register_acked_subscriptions(self, txn: TxnId, subscriptions: list[tuple[str, str]]) -> asyncio.Future[Any]:
        self._check_running()
        self.keys.check_txn(check_txn(txn))
        subscriptions = check_subscriptions(subscriptions)
        _check_participants([topic for topic, _sub in subscriptions])
        return self._store_of(txn).register_acked_subscriptions(txn, subscriptions)

    def get(self, txn: TxnId) -> TxnMeta:
        self._check_running()
        return self._store_of(txn).get(txn)

    async def end_transaction(self, txn: TxnId, action: TxnAction, *, check_epoch: bool = True) -> TxnStatus:
        """Commit or abort `txn`; returns its final status (COMMITTED, ABORTED or TIME_OUT)
        once every participant confirmed and the end is durable. A txn whose transaction key
        moved to a newer epoch is ExpiredTransactionError (unless `check_epoch` is off: the
        admin's abort, and the fencing itself)."""
        self._check_running()
        action = check_action(action)
        store = self._store_of(txn)
        ending = self._endings.get(txn)
        if check_epoch and not (action == TxnAction.COMMIT and self._commit_decided(store, txn, ending)):
            # A commit decided before the fence stays committed: its repeat (an answer lost,
            # the request sent again after a reconnect) is answered with the truth, not with
            # ExpiredTransaction, which would have the task redo work that is in.
            self.keys.check_txn(txn)
        started = time.perf_counter()
        if ending is None:
            meta = store.get(txn)
            if meta.status.is_terminal:
                if meta.status.outcome != action:
                    raise InvalidTxnStatusError(f"transaction {txn}: expected {_DECIDING[action].name} "
                                                f"but is {meta.status.name}")
                self._counters.record_end_txn((time.perf_counter() - started) * 1000)
                return meta.status
            if meta.status == TxnStatus.OPEN:
                ending = self._begin_ending(store, txn, action, timed_out=False, decided=False)
            else:                                  # decided, its ending stopped by an error
                ending = self._resume_ending(store, meta)
        if ending.action != action:
            current = store.get(txn).status
            if current == TxnStatus.OPEN:        # its decision is about to be written
                current = _DECIDING[ending.action]
            raise InvalidTxnStatusError(f"transaction {txn}: expected {_DECIDING[action].name} but is {current.name}")
        status = await ending.done.waiter()     # a cancelled request cancels nothing else
        self._counters.record_end_txn((time.perf_counter() - started) * 1000)
        return status

    @staticmethod
    def _commit_decided(store: Any, txn: TxnId, ending: Any) -> bool:
        if ending is not None:
            return ending.action == TxnAction.COMMIT
        try:
            return store.get(txn).status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED)
        except TransactionNotFoundError:
            return False

    async def abort_fenced(self, txn: TxnId) -> asyncio.Future[TxnStatus] | None:
        """Decide the abort of a txn whose transaction key was connected under a newer epoch
        (or deleted). Returns once the decision is durable — from then on the txn can only end
        aborted, also after a restart — with a future of the ending, which completes once every
        participant applied it: the caller awaits it as long as it sees fit, the participants
        are told in the background regardless, each call repeated until it confirms (as for
        any ending). A txn whose commit was decided before the fence ends committed (that
        decision was taken under its valid epoch): the future is that ending's. None: the txn
        had already ended (or is no longer known). If the decision cannot be written, the
        error is raised and the abort is decided again in the background, with back-off, for
        as long as the txn stays open and fenced."""
        try:
            return await self._decide_fenced_abort(txn)
        except Exception:
            self._retry_fenced_abort(txn)
            raise

    def _retry_fenced_abort(self, txn: TxnId) -> None:
        if self._state != "running" or txn in self._fence_retries:
            return
        retry = asyncio.ensure_future(until_confirmed(
            partial(self._decide_fenced_abort, txn, only_if_fenced=True), f"aborting fenced transaction {txn}",
            self.backoff, gone=(ServiceNotReadyError,), local=True))
        self._fence_retries[txn] = retry
        retry.add_done_callback(partial(self._fence_retry_done, txn))

    def _fence_retry_done(self, txn: TxnId, retry: asyncio.Task[Any]) -> None:
        if self._fence_retries.get(txn) is retry:
            del self._fence_retries[txn]
        if not retry.cancelled() and retry.exception() is not None:
            log.error("could not abort fenced transaction %s (its timeout will): %s", txn, retry.exception())

    async def _decide_fenced_abort(self, txn: TxnId, *, only_if_fenced: bool = False) -> asyncio.Future[TxnStatus] | None:
        self._check_running()
        if only_if_fenced and not self.keys.fenced(txn):
            return None
        store = self._store_of(txn)
        ending = self._endings.get(txn)
        if ending is None:
            try:
                meta = store.get(txn)
            except TransactionNotFoundError as exc:
                log.info("fenced transaction %s not aborted: %s", txn, exc)
                return None
            if meta.status.is_terminal:
                return None
            if meta.status == TxnStatus.OPEN:
                ending = self._begin_ending(store, txn, TxnAction.ABORT, timed_out=False, decided=False)
            else:                                  # decided, its ending stopped by an error
                ending = self._resume_ending(store, meta)
        if ending.action != TxnAction.ABORT:
            log.info("fenced transaction %s not aborted: its commit was decided before the fence", txn)
        done = ending.done.waiter()
        done.add_done_callback(mark_retrieved)
        try:
            await ending.decided.waiter()
        except BaseException:
            done.cancel()                          # only this caller's waiter
            raise
        return done

    async def decision_written(self, txn: TxnId) -> None:
        """Return once no decision of `txn` is being written: until then its status says
        COMMITTING / ABORTING, but a failed write leaves it OPEN again (the outcome of the
        write is the caller's to read from the status)."""
        ending = self._endings.get(txn)
        if ending is None or ending.decided.done():
            return
        decided = ending.decided.waiter()
        decided.add_done_callback(mark_retrieved)
        await asyncio.wait({decided})

    def poll_timeouts(self) -> int:
        """Abort every OPEN txn whose timeout has passed; returns how many. The service's timer
        does this on its own; a test that moves an injected clock calls it directly."""
        return self._timeouts.poll()

    async def purge_finished(self) -> int:
        """Delete the FINISHED records past their retention (also done every
        `purge_interval_ms`); returns how many."""
        return sum([await store.purge_finished() for store in list(self._stores.values())])

    @property
    def counters(self) -> Counters:
        """Its counters since it started (created, ended, END_TXN latencies)."""
        return self._counters

    def stats(self) -> CoordinatorStats:
        by_status = dict.fromkeys(TxnStatus, 0)
        for store in self._stores.values():
            for status, count in store.status_counts().items():
                by_status[status] += count
        c = self._counters
        return CoordinatorStats(
            by_status=by_status, created_total=c.created, committed_total=c.committed,
            aborted_total=c.aborted, timed_out_total=c.timed_out, end_txn_count=c.end_txn_count,
            end_txn_latency_sum_ms=c.end_txn_latency_sum_ms, end_txn_latency_ms=list(c.latencies),
            end_txn_latency_buckets=list(c.latency_buckets),
            low_watermarks={cid: store.low_watermark() for cid, store in self._stores.items()},
            pending_timeouts=len(self._timeouts), ending=len(self._endings))

    # --- ending ---------------------------------------------------------------------------

    def _resume_ending(self, store: LogTransactionMetadataStore, meta: TxnMeta) -> _Ending:
        """Finish a txn whose decision is already durable (COMMITTING / ABORTING)."""
        action = meta.status.outcome
        assert action is not None
        return self._begin_ending(store, meta.txn_id, action, meta.timed_out, decided=True)

    def _begin_ending(self, store: LogTransactionMetadataStore, txn: TxnId, action: TxnAction,
                      timed_out: bool, *, decided: bool) -> _Ending:
        ending = _Ending(action, timed_out, Outcome())
        self._endings[txn] = ending
        ending.task = asyncio.create_task(self._end(store, txn, ending, decided),
                                          name=f"end-txn-{txn}-{action.name}")
        return ending

    async def _end(self, store: LogTransactionMetadataStore, txn: TxnId, ending: _Ending, decided: bool) -> None:
        deciding = _DECIDING[ending.action]
        try:
            if decided:
                meta, decision = store.get(txn), None
            else:
                try:
                    meta, decision = store.submit_decision(txn, deciding, timed_out=ending.timed_out)
                except Exception:
                    self._rearm_timeout(store, txn)
                    raise
            self._timeouts.cancel(txn)
            final = (TxnStatus.COMMITTED if ending.action == TxnAction.COMMIT
                     else TxnStatus.TIME_OUT if meta.timed_out else TxnStatus.ABORTED)
            await self._tell_participants(store, meta, ending.action, decision, ending.decided)
            # Every participant has applied the decision durably: the outcome is final and the
            # caller is answered now, before the terminal record (see _write_final_status).
            self._counters.record_ended(final)
            ending.done.set_result(final)
            self._write_final_status(store, txn, final, deciding)
        except asyncio.CancelledError:
            _stopped(txn, ending)
            raise
        except Exception as exc:
            if not ending.decided.done():
                ending.decided.set_exception(exc)
            if not ending.done.done():
                ending.done.set_exception(exc)
            else:
                log.error("could not write the end of %s (recovery will): %s", txn, exc)
        finally:
            if self._endings.get(txn) is ending:
                del self._endings[txn]

    def _write_final_status(self, store: LogTransactionMetadataStore, txn: TxnId, final: TxnStatus,
                            deciding: TxnStatus) -> None:
        """The terminal record only lets the log be trimmed (after a crash before it lands,
        recovery resumes the ending, which is idempotent): no task waits for it. If its write
        fails, a task repeats it until it lands."""
        written = store.submit_final_status(txn, final, deciding)
        self._final_writes.add(written)
        written.add_done_callback(partial(self._final_status_settled, store, txn, final, deciding))

    def _final_status_settled(self, store: LogTransactionMetadataStore, txn: TxnId, final: TxnStatus,
                              deciding: TxnStatus, written: asyncio.Future[Any]) -> None:
        self._final_writes.discard(written)
        if written.cancelled() or written.exception() is None or self._state != "running":
            return
        log.warning("writing %s for %s failed, retrying: %r", final.name, txn, written.exception())
        retry = asyncio.ensure_future(until_confirmed(
            lambda: store.update_status(txn, final, deciding), f"writing {final.name} for {txn}", self.backoff,
            retry_on=(PersistenceError,), local=True))
        self._final_retries.add(retry)
        retry.add_done_callback(partial(self._final_retry_done, txn))

    def _final_retry_done(self, txn: TxnId, retry: asyncio.Task[Any]) -> None:
        self._final_retries.discard(retry)
        if not retry.cancelled() and retry.exception() is not None:
            log.error("could not write the end of %s (recovery will): %s", txn, retry.exception())

    async def _tell_participants(self, store: LogTransactionMetadataStore, meta: TxnMeta, action: TxnAction,
                                 decision: asyncio.Future[Any] | None, decided: Outcome[None]) -> None:
        """Tell every participant the decision. `decision` (its record's write, when it is
        not durable yet): the partitions are told at once and write their markers into the
        same group commit, conditional on it; the subscriptions, whose acks go into
        cursors shared with non-transactional acks, are told once it is durable. If it
        fails, nothing was applied anywhere: the txn is OPEN again and this raises.
        `decided` is set once the decision is durable."""
        txn, participants = meta.txn_id, self.participants

        def tell(topic: str) -> Awaitable[None]:
            return until_confirmed(
                lambda: participants.end_txn_on_partition(topic, txn, action, store.low_watermark(), after=decision),
                f"{action.name} of {txn} on partition {topic}", self.backoff, gone=GONE_ERRORS)

        # Partitions that took the decision at once (a loaded topic's marker, queued now), and
        # the others, told by a task of their own: both before the decision is awaited, so
        # that the markers share its group commit.
        started, others = [], []
        now = getattr(participants, "end_txn_on_partition_now", None)
        for topic in meta.partitions:
            try:
                ended = now(topic, txn, action, store.low_watermark(), after=decision) if now is not None else None
            except Exception as exc:                # the coroutine path retries what this refused
                log.warning("%s of %s on partition %s could not start at once: %r", action.name, txn, topic, exc)
                ended = None
            if ended is None:
                others.append(tell(topic))
            else:
                ended.add_done_callback(mark_retrieved)     # a failed decision fails it unread
                started.append((topic, ended))
        told = asyncio.ensure_future(_all(others)) if others else None
        if told is not None:
            told.add_done_callback(mark_retrieved)
        try:
            if decision is not None:
                try:
                    await store.written(decision)
                except Exception:
                    self._rearm_timeout(store, txn)
                    raise
            decided.set_result(None)
            subscriptions = [until_confirmed(
                                 lambda topic=topic, sub=sub: participants.end_txn_on_subscription(
                                     topic, sub, txn, action, store.low_watermark()),
                                 f"{action.name} of {txn} on subscription {topic}/{sub}", self.backoff,
                                 gone=GONE_ERRORS)
                             for topic, sub in meta.subscriptions]
            if subscriptions:
                await _all(subscriptions)
            for topic, ended in started:
                try:
                    await ended
                except GONE_ERRORS:
                    pass
                except Exception as exc:            # the decision is durable: repeat until it lands
                    log.warning("%s of %s on partition %s failed, retrying: %r", action.name, txn, topic, exc)
                    await tell(topic)
            if told is not None:
                await told
        finally:
            # A failed decision failed the markers too: stop retrying them. A cancelled ending
            # (the coordinator closing) resumes after a restart.
            if told is not None and not told.done():
                told.cancel()

    # --- timeouts -------------------------------------------------------------------------

    def _on_timeout(self, txn: TxnId) -> None:
        if self._state != "running" or txn in self._endings:
            return      # being ended: if that ending fails before deciding, it re-arms the timeout
        store = self._stores[txn.most_bits]
        try:
            status = store.get(txn).status
        except TransactionNotFoundError:
            return
        if status == TxnStatus.OPEN:
            log.info("transaction %s timed out: aborting it", txn)
            self._begin_ending(store, txn, TxnAction.ABORT, timed_out=True, decided=False)

    def _rearm_timeout(self, store: LogTransactionMetadataStore, txn: TxnId) -> None:
        """The decision could not be written: the txn stays OPEN and must still time out."""
        try:
            meta = store.get(txn)
        except TransactionNotFoundError:
            return
        if meta.status == TxnStatus.OPEN and self._state == "running":
            self._timeouts.add(txn, max(meta.start_ms + meta.timeout_ms, self._clock() + self.backoff.initial_ms))

    # --- purge ----------------------------------------------------------------------------

    def _arm_purge(self) -> None:
        self._purge_timer = asyncio.get_running_loop().call_later(self.purge_interval_ms / 1000, self._purge_now)

    def _purge_now(self) -> None:
        if self._state != "running" or (self._purge_task is not None and not self._purge_task.done()):
            return
        self._purge_task = asyncio.create_task(self._purge_and_rearm(), name="txn-coordinator-purge")

    async def _purge_and_rearm(self) -> None:
        try:
            await self.purge_finished()
            # Deleted transaction keys are kept as long as finished transactions are: a request
            # of one of their transactions is answered "expired" until then.
            await self.keys.purge_deleted(self._store_options["finished_retention_ms"])
        except Exception:
            log.exception("purging finished transactions failed; retrying at the next interval")
        if self._state == "running":
            self._arm_purge()

    # --- helpers --------------------------------------------------------------------------

    def _store_of(self, txn: TxnId) -> LogTransactionMetadataStore:
        return self.store(check_txn(txn).most_bits)

    def _check_running(self) -> None:
        if self._state != "running":
            raise ServiceNotReadyError(f"the transaction coordinator service is {self._state}")


def _check_participants(topics: list[str]) -> None:
    """Refuse a topic no participant can answer for: every end of the txn would be repeated
    forever (never answered, the txn stuck deciding across restarts, its coordinator's low
    watermark held back for good)."""
    for topic in topics:
        if topic.startswith(SCALABLE_DOMAIN):
            raise NotAllowedError(f"{topic} is a scalable topic, not a transaction participant: "
                                  "register its segment:// topics")


async def _all(calls: list[Awaitable[Any]]) -> None:
    if len(calls) == 1:
        await calls[0]                       # spares gather's task per call in the common case
    else:
        await asyncio.gather(*calls)


def _stopped(txn: TxnId, ending: _Ending) -> None:
    for outcome in (ending.decided, ending.done):
        if not outcome.done():
            outcome.set_exception(ServiceNotReadyError(
                f"the transaction coordinator closed while ending {txn}; it resumes on restart"))

