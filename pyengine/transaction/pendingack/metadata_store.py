"""v5 pending acks of a `segment://` subscription (PIP-473 `MetadataPendingAckStore`).

`MetadataPendingAckStore` keeps each transactional ack request as op records
`/txn-op/<txnId>/<seq>` (kind ack, segment, subscription, position; one per acknowledged
entry, one for a cumulative ack), found again through `idx:acks-by-segment-subscription`.
It offers the log interface `PendingAckHandleImpl` drives (append, delete, scan), so the
conflict rules, the batch ack sets and the cursor work are the v4 handle's, unchanged.

`MetadataPendingAckHandle` is that handle for v5: nobody calls its commit/abort. It subscribes
to the header of every txn it holds acks of (the broker's `TxnHeaderCache`) and, when the
header turns final, commits (acks applied to the cursor, then the op records deleted) or
aborts (op records deleted; the messages are delivered again). A missing header counts as
aborted. An ack in a txn whose header is not OPEN, or whose op record landed after the
decision (the late-ack race), is a TransactionConflictError and reserves nothing. Replay
is one range query on the index, grouped by txn; decided txns found there (a crash mid-way)
are finished at once: applying acks to a cursor twice changes nothing.

A consumer's rewind (its client's redelivery request, sent after an abort) must not overtake
the watch: `resolve_decided` reads the headers of the txns holding acks and applies their
decisions first (read-your-writes), as v4's END_TXN has released them before it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pyengine.errors import NotAllowedError, PersistenceError, TransactionConflictError
from pyengine.metadata import MetadataStore, MetadataStoreError, NotFoundError, Record
from pyengine.transaction.coordinator.metadata_headers import TxnHeaderCache
from pyengine.transaction.coordinator.metadata_metrics import V5Metrics
from pyengine.transaction.coordinator.metadata_records import (
    IDX_ACKS,
    CorruptTxnRecordError,
    HeaderState,
    OpRecord,
    TxnHeader,
    header_path,
    is_v5,
    op_prefix,
    txn_key,
    txn_of_path,
)
from pyengine.transaction.pendingack import IndividualAck, PendingAckReplayError
from pyengine.transaction.pendingack.handle import HandleState, PendingAckHandleImpl
from pyengine.transaction.pendingack.log_store import LoggedAck
from pyengine.transaction.pendingack.state import Reservation
from pyengine.transaction.pendingack.validation import check_individual_acks
from pyengine_kernels import Position, TxnId

if TYPE_CHECKING:
    from pyengine.storage.cursor import ManagedCursor

log = logging.getLogger(__name__)


class MetadataPendingAckStore:
    """The op records of one subscription of one segment. Sequences are local handles of
    requests (the store's sequential keys name the records themselves)."""

    # Record deletes are writes of the metadata store, apart from the cursor's: the handle
    # deletes a committed transaction's records only once its acks are on the cursor.
    deletes_with_cursor = False

    def __init__(self, store: MetadataStore, segment: str, subscription: str, *,
                 metrics: V5Metrics | None = None) -> None:
        self.store = store
        self.segment = segment
        self.subscription = f"{segment}/{subscription}"
        self.subscription_name = subscription
        self.metrics = metrics or V5Metrics()
        self._seqs = itertools.count()
        self._paths: dict[int, list[str]] = {}      # request seq -> its op records
        self._revisions: dict[int, int] = {}        # request seq -> store revision of its last record
        self._loaded: list[LoggedAck] = []
        self.requests: dict[str, list[int]] = {}    # loaded records of requests of several, by request
        self.incomplete: set[int] = set()           # loaded records of requests written in part

    # --- writes ---------------------------------------------------------------------------

    def append_individual(self, txn: TxnId, acks: list[IndividualAck], *,
                          after: asyncio.Future[Any] | None = None) -> tuple[int, asyncio.Future[None]]:
        """`after`: a write the records must not exist without; the metadata store cannot be
        ordered with it, so they are written once it succeeded (and not at all if it failed)."""
        ops = [OpRecord("ack", self.segment, ack.position, self.subscription_name, False, ack.batch_size,
                        ack.ack_set) for ack in acks]
        return self._append(txn, ops, after)

    def append_cumulative(self, txn: TxnId, position: Position, *,
                          after: asyncio.Future[Any] | None = None) -> tuple[int, asyncio.Future[None]]:
        return self._append(txn, [OpRecord("ack", self.segment, position, self.subscription_name, True)], after)

    def append_cumulative_in_batch(self, txn: TxnId, before: Position, ack: IndividualAck, *,
                                   after: asyncio.Future[Any] | None = None) -> tuple[int, asyncio.Future[None]]:
        """A cumulative ack up to `before` and the batch indexes of `ack`: one request, whose
        op records are all written or none."""
        ops = [OpRecord("ack", self.segment, before, self.subscription_name, True),
               OpRecord("ack", self.segment, ack.position, self.subscription_name, False, ack.batch_size,
                        ack.ack_set)]
        return self._append(txn, ops, after)

    def _append(self, txn: TxnId, ops: list[OpRecord],
                after: asyncio.Future[Any] | None) -> tuple[int, asyncio.Future[None]]:
        seq = next(self._seqs)
        return seq, asyncio.ensure_future(self._write(seq, txn, ops, after))

    async def _write(self, seq: int, txn: TxnId, ops: list[OpRecord], after: asyncio.Future[Any] | None) -> None:
        if after is not None:
            await asyncio.shield(after)             # raises its failure: nothing is written then
        if len(ops) > 1:
            # Each record names its request and how many it has: records a failed request left
            # (their deletion failed too, or the broker died between the puts) are then told
            # from a whole request by the replay, and not applied.
            request = uuid.uuid4().hex
            ops = [dataclasses.replace(op, request=request, parts=len(ops)) for op in ops]
        written: list[Record] = []
        try:
            for op in ops:
                written.append(await self.store.put(op_prefix(txn), op.encode(), sequential=True,
                                                    partition_key=txn_key(txn)))
        except BaseException:
            left = []
            for record in written:                  # all of the request or nothing
                try:
                    await _delete_quietly(self.store, record.path)
                except MetadataStoreError:
                    left.append(record.path)
            if left:
                # Replayed, they would apply a refused ack: kept under the request's seq, for
                # the handle to delete with its txn's records (`stranded`).
                self._paths[seq] = left
            raise
        self.metrics.op_written(len(written))
        self._paths[seq] = [record.path for record in written]
        self._revisions[seq] = max(record.mod_revision for record in written)

    def stranded(self, seq: int) -> bool:
        """Whether the failed request `seq` left op records that could not be deleted."""
        return seq in self._paths and seq not in self._revisions

    def revision_of(self, seq: int) -> int:
        return self._revisions.get(seq, 0)

    def delete_records(self, seqs) -> asyncio.Future[None]:
        paths = [path for seq in seqs for path in self._paths.get(seq, ())]

        async def delete() -> None:
            for path in paths:
                await _delete_quietly(self.store, path)
            self.metrics.ops_deleted(len(paths))
            for seq in seqs:
                self._paths.pop(seq, None)
                self._revisions.pop(seq, None)

        return asyncio.ensure_future(delete())

    async def delete(self) -> None:
        """Remove every op record of the subscription (it is being deleted)."""
        for record in await self.store.range_query(IDX_ACKS, prefix=(self.segment, self.subscription_name)):
            await _delete_quietly(self.store, record.path)
        self._paths.clear()

    # --- reads ----------------------------------------------------------------------------

    async def load(self) -> None:
        """Read this subscription's op records (one range query): what `scan` returns."""
        try:
            with self.metrics.index_query():
                records = await self.store.range_query(IDX_ACKS, prefix=(self.segment, self.subscription_name))
        except MetadataStoreError as exc:
            raise PendingAckReplayError(f"pending acks of {self.subscription}: cannot read the op records: {exc}") from exc
        records.sort(key=lambda r: r.path)        # per txn, in the order they were written
        loaded = []
        requests: dict[str, tuple[int, list[int]]] = {}     # request -> its parts, the seqs found
        for record in records:
            try:
                txn = txn_of_path(record.path)
                op = OpRecord.decode(record.value, record.path)
                seq = next(self._seqs)
                if op.cumulative:
                    logged = LoggedAck(seq, txn, cumulative=op.position)
                else:
                    logged = LoggedAck(seq, txn, individual=tuple(check_individual_acks(
                        [IndividualAck(op.position, op.batch_size, op.ack_set)])))
            except (CorruptTxnRecordError, ValueError, TypeError) as exc:
                raise PendingAckReplayError(f"pending acks of {self.subscription}: op record {record.path} "
                                            f"cannot be decoded: {exc}") from exc
            self._paths[seq] = [record.path]
            self._revisions[seq] = record.create_revision
            loaded.append(logged)
            if op.parts > 1:
                requests.setdefault(op.request, (op.parts, []))[1].append(seq)
        self._loaded = loaded
        self.requests = {request: seqs for request, (_parts, seqs) in requests.items()}
        self.incomplete = {seq for parts, seqs in requests.values() if len(seqs) < parts for seq in seqs}

    @property
    def loaded(self) -> list[LoggedAck]:
        """What `load` read and `scan` has not returned yet."""
        return self._loaded

    def drop_loaded(self, seqs: set[int]) -> None:
        """Leave these loaded requests out of the scan."""
        self._loaded = [logged for logged in self._loaded if logged.seq not in seqs]

    def scan(self, chunk_size: int) -> Iterator[list[LoggedAck]]:
        loaded, self._loaded = self._loaded, []
        for start in range(0, len(loaded), chunk_size):
            yield loaded[start:start + chunk_size]
        if not loaded:
            yield []


class MetadataPendingAckHandle(PendingAckHandleImpl):
    """The v4 handle's rules over op records, ended by header watches instead of calls.

    Each decision it applies is reported with its txn: `on_acked(positions, txn=txn)` for a
    commit (the entries now acknowledged whole), `on_release(positions, txn=txn)` for an
    abort (the entries to deliver again)."""

    def __init__(self, cursor: ManagedCursor, store: MetadataPendingAckStore, headers: TxnHeaderCache, *,
                 subscription_type: int, on_release: Callable[..., None] | None = None,
                 on_acked: Callable[..., None] | None = None) -> None:
        super().__init__(cursor, store, subscription_type=subscription_type, on_release=on_release)
        self.metadata = store
        self.headers = headers
        self._on_acked = on_acked
        self._subscribed: set[TxnId] = set()
        self._deciding: dict[TxnId, asyncio.Task] = {}
        self._requests: dict[TxnId, int] = {}                  # ack requests being written
        self._written: dict[asyncio.Task, int] = {}            # request (its task) -> its record seq
        self._request_waiters: dict[TxnId, list[asyncio.Future]] = {}
        self.late_acks_rejected = 0

    async def replay(self) -> None:
        try:
            await self.metadata.load()
            undeleted = await self._drop_late_records()
        except PendingAckReplayError as exc:
            self._fail_replay(exc)
            raise
        await super().replay()
        for txn, seqs in undeleted.items():
            # Not applied; deleted with the txn's other records when its decision is (the
            # header watch below), not left until another restart.
            self._records.setdefault(txn, []).extend(seqs)
        for txn in list(self._records):
            try:
                state = await self.headers.get(txn)
            except (MetadataStoreError, CorruptTxnRecordError) as exc:
                error = PendingAckReplayError(f"pending acks of {self._name}: cannot read the header of {txn}: {exc}")
                self._fail_replay(error)
                raise error from exc
            if state.header is None:
                # Gone since the records were read (the GC sweep collected it: an abort, as
                # a commit's acks keep it from collection) or never created: aborted. A
                # missing header is not cached, so no watch would ever tell us.
                self._on_decided(txn, None)
                continue
            self._watch(txn)

    async def _drop_late_records(self) -> dict[TxnId, list[int]]:
        """Op records written after their transaction's decision: the late-ack race, whose
        request was refused (TxnConflict) but whose records a crash, or a failed delete, left
        behind. Refused then, they are not applied now (PIP-473: the decision is the
        linearization point, and a restart reaches the same one); they are deleted, as are
        the records of requests written in part. Returns those whose deletion failed, by txn."""
        decided_at: dict[TxnId, int | None] = {}
        late: set[int] = set()
        for logged in self.metadata.loaded:
            txn = logged.txn
            if txn not in decided_at:
                try:
                    record = await self.metadata.store.get(header_path(txn))
                    header = None if record is None else TxnHeader.decode(record.value, record.path)
                except (MetadataStoreError, CorruptTxnRecordError) as exc:
                    raise PendingAckReplayError(f"pending acks of {self._name}: cannot read the header of "
                                                f"{txn}: {exc}") from exc
                decided_at[txn] = record.mod_revision if header is not None and header.state.final else None
            decision = decided_at[txn]
            if decision is not None and self.metadata.revision_of(logged.seq) > decision:
                late.add(logged.seq)
        for seqs in self.metadata.requests.values():
            if not late.isdisjoint(seqs):
                late.update(seqs)       # a request straddling the decision was refused whole
        if late:
            self.late_acks_rejected += len(late)
            log.warning("pending acks of %s: %d op record(s) written after their transaction's decision are "
                        "dropped (refused acks left by a crash)", self._name, len(late))
        partial = self.metadata.incomplete - late
        if partial:
            # What a request written in part left (refused: its sender was told it failed).
            log.warning("pending acks of %s: %d op record(s) of ack requests written in part are dropped",
                        self._name, len(partial))
            late |= partial
        if not late:
            return {}
        late_of: dict[TxnId, list[int]] = {}
        for logged in self.metadata.loaded:
            if logged.seq in late:
                late_of.setdefault(logged.txn, []).append(logged.seq)
        self.metadata.drop_loaded(late)
        try:
            await self.metadata.delete_records(late)
        except MetadataStoreError as exc:
            log.warning("pending acks of %s: deleting late op records failed: %s", self._name, exc)
            return late_of
        return {}

    # --- acks -----------------------------------------------------------------------------

    async def individual_ack(self, txn: TxnId, acks: list[IndividualAck], *,
                             after: asyncio.Future[Any] | None = None) -> None:
        await self._check_open(txn)
        checked = check_individual_acks(acks)
        async with self._acking(txn):
            await super().individual_ack(txn, checked, after=after)
            seq = self._written.pop(asyncio.current_task(), None)
            if seq is not None and await self._late(txn, seq):
                for ack in checked:
                    self._acks.release(txn, ack.position, Reservation(ack.ack_set, ack.batch_size))
                await self._forget_request(txn, seq)

    async def cumulative_ack(self, txn: TxnId, position: Position, *,
                             after: asyncio.Future[Any] | None = None) -> None:
        await self._check_open(txn)
        async with self._acking(txn):
            await super().cumulative_ack(txn, position, after=after)
            seq = self._written.pop(asyncio.current_task(), None)
            if seq is not None and await self._late(txn, seq):
                self._acks.release_cumulative(txn, position)
                await self._forget_request(txn, seq)

    async def cumulative_ack_in_batch(self, txn: TxnId, before: Position, ack: IndividualAck, *,
                                      after: asyncio.Future[Any] | None = None) -> None:
        await self._check_open(txn)
        (checked,) = check_individual_acks([ack])
        async with self._acking(txn):
            await super().cumulative_ack_in_batch(txn, before, checked, after=after)
            seq = self._written.pop(asyncio.current_task(), None)
            if seq is not None and await self._late(txn, seq):
                self._acks.release(txn, checked.position, Reservation(checked.ack_set, checked.batch_size))
                self._acks.release_cumulative(txn, before)
                await self._forget_request(txn, seq)

    async def _log(self, txn: TxnId, append, undo) -> None:
        """The v4 handle's write of a request, remembering which record is this request's."""
        task = asyncio.current_task()

        def appending():
            seq, written = append()
            self._written[task] = seq
            return seq, written

        try:
            await super()._log(txn, appending, undo)
        except BaseException:
            seq = self._written.pop(task, None)
            if seq is not None and self.metadata.stranded(seq):
                # Refused, but records of it are left: deleted with the txn's others when it
                # ends (its acks are released: nothing of it is applied).
                self._records.setdefault(txn, []).append(seq)
            raise

    @contextlib.asynccontextmanager
    async def _acking(self, txn: TxnId):
        """While a request of `txn` is written and checked, its decision waits."""
        self._requests[txn] = self._requests.get(txn, 0) + 1
        try:
            yield
        finally:
            left = self._requests[txn] - 1
            if left:
                self._requests[txn] = left
            else:
                del self._requests[txn]
                waiters = self._request_waiters.pop(txn, [])
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    async def _check_open(self, txn: TxnId) -> None:
        self._check_ready()
        if not isinstance(txn, TxnId):
            raise TypeError(f"txn must be a TxnId, not {type(txn).__name__}")
        if not is_v5(txn):
            raise NotAllowedError(f"[{self._name}] Transaction:{txn} is a v4 transaction; "
                                  "segment subscriptions take v5 transactions only")
        state = await self.headers.get(txn)
        if state.header is None or state.header.state is not HeaderState.OPEN:
            raise TransactionConflictError(f"[{self._name}] Transaction:{txn} is "
                                           f"{'unknown' if state.header is None else state.header.state.value}, "
                                           "not OPEN")
        self._watch(txn)

    async def _late(self, txn: TxnId, seq: int) -> bool:
        """Did the decision on `txn` land before request `seq`'s records (the late-ack race)?"""
        record = await self.metadata.store.get(header_path(txn))
        if record is None:
            return True
        header = TxnHeader.decode(record.value, record.path)
        return header.state.final and record.mod_revision < self.metadata.revision_of(seq)

    async def _forget_request(self, txn: TxnId, seq: int) -> None:
        self.late_acks_rejected += 1
        # Forgotten once deleted: a record whose delete failed goes with the txn's others.
        await self.metadata.delete_records([seq])
        seqs = self._records.get(txn, [])
        if seq in seqs:
            seqs.remove(seq)
        if not seqs:
            self._records.pop(txn, None)
        raise TransactionConflictError(f"[{self._name}] Transaction:{txn} ended before this ack was recorded")

    # --- decisions ------------------------------------------------------------------------

    def _watch(self, txn: TxnId) -> None:
        if txn not in self._subscribed:
            self._subscribed.add(txn)
            self.headers.subscribe(txn, self._on_decided)

    def _on_decided(self, txn: TxnId, header: TxnHeader | None) -> None:
        self._subscribed.discard(txn)
        if txn in self._deciding:
            return
        task = asyncio.get_running_loop().create_task(self._materialise(txn, header), name=f"v5-pending-ack-{txn}")
        self._deciding[txn] = task
        task.add_done_callback(lambda _t: self._deciding.pop(txn, None))

    async def _materialise(self, txn: TxnId, header: TxnHeader | None) -> None:
        while txn in self._requests:
            waiter = asyncio.get_running_loop().create_future()
            self._request_waiters.setdefault(txn, []).append(waiter)
            await waiter
        commit = header is not None and header.state is HeaderState.COMMITTED
        delay = 0.1
        attempt = 0
        while True:                   # as the buffer: until it is done or the handle closes
            attempt += 1
            try:
                if commit:
                    positions = await self.commit(txn, -1)
                    # Only entries now acknowledged whole: a batch the txn acked some indexes
                    # of stays in flight (as v4's end_txn), or its other messages are lost.
                    acked = [position for position in positions if self.cursor.is_acked(position)]
                    # Each decision is reported with its txn, also with nothing acked whole:
                    # the subscription drops what it kept of exactly that txn.
                    if self._on_acked is not None:
                        self._on_acked(acked, txn=txn)
                else:
                    positions = await self.abort(txn, -1)
                    if self._on_release is not None:
                        self._on_release(positions, txn=txn)
                return
            except PersistenceError as exc:
                # Given up, the acks would stay reserved (an aborted txn's messages never
                # delivered again) and the header never collected: a store outage ends.
                log.warning("[%s] materialising %s failed (attempt %d, again in %.1f s): %s",
                            self._name, txn, attempt, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except Exception as exc:      # closed, not ready: the restart finishes it
                log.info("[%s] materialising %s stopped: %s", self._name, txn, exc)
                return

    # --- read-your-writes for a rewind ----------------------------------------------------

    def resolve_decided(self) -> asyncio.Future[None] | None:
        """Apply now the decisions already taken on the txns holding acks here, as their header
        watch applies them, and resolve once that is done; None when no txn holds acks here
        (nothing is read then).

        For a consumer's rewind (its client's redelivery request after an abort): the abort's
        CAS landed before the client asked, but the watch may tell this handle after the
        request arrived, and the messages the txn's acks held came back after the later ones.
        Each header is read from the store (the cache only when it is final there: a decision
        is terminal); a decided txn is materialised by `_on_decided`, as the watch would do it
        (the watch firing later finds nothing more to do), and awaited. A header that cannot be
        read is left to the watch."""
        if self.state is not HandleState.READY:
            return None
        txns = self._acks.txns() | set(self._records) | set(self._deciding)
        if not txns:
            return None
        return asyncio.ensure_future(self._resolve_decided(txns))

    async def _resolve_decided(self, txns: set[TxnId]) -> None:
        async def resolve(txn: TxnId) -> None:
            if txn not in self._deciding:
                try:
                    state = await self.headers.get(txn, fresh=True)     # decided: fires _on_decided
                except (MetadataStoreError, CorruptTxnRecordError) as exc:
                    log.warning("[%s] reading the header of %s for a rewind failed (left to its watch): %s",
                                self._name, txn, exc)
                    return
                decided = state.header is None or state.header.state.final
                if decided and txn not in self._deciding and (txn in self._records or self._acks.holds(txn)):
                    # Known final before (its listener fired and was dropped), yet not done here.
                    self.headers.unsubscribe(txn, self._on_decided)
                    self._on_decided(txn, state.header)
            task = self._deciding.get(txn)
            if task is not None:
                await asyncio.wait([task])          # never cancelled from here: the watch's work too

        await asyncio.gather(*(resolve(txn) for txn in txns))

    async def wait_materialised(self) -> None:
        while self._deciding:
            await asyncio.gather(*list(self._deciding.values()), return_exceptions=True)

    async def close(self) -> None:
        for txn in list(self._subscribed):
            self.headers.unsubscribe(txn, self._on_decided)
        self._subscribed.clear()
        await super().close()
        tasks = list(self._deciding.values())
        await asyncio.gather(*tasks, return_exceptions=True)


async def _delete_quietly(store: MetadataStore, path: str) -> None:
    try:
        await store.delete(path)
    except NotFoundError:
        pass
