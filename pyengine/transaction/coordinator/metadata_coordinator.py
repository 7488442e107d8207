"""Transaction coordinator v5 (PIP-473): every transaction is one header in the metadata store.

* NEW_TXN creates `/txn/<txnId>` OPEN (create-if-absent) with its deadline. Ids come from
  blocks reserved by CAS on one allocator record, so any number of brokers can run this
  coordinator on one store and never hand out the same id.
* ADD_PARTITION_TO_TXN / ADD_SUBSCRIPTION_TO_TXN are no-ops: participants write their own op
  records when the write or ack arrives; the coordinator never enumerates them.
* END_TXN is ONE compare-and-set of the header OPEN -> COMMITTED/ABORTED, with `finalized_ms`
  in the same write (the linearisation point), then the answer. No fan-out, no call to any
  participant: they learn the decision from their header watch. Repeating the same decision
  succeeds (a client retrying after a lost answer); the other one is InvalidTxnStatusError.
* The timeout sweep range-queries `idx:txn-by-deadline` up to now and aborts each (the same
  single CAS). The GC sweep range-queries `idx:txn-by-final-state` for headers finalized more
  than `retention_ms` ago, force-deletes the op records left by participants that never
  materialised, then deletes the header (CAS on its version).
* There is no log and nothing to replay: `start()` only declares the indexes; whichever broker
  runs the sweeps (all of them may: every step is a CAS) resumes from the records.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from typing import Any

from pyengine.errors import (
    InvalidTxnStatusError,
    NotAllowedError,
    ServiceNotReadyError,
    TransactionCoordinatorNotFoundError,
    TransactionNotFoundError,
)
from pyengine.metadata import AlreadyExistsError, BadVersionError, GuardFailedError, MetadataStore, NotFoundError
from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator import TxnMeta
from pyengine.transaction.coordinator.clock import Clock, wall_clock_ms
from pyengine.transaction.coordinator.metadata_metrics import V5Metrics
from pyengine.transaction.coordinator.metadata_records import (
    ID_BLOCK_PATH,
    IDX_DEADLINE,
    IDX_FINAL,
    OP_PREFIX,
    V5_COORDINATOR_ID,
    CorruptTxnRecordError,
    HeaderState,
    OpRecord,
    TxnHeader,
    buffer_path,
    declare_indexes,
    header_path,
    op_prefix,
    txn_key,
    txn_of_path,
)
from pyengine.transaction.coordinator.stats import Counters
from pyengine.transaction.coordinator.validation import (
    check_action,
    check_int,
    check_partitions,
    check_subscriptions,
    check_txn,
)
from pyengine_kernels import AbortedTxnSet, Position, TxnId

log = logging.getLogger(__name__)

DEFAULT_MAX_TIMEOUT_MS = 6 * 60 * 60 * 1000       # as the v4 service
DEFAULT_RETENTION_MS = 60 * 1000                  # the spec's example retention window
DEFAULT_SWEEP_INTERVAL_MS = 1000
DEFAULT_ID_BLOCK = 1000
MAX_REMEMBERED = 100_000          # headers remembered for a read-free END_TXN

_FINAL = {TxnAction.COMMIT: HeaderState.COMMITTED, TxnAction.ABORT: HeaderState.ABORTED}


class MetadataTransactionCoordinator:
    """The v5 coordinator of one broker over `store` (shared by every broker of a cluster)."""

    coordinator_id = V5_COORDINATOR_ID

    def __init__(self, store: MetadataStore, *, clock: Clock = wall_clock_ms,
                 max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS, retention_ms: int = DEFAULT_RETENTION_MS,
                 sweep_interval_ms: int = DEFAULT_SWEEP_INTERVAL_MS, id_block: int = DEFAULT_ID_BLOCK,
                 metrics: V5Metrics | None = None) -> None:
        for name, value in (("max_timeout_ms", max_timeout_ms), ("sweep_interval_ms", sweep_interval_ms),
                            ("id_block", id_block)):
            if check_int(value, name) <= 0:
                raise ValueError(f"{name} must be > 0, not {value}")
        if check_int(retention_ms, "retention_ms") < 0:
            raise ValueError(f"retention_ms must be >= 0, not {retention_ms}")
        self.store = store
        self.clock = clock
        self.max_timeout_ms = max_timeout_ms
        self.retention_ms = retention_ms
        self.sweep_interval_ms = sweep_interval_ms
        self.id_block = id_block
        self.metrics = metrics or V5Metrics()
        self._next_id = 0
        self._id_limit = 0
        self._id_lock = asyncio.Lock()
        self._counters = Counters()
        self._sweeper: asyncio.Task | None = None
        # Headers this coordinator created, with their version: END_TXN can CAS at once (no
        # read first). A stale entry only costs a failed CAS, then the read-and-CAS loop.
        self._created: collections.OrderedDict[TxnId, TxnHeader] = collections.OrderedDict()
        self._state = "new"
        self.orphans_collected = 0

    @property
    def coordinator_ids(self) -> list[int]:
        return [V5_COORDINATOR_ID]

    def serves(self, coordinator_id: int) -> bool:
        return coordinator_id == V5_COORDINATOR_ID

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, *, sweep: bool = True) -> None:
        """Ready at once: nothing to replay. `sweep`: run the timeout and GC sweeps every
        `sweep_interval_ms` in the background (tests drive them by hand)."""
        if self._state != "new":
            raise ServiceNotReadyError(f"the v5 transaction coordinator is {self._state}")
        declare_indexes(self.store)
        self._state = "running"
        if sweep:
            self._sweeper = asyncio.create_task(self._sweep_loop(), name="v5-txn-sweeps")

    async def close(self) -> None:
        self._state = "closed"
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)

    # --- transactions ---------------------------------------------------------------------

    async def new_transaction(self, coordinator_id: int, timeout_ms: int) -> TxnId:
        self._check_running()
        if check_int(coordinator_id, "coordinator_id") != V5_COORDINATOR_ID:
            raise TransactionCoordinatorNotFoundError(f"transaction coordinator {coordinator_id} is not the v5 one")
        check_int(timeout_ms, "timeout_ms")
        if not 0 < timeout_ms <= self.max_timeout_ms:
            raise NotAllowedError(f"transaction timeout must be between 1 and {self.max_timeout_ms} ms, "
                                  f"not {timeout_ms}")
        txn = TxnId(V5_COORDINATOR_ID, await self._allocate_id())
        now = self.clock()
        header = TxnHeader(HeaderState.OPEN, now + timeout_ms, now)
        await self.store.create(header_path(txn), header.encode(), partition_key=txn_key(txn))
        self._created[txn] = header
        if len(self._created) > MAX_REMEMBERED:
            self._created.popitem(last=False)
        self._counters.created += 1
        return txn

    async def _allocate_id(self) -> int:
        async with self._id_lock:
            if self._next_id >= self._id_limit:
                while True:
                    record = await self.store.get(ID_BLOCK_PATH)
                    start = 0 if record is None else _id_block_start(record.value)
                    try:
                        await self.store.put(ID_BLOCK_PATH, json.dumps(start + self.id_block).encode(),
                                             -1 if record is None else record.version)
                    except BadVersionError:
                        continue        # another broker took a block meanwhile
                    self._next_id, self._id_limit = start, start + self.id_block
                    break
            txn_seq = self._next_id
            self._next_id += 1
            return txn_seq

    def register_produced_partitions(self, txn: TxnId, partitions: list[str]) -> asyncio.Future[Any]:
        """No-op (PIP-473): the participant writes its own op record with the write."""
        self._check_running()
        self._check_own(check_txn(txn))
        check_partitions(partitions)
        return _done()

    def register_acked_subscriptions(self, txn: TxnId, subscriptions: list[tuple[str, str]]) -> asyncio.Future[Any]:
        self._check_running()
        self._check_own(check_txn(txn))
        check_subscriptions(subscriptions)
        return _done()

    async def add_produced_partitions(self, txn: TxnId, partitions: list[str]) -> None:
        await self.register_produced_partitions(txn, partitions)

    async def add_acked_subscriptions(self, txn: TxnId, subscriptions: list[tuple[str, str]]) -> None:
        await self.register_acked_subscriptions(txn, subscriptions)

    async def get_header(self, txn: TxnId) -> tuple[TxnHeader, int] | None:
        """The header and its version, or None."""
        record = await self.store.get(header_path(check_txn(txn)))
        if record is None:
            return None
        return TxnHeader.decode(record.value, record.path), record.version

    async def get(self, txn: TxnId) -> TxnMeta:
        self._check_running()
        found = await self.get_header(self._check_own(check_txn(txn)))
        if found is None:
            raise TransactionNotFoundError(f"transaction {txn} not found")
        header, _version = found
        return TxnMeta(txn, header.state.status, header.timeout_ms - header.created_ms, header.created_ms,
                       header.finalized_ms if header.finalized_ms is not None else header.created_ms)

    async def end_transaction(self, txn: TxnId, action: TxnAction) -> TxnStatus:
        """One CAS OPEN -> COMMITTED/ABORTED; returns the final status. The same decision again
        succeeds; the other is InvalidTxnStatusError; an unknown txn TransactionNotFoundError."""
        self._check_running()
        action = check_action(action)
        self._check_own(check_txn(txn))
        started = time.perf_counter()
        status = await self._decide(txn, action, timed_out=False)
        self._counters.record_end_txn((time.perf_counter() - started) * 1000)
        return status

    async def _decide(self, txn: TxnId, action: TxnAction, *, timed_out: bool) -> TxnStatus:
        wanted = _FINAL[action]
        path = header_path(txn)
        created = self._created.pop(txn, None)
        if created is not None and not (timed_out and created.timeout_ms > self.clock()):
            final = TxnHeader(wanted, created.timeout_ms, created.created_ms, self.clock())
            try:
                await self.store.put(path, final.encode(), 0, partition_key=txn_key(txn))
            except (BadVersionError, NotFoundError):
                self.metrics.cas("conflict")        # changed since: read it (below)
            else:
                self.metrics.cas("ok")
                return self._ended(wanted, timed_out)
        while True:
            record = await self.store.get(path)
            if record is None:
                self.metrics.cas("reject")
                raise TransactionNotFoundError(f"transaction {txn} not found")
            header = TxnHeader.decode(record.value, path)
            if header.state.final:
                if header.state is wanted:
                    return wanted.status            # a retried END_TXN: the decision stands
                self.metrics.cas("reject")
                raise InvalidTxnStatusError(f"transaction {txn}: expected OPEN but is {header.state.value}")
            if timed_out and header.timeout_ms > self.clock():
                return TxnStatus.OPEN               # its deadline moved: not expired any more
            final = TxnHeader(wanted, header.timeout_ms, header.created_ms, self.clock())
            try:
                await self.store.put(path, final.encode(), record.version, partition_key=txn_key(txn))
            except (BadVersionError, NotFoundError):
                self.metrics.cas("conflict")
                continue                            # changed under us: read it again
            self.metrics.cas("ok")
            return self._ended(wanted, timed_out)

    def _ended(self, wanted: HeaderState, timed_out: bool) -> TxnStatus:
        """Count the decision this coordinator's CAS landed. A timeout's is TIME_OUT: the
        sweep counts only those (an abort found already decided was someone else's)."""
        status = TxnStatus.TIME_OUT if timed_out else wanted.status
        self._counters.record_ended(status)
        return status

    # --- sweeps ---------------------------------------------------------------------------

    async def sweep_timeouts(self) -> int:
        """Abort every OPEN txn whose deadline has passed; returns how many."""
        self._check_running()
        expired = await self.store.range_query(IDX_DEADLINE, None, self.clock() + 1)
        aborted = 0
        for record in expired:
            try:
                txn = txn_of_path(record.path)
                if await self._decide(txn, TxnAction.ABORT, timed_out=True) is TxnStatus.TIME_OUT:
                    aborted += 1
                    log.info("v5 transaction %s timed out: aborted", txn)
            except (InvalidTxnStatusError, TransactionNotFoundError):
                pass                                # ended (or collected) meanwhile
            except CorruptTxnRecordError as exc:
                # Left as it is: raised, it stopped the sweep of every txn after it, each time.
                log.error("v5 timeout sweep: %s", exc)
        return aborted

    async def collect_garbage(self) -> int:
        """Delete the headers finalized more than `retention_ms` ago, force-deleting the op
        records their participants left; returns how many headers were deleted.

        A participant that never materialised the decision (its segment was not loaded, or
        crashed) must not lose it with the records: the aborted txn's writes are added to that
        segment's stored aborted set first (what the buffer itself would have done), and a
        committed txn whose leftovers still need their participant - acks to apply to a
        cursor, late writes to hide - keeps its header and op records until it materialised."""
        self._check_running()
        cutoff = self.clock() - self.retention_ms
        deleted = 0
        for state in (HeaderState.COMMITTED, HeaderState.ABORTED):
            for record in await self.store.range_query(IDX_FINAL, (state.value,), (state.value, cutoff + 1)):
                try:
                    txn = txn_of_path(record.path)
                    settled = await self._settle_leftovers(txn, state, record.mod_revision)
                    if settled is None:
                        continue
                except CorruptTxnRecordError as exc:
                    # Kept (its participants' records are not understood): raised, it stopped
                    # the GC of every txn after it - the oldest first - at each sweep.
                    log.error("GC of v5 transaction %s skipped: %s", record.path, exc)
                    continue
                orphans = await self._delete_ops(settled)
                if orphans:
                    self.orphans_collected += orphans
                    log.info("GC of v5 transaction %s: deleted %d op records its participants left", txn, orphans)
                if await self._any_ops(txn):
                    # A late write recorded since the listing (or one rewritten): not settled,
                    # so kept with the header; the next sweep settles it.
                    log.info("GC of v5 transaction %s deferred: op records written since it listed them", txn)
                    continue
                try:
                    await self.store.delete(record.path, record.version)
                    deleted += 1
                except (NotFoundError, BadVersionError):
                    pass                            # another broker's sweep got there first
        self.metrics.outstanding_op_records = await self.count_op_records()
        return deleted

    async def _settle_leftovers(self, txn: TxnId, state: HeaderState, decided_revision: int) -> list[Any] | None:
        """Make the op records `txn`'s participants left safe to delete; returns them (only
        these may go: one written after the listing is not settled), None: keep them."""
        leftovers: list[tuple[Any, OpRecord]] = []
        after = None
        while True:
            page = await self.store.list_prefix(op_prefix(txn), after=after, limit=1000)
            leftovers += [(record, OpRecord.decode(record.value, record.path)) for record in page]
            if not page.more:
                break
            after = page.last_path
        if state is HeaderState.COMMITTED:
            waiting = [op for record, op in leftovers
                       if op.kind == "ack" or record.create_revision > decided_revision]
            if waiting:
                log.info("GC of v5 transaction %s deferred: %d op records wait for their participants "
                         "(acks to apply, late writes to hide)", txn, len(waiting))
            return None if waiting else [record for record, _op in leftovers]
        last_write: dict[str, Position] = {}
        read: dict[str, Any] = {}           # an op record read of each segment: the guard of its abort
        for record, op in leftovers:
            if op.kind == "write" and (op.segment not in last_write or op.position > last_write[op.segment]):
                last_write[op.segment] = op.position
                read[op.segment] = record
        if getattr(self.store, "env", None) is None:
            # A separate store (etcd, memory): a buffer records a txn's first entry before it
            # is appended, at a lower bound of its position (maybe in an earlier ledger), and
            # which record is such a bound is not told. An abort put there is forgotten by a
            # trim of that ledger while the entry stays: the end instead, which the buffer's
            # recovery moves to its LAC (on LMDB every record is its entry's position).
            last_write = dict.fromkeys(last_write, Position.LATEST)
        for segment, position in last_write.items():
            await self._record_abort(segment, txn, position, guard=read[segment])
        return [record for record, _op in leftovers]

    async def _record_abort(self, segment: str, txn: TxnId, position: Position, *, guard: Any = None) -> None:
        """Add `txn` to `segment`'s stored aborted set (compare-and-set: its buffer may save it).
        `guard`: an op record of `txn` there, which the write needs unchanged: the segment's
        deletion removes its op records before its aborted set, so an abort read before a
        deletion and written after it would create the set again for a segment that is gone."""
        path = buffer_path(segment)
        guarded = {} if guard is None else {"guard_path": guard.path, "guard_mod_revision": guard.mod_revision}
        while True:
            stored = await self.store.get(path)
            aborted = AbortedTxnSet.from_bytes(stored.value) if stored is not None else AbortedTxnSet()
            if txn in aborted:
                return
            aborted.add(txn, position)
            try:
                await self.store.put(path, aborted.to_bytes(), stored.version if stored is not None else -1,
                                     **guarded)
                log.info("GC of v5 transaction %s: recorded its abort for %s, which had not", txn, segment)
                return
            except GuardFailedError:
                return                      # its op record is gone: the segment was deleted meanwhile
            except (BadVersionError, AlreadyExistsError):
                continue

    async def _delete_ops(self, records: list[Any]) -> int:
        """Delete the op records `_settle_leftovers` listed and settled, each as it was listed:
        a late write's record created since (its abort not stored for its segment) must stay
        for its participant, which deletes it once it saved the abort itself."""
        count = 0
        for record in records:
            try:
                await self.store.delete(record.path, expected_mod_revision=record.mod_revision)
                count += 1
            except (NotFoundError, BadVersionError):
                pass                        # deleted by its participant, or written again since
        self.metrics.ops_deleted(count)
        return count

    async def _any_ops(self, txn: TxnId) -> bool:
        return bool(await self.store.list_prefix(op_prefix(txn), limit=1))

    async def count_op_records(self) -> int:
        total, after = 0, None
        while True:
            page = await self.store.list_prefix(OP_PREFIX, after=after, limit=10_000)
            total += len(page)
            if not page.more:
                return total
            after = page.last_path

    async def _sweep_loop(self) -> None:
        while self._state == "running":
            await asyncio.sleep(self.sweep_interval_ms / 1000)
            try:
                await self.sweep_timeouts()
                await self.collect_garbage()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("v5 transaction sweeps failed; retrying at the next interval")

    # --- stats ----------------------------------------------------------------------------

    async def open_count(self) -> int:
        """Transactions still OPEN in the store (every broker's): one index range query."""
        return len(await self.store.range_query(IDX_DEADLINE))

    @property
    def counters(self) -> Counters:
        """Its counters since it started (created, ended, END_TXN latencies)."""
        return self._counters

    def stats(self) -> dict:
        c = self._counters
        return {"coordinator_id": V5_COORDINATOR_ID, "created_total": c.created, "committed_total": c.committed,
                "aborted_total": c.aborted, "timed_out_total": c.timed_out, "end_txn_count": c.end_txn_count,
                "end_txn_latency_sum_ms": c.end_txn_latency_sum_ms, "orphans_collected": self.orphans_collected,
                **self.metrics.as_dict()}

    # --- helpers --------------------------------------------------------------------------

    def _check_own(self, txn: TxnId) -> TxnId:
        if txn.most_bits != V5_COORDINATOR_ID:
            raise TransactionCoordinatorNotFoundError(f"transaction {txn} is not a v5 transaction")
        return txn

    def _check_running(self) -> None:
        if self._state != "running":
            raise ServiceNotReadyError(f"the v5 transaction coordinator is {self._state}")


def _id_block_start(value: bytes) -> int:
    """The next free id the allocator record holds. Anything but a whole number that leaves
    room for a block of 64-bit ids is corrupt: read leniently (`1.5`, `true` as 1), it handed
    out ids given before; a negative one failed each NEW_TXN with an UnknownError."""
    try:
        start = json.loads(value)
    except ValueError:
        start = None
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < 2**63:
        raise CorruptTxnRecordError(f"the v5 txn id allocator {ID_BLOCK_PATH} holds {bytes(value)[:64]!r}, "
                                    "not a next id")
    return start


def _done() -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


__all__ = ["MetadataTransactionCoordinator"]
