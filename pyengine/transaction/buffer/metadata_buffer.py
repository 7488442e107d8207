"""v5 transaction buffer of a `segment://` topic (PIP-473 `MetadataTransactionBuffer`).

Nothing transactional is ever written into the segment's stream: no markers, no snapshots.

* append = one managed-ledger append plus one op record `/txn-op/<txnId>/<seq>` (kind write,
  this segment, the position); the publish receipt waits for both. Before it, the header must
  be OPEN (cache first) — else TransactionConflictError. After the op record lands, the header
  is read again: if its decision has a lower store revision than the op record, the write came
  after the decision (the late-write race): the sender gets TransactionConflictError and the
  entry is never visible (aborted: by the abort, its op record kept until the abort is saved;
  committed: its position is hidden, durably in a ledger property). A send whose op record
  fails is told so, and its entry, if it landed anyway, is hidden the same way.
* the read horizon is the LAC, or just before the first entry of the oldest txn still OPEN here.
* decisions arrive through the broker's `TxnHeaderCache` (a metadata-store watch, with the
  deadline re-read as a backstop). Materialising them writes nothing to the segment, so a
  sealed segment commits and aborts like any other: commit = the txn stops holding the horizon
  back; abort = the txn joins the aborted set, stored under `/txn-buffer/<segment>` BEFORE the
  op records go (the aborted set must outlive them: the header and op records are collected).
  Then the buffer deletes the op records it owns. Each step is idempotent: a buffer that
  crashes half-way redoes what is left after its restart.
* recovery reads the store's current state: `idx:writes-by-segment` for this segment (one
  range query), the headers, then the aborted set - the reverse of the order the coordinator's
  GC sweep writes in, so a txn collected meanwhile is found in one of them (a missing header
  whose op records are gone too and that is not in the aborted set was a collected commit).
  No log replay. A write recorded after its txn's commit (a late write whose hiding a crash
  did not let us save) is hidden then.

No crash leaves an entry whose txn the segment does not know: on the LMDB backend (the metadata
store in the data dir) an entry and its op record are one write transaction; with a separate
store (etcd) a txn's first entry on a segment is recorded before it is appended, at a lower
bound of its position (after a restart the horizon may then wait on a few entries that were
in flight beside it, until the txn ends); its later entries are tied to it by txn id.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from pyengine.errors import (
    InvalidTxnStatusError,
    NotAllowedError,
    PersistenceError,
    ServiceNotReadyError,
    TransactionConflictError,
)
from pyengine.metadata import AlreadyExistsError, BadVersionError, MetadataStore, MetadataStoreError, NotFoundError
from pyengine.storage import ManagedLedger, StorageError
from pyengine.storage.entry import Entry
from pyengine.transaction.buffer import BufferState, TransactionBuffer
from pyengine.transaction.buffer.replay import read_horizon
from pyengine.transaction.coordinator.metadata_headers import TxnHeaderCache
from pyengine.transaction.coordinator.metadata_metrics import V5Metrics
from pyengine.transaction.coordinator.metadata_records import (
    IDX_ACKS,
    IDX_WRITES,
    CorruptTxnRecordError,
    HeaderState,
    OpRecord,
    TxnHeader,
    buffer_path,
    header_path,
    is_v5,
    op_prefix,
    txn_key,
    txn_of_path,
)
from pyengine_kernels import AbortedTxnSet, OngoingTxnMap, Position, TxnId

log = logging.getLogger(__name__)

HIDDEN_PROPERTY = "__v5_hidden_positions"      # late writes of committed txns: "L:E,L:E"


class MetadataTransactionBuffer(TransactionBuffer):
    def __init__(self, ledger: ManagedLedger, store: MetadataStore, headers: TxnHeaderCache, *,
                 segment: str | None = None, metrics: V5Metrics | None = None) -> None:
        if not isinstance(ledger, ManagedLedger):
            raise TypeError(f"ledger must be a ManagedLedger, not {type(ledger).__name__}")
        self.ledger = ledger
        self.store = store
        self.headers = headers
        self.segment = segment or ledger.name
        self.metrics = metrics or V5Metrics()
        self.state = BufferState.NONE
        self._ongoing = OngoingTxnMap()
        self._aborted = AbortedTxnSet()
        self._last: dict[TxnId, Position] = {}          # last position of each txn held here
        self._ops: dict[TxnId, list[str]] = {}          # op records this buffer owns
        self._in_flight: dict[TxnId, set[asyncio.Future]] = {}
        self._appending: set[asyncio.Task] = set()       # awaited by close()
        self._materialising: dict[TxnId, asyncio.Task] = {}
        self._subscribed: set[TxnId] = set()
        self._hidden: set[Position] = set()
        self._hidden_unsaved = False                   # a save of `_hidden` failed: redo it
        self._hiding: asyncio.Task | None = None        # redoing it in the background
        self._listeners: list[Callable[[], None]] = []
        self._committed_total = 0
        self._aborted_total = 0
        self._late_total = 0
        self._recover_start_ms = self._recover_end_ms = 0
        ledger.add_listener(self._notify)
        ledger.add_failure_listener(self._on_append_failed)
        ledger.add_trim_listener(self._on_trimmed)
        ledger.add_trim_bound(self.max_read_position)     # an open transaction's entries stay
        self._trimming: asyncio.Task | None = None
        self._first_kept: Position | None = None     # the ledger's first entry after a trim
        self._decided_while_recovering: dict[TxnId, TxnHeader | None] = {}
        # The store is the LMDB store of the ledger's own data dir: entry and op record can
        # share one write transaction.
        self._same_commit = getattr(store, "env", None) is ledger.env

    # --- recovery -------------------------------------------------------------------------

    async def recover(self) -> None:
        if self.state is BufferState.READY:
            return
        self.state = BufferState.INITIALIZING
        self._recover_start_ms = time.time_ns() // 1_000_000
        try:
            if self.ledger.number_of_entries == 0:
                # Nothing here for a record to name: what the store holds for this name is an
                # earlier topic's of the same name (left by a crash during its deletion, or
                # by its txns still open then). Loaded, it would hold the horizon back on
                # their old positions, or pending acks on a new ledger's same positions.
                await clear_segment_state(self.store, self.segment)
            # Read in the order the coordinator's GC sweep writes in reverse (it adds an abort
            # to the stored aborted set, then deletes the op records, then the header): op
            # records first, then headers, then the aborted set. A txn collected meanwhile
            # is then found in one of them, and a missing header can be told apart from a
            # collected commit.
            with self.metrics.index_query():
                records = await self.store.range_query(IDX_WRITES, prefix=(self.segment,))
            self._hidden = _parse_positions(self.ledger.properties.get(HIDDEN_PROPERTY, ""))
            writes: dict[TxnId, list[tuple[int, Position]]] = {}
            paths: dict[TxnId, list[str]] = {}
            for record in records:
                txn = txn_of_path(record.path)
                op = OpRecord.decode(record.value, record.path)
                paths.setdefault(txn, []).append(record.path)
                writes.setdefault(txn, []).append((record.create_revision, op.position))
            states = {txn: await self.headers.get(txn) for txn in paths}
            stored, _version = await self._stored_aborted()
            if stored is not None:
                self._aborted = stored
                unplaced = [txn for txn, position in stored.items() if position == Position.LATEST]
                for txn in unplaced:
                    # Recorded by the GC sweep, which cannot know the entries' positions on a
                    # separate store: the LAC is at or after them, and goes with a trim.
                    self._aborted.remove(txn)
                    self._aborted.add(txn, self.ledger.lac)
                if unplaced:
                    await self._save_aborted()      # else a trim's save merges them back
            decided = []
            late: set[Position] = set()
            for txn, state in states.items():
                if state.header is None and txn not in self._aborted \
                        and not await self._any_exists(paths[txn]):
                    # Collected by the GC sweep since the range query, and not as an abort
                    # (that is recorded in the aborted set before the op records go): a
                    # commit, materialised by its collection. Its entries are plain ones.
                    continue
                self._ops[txn] = paths[txn]
                for _revision, position in writes[txn]:
                    self._held(txn, position)
                if not self._same_commit:
                    # A reservation is a lower bound, maybe in an earlier ledger than the entry,
                    # and not told from the other records (sends in flight at once each write
                    # one). An abort put there would be forgotten by a trim of that ledger
                    # while the entry stays; the LAC is at or after every entry.
                    self._last[txn] = max(self._last[txn], self.ledger.lac)
                if state.header is not None and state.header.state is HeaderState.OPEN:
                    self._subscribe(txn)
                    continue
                if state.header is not None and state.header.state is HeaderState.COMMITTED:
                    # A write recorded after the commit lost the late-write race; a crash may
                    # have come before its position was saved as hidden: hide it now.
                    late.update(position for revision, position in writes[txn] if revision > state.revision)
                decided.append((txn, state.header))
            if not late <= self._hidden:
                self._hidden |= late
                await self.ledger.set_property(HIDDEN_PROPERTY, _format_positions(self._hidden))
        except (MetadataStoreError, CorruptTxnRecordError, ValueError, StorageError) as exc:
            self.state = BufferState.NONE
            self._decided_while_recovering = {}     # the next recovery reads them again
            raise ServiceNotReadyError(f"v5 transaction buffer of {self.segment} cannot recover: {exc}") from exc
        self.state = BufferState.READY
        self._recover_end_ms = time.time_ns() // 1_000_000
        decided += self._decided_while_recovering.items()
        self._decided_while_recovering = {}
        for txn, header in decided:       # crashed mid-materialisation, or decided meanwhile
            self._on_decided(txn, header)
        self._notify()

    async def _any_exists(self, paths: list[str]) -> bool:
        for path in paths:
            if await self.store.get(path) is not None:
                return True
        return False

    def _held(self, txn: TxnId, position: Position) -> None:
        """`txn` has an entry at `position` here."""
        if txn not in self._aborted:
            self._ongoing.add(txn, position)
        last = self._last.get(txn)
        if last is None or position > last:
            self._last[txn] = position

    # --- reads ----------------------------------------------------------------------------

    def max_read_position(self) -> Position:
        if self.state is not BufferState.READY:
            return Position.EARLIEST
        return read_horizon(self._ongoing, self.ledger.lac, self.ledger.previous_position)

    def is_txn_aborted(self, txn: TxnId) -> bool:
        if not isinstance(txn, TxnId):
            raise TypeError(f"txn must be a TxnId, not {type(txn).__name__}")
        return txn in self._aborted

    def hides(self, entry: Entry) -> bool:
        return entry.position in self._hidden or super().hides(entry)

    @property
    def aborted(self) -> AbortedTxnSet:
        return self._aborted

    def ongoing_txns(self) -> list[tuple[TxnId, Position]]:
        return self._ongoing.items()

    # --- appends --------------------------------------------------------------------------

    def append(self, txn: TxnId, data: bytes, *, num_messages: int = 1,
               publish_time: int = 0) -> asyncio.Future[Position]:
        if not isinstance(txn, TxnId):
            raise TypeError(f"txn must be a TxnId, not {type(txn).__name__}")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be bytes, not {type(data).__name__}")
        for name, value, minimum in (("num_messages", num_messages, 1), ("publish_time", publish_time, 0)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, not {type(value).__name__}")
            if value < minimum:
                raise ValueError(f"{name} must be >= {minimum}, not {value}")
        loop = asyncio.get_running_loop()
        if self.state is not BufferState.READY:
            return _failed(loop, ServiceNotReadyError(
                f"the v5 transaction buffer of {self.segment} is {self.state.value}"))
        if not is_v5(txn):
            return _failed(loop, NotAllowedError(
                f"{self.segment} takes v5 (metadata-driven) transactions only; {txn} is a v4 transaction"))
        outcome: asyncio.Future[Position] = loop.create_future()
        self._in_flight.setdefault(txn, set()).add(outcome)
        outcome.add_done_callback(lambda _f: self._settled(txn, outcome))
        task = loop.create_task(self._append(txn, bytes(data), num_messages, publish_time, outcome))
        self._appending.add(task)
        task.add_done_callback(self._appending.discard)
        return outcome

    def append_checked(self, txn: TxnId, data: bytes, num_messages: int, publish_time: int,
                       after: asyncio.Future[Any] | None = None) -> asyncio.Future[Position]:
        # Only a v4 txn comes with a registration to wait for (`append_condition`): `append`
        # refuses it with the reason a client can act on.
        if after is not None and not is_v5(txn):
            return self.append(txn, data, num_messages=num_messages, publish_time=publish_time)
        return super().append_checked(txn, data, num_messages, publish_time, after)

    def _settled(self, txn: TxnId, outcome: asyncio.Future) -> None:
        flights = self._in_flight.get(txn)
        if flights is not None:
            flights.discard(outcome)
            if not flights:
                del self._in_flight[txn]

    async def _append(self, txn: TxnId, data: bytes, num_messages: int, publish_time: int,
                      outcome: asyncio.Future[Position]) -> None:
        try:
            outcome.set_result(await self._append_now(txn, data, num_messages, publish_time))
        except BaseException as exc:
            if not outcome.done():
                outcome.set_exception(exc if isinstance(exc, Exception) else
                                      ServiceNotReadyError(f"append to {self.segment} cancelled"))
            if not isinstance(exc, Exception):
                raise

    def _check_not_closed(self) -> None:
        """After a wait, before writing: a buffer closed meanwhile (its segment unloaded or
        being deleted) writes nothing more for an append."""
        if self.state is BufferState.CLOSED:
            raise ServiceNotReadyError(f"the v5 transaction buffer of {self.segment} is closed")

    async def _append_now(self, txn: TxnId, data: bytes, num_messages: int, publish_time: int) -> Position:
        state = await self.headers.get(txn)
        self._check_not_closed()
        if state.header is None or state.header.state is not HeaderState.OPEN:
            raise TransactionConflictError(_not_open(txn, state.header))
        reserved = None
        if not self._same_commit and txn not in self._ops:
            # A separate store (etcd): the txn's first entry here is recorded BEFORE it is
            # appended, at a position no later than its own (the next one the ledger can
            # assign), so no crash can leave an entry of a txn this segment does not know.
            # Later entries of the txn are its own (an abort hides them by txn id).
            ahead = OpRecord("write", self.segment, self.ledger.lac.next())
            try:
                reserved = await self.store.put(op_prefix(txn), ahead.encode(), sequential=True,
                                                partition_key=txn_key(txn))
            except Exception as exc:
                raise PersistenceError(f"transactional append of {txn} to {self.segment}: op record: {exc}") from exc
            self._ops.setdefault(txn, []).append(reserved.path)
            self.metrics.op_written()
            state = await self.headers.get(txn)
            self._check_not_closed()        # the record stays: a deletion (after close) clears it
            if state.header is None or state.header.state is not HeaderState.OPEN:
                await self._reject_late(txn, None, reserved.path, state.header)
                raise TransactionConflictError(_not_open(txn, state.header))
        try:
            position, durable = self.ledger.append_entry(data, txn_most=txn.most_bits, txn_least=txn.least_bits,
                                                         num_messages=num_messages, publish_time=publish_time)
        except StorageError as exc:
            raise PersistenceError(f"cannot append to {self.segment}: {exc}") from exc
        if position is None:
            await durable                      # raises the append's error
            raise PersistenceError(f"cannot append to {self.segment}")
        self._held(txn, position)              # before any reader can reach it
        self._subscribe(txn)
        if reserved is not None:
            record = reserved
        else:
            op = OpRecord("write", self.segment, position)
            # Awaited at once, with no suspension since append_entry: on the LMDB backend the
            # op record is submitted to the same group commit as the entry — one write
            # transaction, so a crash never leaves the entry without the record of its txn.
            try:
                record = await self.store.put(op_prefix(txn), op.encode(), sequential=True,
                                              partition_key=txn_key(txn))
            except Exception as exc:
                # The entry may land without it (on LMDB a failed record does not fail the group
                # commit), and nothing would tie it to its txn after a restart: the sender is
                # told the send failed, so the entry is hidden for good.
                await self._hide_unrecorded(position, durable)
                raise PersistenceError(f"transactional append of {txn} to {self.segment}: op record: {exc}") from exc
            self._ops.setdefault(txn, []).append(record.path)
            self.metrics.op_written()
        try:
            await durable
        except Exception as exc:
            raise PersistenceError(f"transactional append of {txn} to {self.segment} failed: {exc}") from exc
        # The late-write race: did the decision land before this op record?
        header = await self.store.get(header_path(txn))
        if header is None or header.mod_revision < record.mod_revision and \
                TxnHeader.decode(header.value, header.path).state.final:
            decided = None if header is None else TxnHeader.decode(header.value, header.path)
            await self._reject_late(txn, position, record.path, decided,
                                    recorded_at=None if reserved is None else ahead.position)
            raise TransactionConflictError(_not_open(txn, decided))
        return position

    async def _reject_late(self, txn: TxnId, position: Position | None, op_path: str,
                           header: TxnHeader | None, *, recorded_at: Position | None = None) -> None:
        """A write that lost the race with its txn's decision: never visible. `recorded_at`:
        the position its op record names, when that is a reservation's lower bound."""
        self._late_total += 1
        if position is not None and header is not None and header.state is HeaderState.COMMITTED:
            self._hidden.add(position)
            try:
                await self._save_hidden()
            except StorageError as exc:
                # Hidden here; after a restart its op record hides it: kept until the hiding is
                # saved (the commit's materialisation saves it before deleting the records).
                log.warning("saving the hiding of late write %s on %s failed: %s", position, self.segment, exc)
                if recorded_at is not None and recorded_at != position:
                    await self._record_position(txn, op_path, position)
                return
        elif position is not None and header is not None:
            # Aborted: the abort hides the entry, and the op record is what ties it to the
            # txn (and puts the abort at or after it, else a trim forgets it) until the abort
            # is saved here: `_materialise` deletes it then, with the others.
            return
        try:
            await self.store.delete(op_path)
            self.metrics.ops_deleted(1)
        except NotFoundError:
            pass
        ops = self._ops.get(txn)
        if ops and op_path in ops:
            ops.remove(op_path)

    async def _record_position(self, txn: TxnId, op_path: str, position: Position) -> None:
        """Make the reservation at `op_path` name `position`, its entry's: the recovery hides a
        late write at the position its record names, and a reservation's lower bound may be
        another entry's. Its create revision (what tells it late) stays."""
        try:
            # Version 0: a reservation is never written again, and one deleted meanwhile (by
            # the GC, or with its segment) must not be created again.
            await self.store.put(op_path, OpRecord("write", self.segment, position).encode(), 0,
                                 partition_key=txn_key(txn))
        except MetadataStoreError as exc:
            log.warning("recording late write %s at its position on %s failed: %s", position, self.segment, exc)

    async def _hide_unrecorded(self, position: Position, durable: asyncio.Future) -> None:
        """`position` holds an entry whose op record failed: hidden if the entry landed."""
        try:
            await durable
        except Exception:
            return                  # the entry failed too: nothing to hide
        self._hidden.add(position)
        try:
            await self._save_hidden()
        except StorageError as exc:
            # Hidden in memory only, and no record ties the entry to its txn: saved again in the
            # background until it is (and by close()), not only by the next materialisation -
            # a restart before that would expose it.
            log.warning("saving the hiding of unrecorded entry %s on %s failed: %s", position, self.segment, exc)
            if self._hiding is None or self._hiding.done():
                self._hiding = asyncio.get_running_loop().create_task(self._save_hidden_until_saved())

    async def _save_hidden_until_saved(self) -> None:
        delay = 0.1
        while self._hidden_unsaved and self.state is not BufferState.CLOSED:
            await asyncio.sleep(delay)
            delay = min(2 * delay, 5.0)
            try:
                await self._save_hidden()
            except StorageError as exc:
                log.warning("saving the hidden positions of %s failed again: %s", self.segment, exc)

    async def _save_hidden(self) -> None:
        """Save the hidden positions in the ledger. One that fails leaves `_hidden_unsaved` set
        until a save of everything hidden succeeds (the next materialisation retries it)."""
        value = _format_positions(self._hidden)
        try:
            await self.ledger.set_property(HIDDEN_PROPERTY, value)
        except BaseException:
            self._hidden_unsaved = True
            raise
        if value == _format_positions(self._hidden):
            self._hidden_unsaved = False

    def _on_trimmed(self, first_position: Position) -> None:
        """Entries before `first_position` are gone: so is the need to remember aborts whose
        last entry here lies there (and the hidden late writes among them)."""
        self._first_kept = first_position
        if self._aborted.trim_before(first_position) and self.state is BufferState.READY:
            self._trimming = asyncio.get_running_loop().create_task(self._save_trimmed(self._trimming))
        self._hidden = {p for p in self._hidden if p >= first_position}

    async def _save_trimmed(self, previous: asyncio.Task | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])      # one after the other: close() awaits the last
        try:
            await self._save_aborted()
        except MetadataStoreError as exc:      # the next abort or trim saves it again
            log.warning("saving the trimmed aborted set of %s failed: %s", self.segment, exc)

    def _on_append_failed(self, first_failed: Position) -> None:
        gone = [txn for txn, first in self._ongoing.items() if first >= first_failed]
        for txn in gone:
            self._ongoing.remove(txn)
        if gone:
            self._notify()

    # --- decisions ------------------------------------------------------------------------

    def _subscribe(self, txn: TxnId) -> None:
        if txn not in self._subscribed:
            self._subscribed.add(txn)
            self.headers.subscribe(txn, self._on_decided)

    def _on_decided(self, txn: TxnId, header: TxnHeader | None) -> None:
        self._subscribed.discard(txn)
        if self.state is BufferState.INITIALIZING:
            # Subscribed by recovery, decided before it ended: applied once it has (the
            # listener is gone, and nothing else would tell this buffer again).
            self._decided_while_recovering[txn] = header
            return
        if self.state is not BufferState.READY or txn in self._materialising:
            return
        task = asyncio.get_running_loop().create_task(self._materialise(txn, header),
                                                      name=f"v5-materialise-{txn}-{self.segment}")
        self._materialising[txn] = task
        task.add_done_callback(lambda done: self._materialised(txn, done))

    def _materialised(self, txn: TxnId, task: asyncio.Task) -> None:
        # Only its own entry: a failed try has handed the txn to its retry's task already.
        if self._materialising.get(txn) is task:
            del self._materialising[txn]

    async def _materialise(self, txn: TxnId, header: TxnHeader | None) -> None:
        """Apply the decision on `txn` here, then delete the op records this buffer owns.
        A missing header is a collected commit when `_collected_commit` says so, else (an
        abort collected, a header never created) an abort."""
        while flights := self._in_flight.get(txn):
            await asyncio.wait(set(flights))
        try:
            if self._hidden_unsaved:
                # A failed save of hidden writes: saved before op records go (a late write's
                # record is what hides it after a restart until then).
                await self._save_hidden()
            if header is None:
                committed = await self._collected_commit(txn)
            else:
                committed = header.state is HeaderState.COMMITTED
            # (a commit is counted at the end, once: a failed try is redone whole)
            if not committed and txn not in self._aborted:
                self._aborted_total += 1
                last = self._last.get(txn)
                if last is not None:
                    self._aborted.add(txn, last)
                    await self._save_aborted()
            elif not committed and txn in self._ops:
                # Added by a try whose save failed: saved before the op records go (the
                # abort must outlive them, or a restart finds neither).
                await self._save_aborted()
            self._ongoing.remove(txn)
            self._last.pop(txn, None)
            self._notify()
            await self._delete_ops(txn)
            if committed:
                self._committed_total += 1
        except (MetadataStoreError, PersistenceError, StorageError) as exc:
            # Stays as it is in the store: the restart (or the next decision event) redoes it.
            log.warning("materialising %s on %s failed, retrying: %s", txn, self.segment, exc)
            await asyncio.sleep(0.1)
            if self.state is BufferState.READY:
                self._materialising.pop(txn, None)
                self._on_decided(txn, header)

    async def _collected_commit(self, txn: TxnId) -> bool:
        """Whether `txn`, whose header is gone, was a commit the GC sweep collected before this
        buffer learnt of it (its notification lost with a watch, say). The sweep adds an abort
        to the segment's stored aborted set before it deletes the op records, and deletes the
        header last (recovery reads them in that light too): a txn in neither set whose op
        records here are all gone was committed. One whose records remain never had a header."""
        if txn in self._aborted:
            return False
        stored, _version = await self._stored_aborted()
        if stored is not None and txn in stored:
            return False
        paths = self._ops.get(txn, [])
        return bool(paths) and not await self._any_exists(paths)

    async def _save_aborted(self) -> None:
        """Store the aborted set, keeping what the GC sweep recorded there for this segment
        meanwhile (compare-and-set): written over, a collected abort would read as a commit."""
        while True:
            theirs, version = await self._stored_aborted()
            if theirs is not None:
                if self._first_kept is not None:
                    theirs = theirs.since(self._first_kept)     # not what this buffer trimmed
                for txn, position in theirs.items():
                    if position == Position.LATEST:
                        # Stored by the GC sweep, which cannot place it: at the LAC (after its
                        # entries), as recovery does, or no trim would ever drop it.
                        theirs.remove(txn)
                        theirs.add(txn, self.ledger.lac)
                self._aborted.update(theirs)
            try:
                await self.store.put(buffer_path(self.segment), self._aborted.to_bytes(), version)
                return
            except (BadVersionError, AlreadyExistsError):
                continue

    async def _stored_aborted(self) -> tuple[AbortedTxnSet | None, int]:
        """The segment's stored aborted set and its record's version (None, -1: none stored)."""
        stored = await self.store.get(buffer_path(self.segment))
        if stored is None:
            return None, -1
        return AbortedTxnSet.from_bytes(stored.value), stored.version

    async def _delete_ops(self, txn: TxnId) -> None:
        paths = self._ops.pop(txn, [])
        deleted = 0
        for index, path in enumerate(paths):
            try:
                await self.store.delete(path)
                deleted += 1
            except NotFoundError:
                pass          # the GC forced it out already
            except BaseException:
                # Kept for the retry: forgotten, a late write's record would keep its commit
                # from the GC (it waits for this participant) until a restart.
                self._ops.setdefault(txn, []).extend(paths[index:])
                self.metrics.ops_deleted(deleted)
                raise
        self.metrics.ops_deleted(deleted)

    async def wait_materialised(self) -> None:
        """Until no decision is being materialised here (tests, graceful stop)."""
        while self._materialising:
            await asyncio.gather(*list(self._materialising.values()), return_exceptions=True)

    async def commit(self, txn: TxnId, low_watermark: int, *, after: asyncio.Future[Any] | None = None) -> None:
        await self._end_on_request(txn, HeaderState.COMMITTED)      # (the header is the decision)

    async def abort(self, txn: TxnId, low_watermark: int, *, after: asyncio.Future[Any] | None = None) -> None:
        await self._end_on_request(txn, HeaderState.ABORTED)

    async def _end_on_request(self, txn: TxnId, wanted: HeaderState) -> None:
        """Not used by the v5 coordinator: a caller that asks is told what the header says,
        and the decision it holds is materialised (idempotent)."""
        if not isinstance(txn, TxnId):
            raise TypeError(f"txn must be a TxnId, not {type(txn).__name__}")
        state = await self.headers.get(txn, fresh=True)
        found = HeaderState.ABORTED if state.header is None else state.header.state
        if found is not wanted:
            raise InvalidTxnStatusError(f"v5 transaction {txn} is {found.value} in the metadata store, "
                                        f"cannot {'commit' if wanted is HeaderState.COMMITTED else 'abort'} it")
        running = self._materialising.get(txn)
        if running is None and (txn in self._ongoing or txn in self._ops):
            self._on_decided(txn, state.header)
            running = self._materialising.get(txn)
        if running is not None:
            await asyncio.shield(running)

    # --- lifecycle ------------------------------------------------------------------------

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()

    def stats(self) -> dict:
        """The v4 buffer's figures (same keys), without snapshots and replay (PIP-473: none)."""
        return {
            "state": self.state.value,
            "design": "v5",
            "max_read_position": str(self.max_read_position()),
            "ongoing_txn_count": len(self._ongoing),
            "aborted_txn_count": len(self._aborted.items()),
            "committed_total": self._committed_total,
            "aborted_total": self._aborted_total,
            "late_writes_rejected": self._late_total,
            "owned_op_records": sum(map(len, self._ops.values())),
            # the v4 keys the admin API reads: no snapshots, no low watermarks in v5
            "last_snapshot_timestamp": 0,
            "last_snapshot_position": None,
            "low_watermarks": {},
            "recover_start_time": self._recover_start_ms,
            "recover_end_time": self._recover_end_ms,
            "recover_replayed_entries": 0,          # recovery reads the store, not the segment
        }

    async def close(self) -> None:
        self.state = BufferState.CLOSED
        for txn in list(self._subscribed):
            self.headers.unsubscribe(txn, self._on_decided)
        self._subscribed.clear()
        # Appends under way end first (they write nothing more once they see the buffer
        # closed): an op record one of them was writing lands before a deletion, which
        # follows the close, clears the segment's records.
        await asyncio.gather(*self._appending, return_exceptions=True)
        if self._trimming is not None:
            # A save of the trimmed aborted set under way lands first: after the deletion that
            # follows the close, it would store the set again for a segment that is gone.
            await asyncio.wait([self._trimming])
        if self._hiding is not None:
            self._hiding.cancel()
            await asyncio.gather(self._hiding, return_exceptions=True)
        if self._hidden_unsaved:
            # A last try (the ledger closes after the buffer): a restart must not expose them.
            try:
                await self._save_hidden()
            except Exception as exc:
                log.warning("saving the hidden positions of %s at its close failed: %s", self.segment, exc)
        tasks = list(self._materialising.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def delete(self) -> None:
        """The segment is deleted (its entries are gone): its stored aborted set and every op
        record naming it go too. Left, the GC sweep would store the abort of a txn still open
        here again (for good), or keep a commit's header waiting for a participant that is
        gone; and a segment created again under the name would load them."""
        await clear_segment_state(self.store, self.segment)


async def clear_segment_state(store: MetadataStore, segment: str) -> None:
    """Remove the v5 state naming `segment`: op records (writes, then acks of every
    subscription), then its stored aborted set (last: the GC sweep stores an abort from
    the op records it finds)."""
    for index, prefix in ((IDX_WRITES, (segment,)), (IDX_ACKS, (segment,))):
        for record in await store.range_query(index, prefix=prefix):
            try:
                await store.delete(record.path)
            except NotFoundError:
                pass
    try:
        await store.delete(buffer_path(segment))
    except NotFoundError:
        pass


def _not_open(txn: TxnId, header: TxnHeader | None) -> str:
    state = "unknown (or collected)" if header is None else header.state.value
    return f"Transaction {txn} is {state}, not OPEN: a send or ack in it is a conflict"


def _parse_positions(text: str) -> set[Position]:
    out = set()
    for item in filter(None, text.split(",")):
        ledger, _sep, entry = item.partition(":")
        out.add(Position(int(ledger), int(entry)))
    return out


def _format_positions(positions: set[Position]) -> str:
    return ",".join(f"{p.ledger_id}:{p.entry_id}" for p in sorted(positions))


def _failed(loop: asyncio.AbstractEventLoop, error: BaseException) -> asyncio.Future:
    future = loop.create_future()
    future.set_exception(error)
    return future
