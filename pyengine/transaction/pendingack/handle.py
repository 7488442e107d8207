"""`PendingAckHandleImpl`: a subscription's pending acknowledgements, v4 (PIP-31) design.

As in Pulsar's PendingAckHandleImpl: transactional acks are checked for conflicts, logged
(`LogPendingAckStore`), kept in memory (`PendingAckState`), applied to the cursor on commit
and dropped on abort. Where we differ from Pulsar, on purpose:

* A request is checked first and refused whole on any conflict (Pulsar logs first, then
  checks). Its reservation is made in memory at once, so concurrent requests see it, and
  undone exactly if the log write fails (Pulsar keeps it); the caller is answered once the
  record is durable. A failed write leaves no trace and raises PersistenceError.
* Commit writes the cursor and deletes the transaction's records in one LMDB write
  transaction (Pulsar appends a commit mark, then acks the cursor): after a crash either
  both happened or neither. The reservations are dropped from memory once that is durable;
  if it fails they stay and a repeated commit writes the cursor state again.
* Cumulative acks may not cover an entry another open transaction holds individually, nor
  may an individual ack take an entry under another transaction's cumulative ack.
* An ack by a transaction at or below its coordinator's low watermark (it ended) is refused
  with InvalidTxnStatusError instead of leaving a reservation nobody will ever end.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

from pyengine.errors import (
    InvalidTxnStatusError,
    NotAllowedError,
    PersistenceError,
    ServiceNotReadyError,
    TransactionConflictError,
)
from pyengine.protocol.pulsar_api_pb2 import CommandSubscribe
from pyengine.transaction import TxnAction
from pyengine.transaction.pendingack import IndividualAck, PendingAckHandle, PendingAckReplayError
from pyengine.transaction.pendingack.log_store import LoggedAck, LogPendingAckStore
from pyengine.transaction.pendingack.state import PendingAckState, Reservation
from pyengine.transaction.pendingack.validation import (
    check_batch_size,
    check_entry_position,
    check_individual_acks,
    check_low_watermark,
    check_txn,
)
from pyengine.transaction.outcome import Outcome
from pyengine_kernels import Position, TxnId, ackset_and, ackset_is_fully_acked, ackset_new

if TYPE_CHECKING:
    from pyengine.storage.cursor import ManagedCursor

logger = logging.getLogger(__name__)

# Pulsar's Subscription.isCumulativeAckMode.
CUMULATIVE_ACK_SUBSCRIPTIONS = frozenset({CommandSubscribe.Exclusive, CommandSubscribe.Failover})
DEFAULT_REPLAY_CHUNK = 1000


class TxnsByCoordinator:
    """The transactions that acknowledged here, per coordinator, oldest (lowest sequence)
    first: a low watermark takes those at or under it without looking at the others (Pulsar's
    handleLowWaterMark looks at the oldest only). Entries of ended transactions are dropped when
    the watermark passes them."""

    def __init__(self) -> None:
        self._heaps: dict[int, list[int]] = {}
        self._known: set[TxnId] = set()
        self._entries = 0                   # heap entries, discarded ones included

    def __len__(self) -> int:
        return len(self._known)

    def add(self, txn: TxnId) -> None:
        if txn not in self._known:
            self._known.add(txn)
            heapq.heappush(self._heaps.setdefault(txn.most_bits, []), txn.least_bits)
            self._entries += 1

    def discard(self, txn: TxnId) -> None:
        """Forget an ended txn now: v5 has no low watermark to take it out, and a v4 one
        only comes with a later txn of its coordinator ending here. Its heap entry is left
        to be skipped; the heaps are rebuilt when such entries outnumber the known txns."""
        self._known.discard(txn)
        if self._entries > 2 * len(self._known) + 64:
            self._heaps = {}
            for known in self._known:
                self._heaps.setdefault(known.most_bits, []).append(known.least_bits)
            for heap in self._heaps.values():
                heapq.heapify(heap)
            self._entries = len(self._known)

    def take_up_to(self, coordinator: int, low_watermark: int) -> list[TxnId]:
        """The transactions of `coordinator` at or under `low_watermark`, oldest first, taken
        out of the index (`add` puts back one still to be looked at)."""
        heap = self._heaps.get(coordinator)
        taken = []
        while heap and heap[0] <= low_watermark:
            txn = TxnId(coordinator, heapq.heappop(heap))
            self._entries -= 1
            if txn in self._known:          # else discarded (ended), or a second entry of it
                self._known.discard(txn)
                taken.append(txn)
        return taken


class HandleState(Enum):
    NONE = "none"              # created; replay() not called yet
    REPLAYING = "replaying"
    READY = "ready"
    ERROR = "error"            # replay failed: every call is refused until a replay succeeds
    CLOSED = "closed"


class PendingAckHandleImpl(PendingAckHandle):
    """Pending acks of the subscription whose durable cursor is `cursor`, logged in `store`.

    `subscription_type` (CommandSubscribe.SubType; settable, the type of a subscription
    changes with its consumers) decides whether cumulative acks are allowed.
    `on_release(positions, txn=txn)` receives the positions to deliver again when the handle
    aborts a transaction by itself (one at or below a coordinator's low watermark that still
    holds acks here), with that transaction: the subscription gives back what it took for
    that one only (without it, another transaction committing meanwhile looked aborted).
    """

    def __init__(self, cursor: ManagedCursor, store: LogPendingAckStore, *, subscription_type: int,
                 on_release: Callable[..., None] | None = None,
                 replay_chunk: int = DEFAULT_REPLAY_CHUNK) -> None:
        if not cursor.durable:
            raise ValueError("pending acks need a durable cursor")
        if isinstance(replay_chunk, bool) or not isinstance(replay_chunk, int) or replay_chunk < 1:
            raise ValueError(f"replay_chunk must be an int >= 1, not {replay_chunk!r}")
        self.cursor = cursor
        self.store = store
        self.subscription_type = subscription_type
        self.state = HandleState.NONE
        self._on_release = on_release
        self._replay_chunk = replay_chunk
        self._name = store.subscription
        self._acks = PendingAckState()
        self._records: dict[TxnId, list[int]] = {}                      # txn -> its log records
        self._txns = TxnsByCoordinator()                                # for the low watermarks
        self._in_flight: dict[TxnId, set[Outcome[None]]] = {}    # requests being logged
        self._ending: dict[TxnId, tuple[TxnAction, asyncio.Task[list[Position]]]] = {}
        self._low_watermarks: dict[int, int] = {}                       # coordinator id -> lwm
        self._replay_error: PendingAckReplayError | None = None

    @property
    def subscription_type(self) -> int:
        return self._subscription_type

    @subscription_type.setter
    def subscription_type(self, value: int) -> None:
        if isinstance(value, bool) or value not in CommandSubscribe.SubType.values():
            raise ValueError(f"subscription_type must be a CommandSubscribe.SubType, not {value!r}")
        self._subscription_type = value

    # Pulsar's names for the state, read-only.
    @property
    def individual_ack_of_txn(self) -> dict[TxnId, dict[Position, Reservation]]:
        return self._acks.individual_ack_of_txn

    @property
    def individual_ack_positions(self) -> dict[Position, Reservation]:
        return self._acks.individual_ack_positions

    @property
    def cumulative_ack_of_txn(self) -> tuple[TxnId, Position] | None:
        return self._acks.cumulative_ack_of_txn

    # --- replay ---------------------------------------------------------------------------

    async def replay(self) -> None:
        """Rebuild the pending acks from the log, `replay_chunk` records at a time (yielding
        to the event loop between chunks). Entries the cursor acknowledged meanwhile are
        dropped. A record that cannot be read or decoded fails the replay at once with
        PendingAckReplayError; the handle then refuses every call (ServiceNotReadyError)
        until a later replay() succeeds."""
        if self.state is HandleState.READY:
            return
        if self.state is HandleState.CLOSED:
            raise ServiceNotReadyError(f"PendingAckHandle have been closed! ({self._name})")
        if self.state is HandleState.REPLAYING:
            raise ServiceNotReadyError(f"PendingAckHandle of {self._name} is already replaying")
        self.state = HandleState.REPLAYING
        self._acks = PendingAckState()
        self._records = {}
        self._txns = TxnsByCoordinator()
        try:
            for chunk in self.store.scan(self._replay_chunk):
                for logged in chunk:
                    self._replay_one(logged)
                await asyncio.sleep(0)
        except PendingAckReplayError as exc:
            self._fail_replay(exc)
            raise
        except Exception as exc:
            error = PendingAckReplayError(f"pending-ack replay of {self._name} failed: {exc!r}")
            self._fail_replay(error)
            raise error from exc
        except BaseException:
            if self.state is HandleState.REPLAYING:
                self.state = HandleState.NONE
            raise
        if self.state is not HandleState.REPLAYING:
            # Closed meanwhile: it stays closed (READY here would serve acks again).
            raise ServiceNotReadyError(f"PendingAckHandle of {self._name} was closed while replaying")
        self._replay_error = None
        self.state = HandleState.READY

    @property
    def replay_failed(self) -> bool:
        return self.state is HandleState.ERROR

    def _replay_one(self, logged: LoggedAck) -> None:
        txn = logged.txn
        self._records.setdefault(txn, []).append(logged.seq)
        self._txns.add(txn)
        if logged.cumulative is not None:
            position = logged.cumulative
            holder = self._acks.cumulative_ack_of_txn
            if position > self.cursor.mark_delete and (
                    holder is None or (holder[0] == txn and position > holder[1])):
                self._acks.reserve_cumulative(txn, position)
            return
        for ack in logged.individual:
            logged_reservation = Reservation(ack.ack_set, ack.batch_size)
            kept = self._acks.admit_replayed(ack.position, logged_reservation, self.cursor)
            if kept is not None:
                self._acks.reserve(txn, ack.position, kept)

    def _fail_replay(self, error: PendingAckReplayError) -> None:
        logger.error("%s", error)
        self._acks = PendingAckState()
        self._records = {}
        self._txns = TxnsByCoordinator()
        self._replay_error = error
        if self.state is not HandleState.CLOSED:        # a close meanwhile stands
            self.state = HandleState.ERROR

    # --- acknowledgements -----------------------------------------------------------------

    async def individual_ack(self, txn: TxnId, acks: list[IndividualAck], *,
                             after: asyncio.Future[Any] | None = None) -> None:
        """Reserve the entries (or batch indexes) of `acks` for `txn`, durably; the whole
        request is refused (TransactionConflictError) when any part of it is already acked on
        the cursor or reserved by an open transaction, itself included. `after`: the
        coordinator's registration of this subscription with `txn`, maybe still being written:
        the record is never durable without it, and fails if it failed."""
        self._check_ready()
        txn = check_txn(txn)
        acks = check_individual_acks(acks)
        self._check_may_ack(txn)
        for ack in acks:
            self._check_written(ack.position)
        self._txns.add(txn)
        taken: list[tuple[Position, Reservation]] = []

        def undo() -> None:
            for position, reservation in reversed(taken):
                self._acks.release(txn, position, reservation)

        try:
            for ack in acks:
                wanted = Reservation(ack.ack_set, ack.batch_size)
                reason = self._acks.individual_conflict(txn, ack.position, wanted, self.cursor)
                if reason is not None:
                    raise TransactionConflictError(f"[{self._name}] Transaction:{txn} try to ack {reason}")
                self._acks.reserve(txn, ack.position, wanted)
                taken.append((ack.position, wanted))
        except BaseException:
            undo()
            raise
        await self._log(txn, lambda: self.store.append_individual(txn, acks, after=after), undo)

    async def cumulative_ack(self, txn: TxnId, position: Position, *,
                             after: asyncio.Future[Any] | None = None) -> None:
        """Reserve everything up to `position` for `txn` (Exclusive/Failover only); `after` as
        for `individual_ack`."""
        self._check_ready()
        txn = check_txn(txn)
        position = check_entry_position(position)
        self._check_cumulative_allowed(txn)
        self._check_may_ack(txn)
        self._check_written(position)
        reason = self._acks.cumulative_conflict(txn, position, self.cursor.mark_delete)
        if reason is not None:
            raise TransactionConflictError(f"[{self._name}] Transaction:{txn} try to {reason}")
        self._acks.reserve_cumulative(txn, position)
        self._txns.add(txn)
        await self._log(txn, lambda: self.store.append_cumulative(txn, position, after=after),
                        lambda: self._acks.release_cumulative(txn, position))

    async def cumulative_ack_in_batch(self, txn: TxnId, before: Position, ack: IndividualAck, *,
                                      after: asyncio.Future[Any] | None = None) -> None:
        """A cumulative ack up to a message inside a batch, as one request: everything up to
        `before` (an entry before the batch's) cumulatively and the indexes of `ack`
        individually. Both are checked before either is reserved, and logged in one write: a
        conflict or a failed write leaves neither. `after` as for `individual_ack`."""
        self._check_ready()
        txn = check_txn(txn)
        before = check_entry_position(before, "before")
        (ack,) = check_individual_acks([ack])
        if before >= ack.position:
            raise ValueError(f"before {before} must precede the batch's entry {ack.position}")
        self._check_cumulative_allowed(txn)
        self._check_may_ack(txn)
        self._check_written(ack.position)
        reason = self._acks.cumulative_conflict(txn, before, self.cursor.mark_delete)
        if reason is not None:
            raise TransactionConflictError(f"[{self._name}] Transaction:{txn} try to {reason}")
        wanted = Reservation(ack.ack_set, ack.batch_size)
        # Reserving `before` changes nothing this check reads (other txns' holds only).
        reason = self._acks.individual_conflict(txn, ack.position, wanted, self.cursor)
        if reason is not None:
            raise TransactionConflictError(f"[{self._name}] Transaction:{txn} try to ack {reason}")
        self._acks.reserve_cumulative(txn, before)
        self._acks.reserve(txn, ack.position, wanted)
        self._txns.add(txn)

        def undo() -> None:
            self._acks.release(txn, ack.position, wanted)
            self._acks.release_cumulative(txn, before)

        await self._log(txn, lambda: self.store.append_cumulative_in_batch(txn, before, ack, after=after), undo)

    def _check_cumulative_allowed(self, txn: TxnId) -> None:
        if self._subscription_type not in CUMULATIVE_ACK_SUBSCRIPTIONS:
            kind = CommandSubscribe.SubType.Name(self._subscription_type)
            raise NotAllowedError(f"[{self._name}] Transaction:{txn} cumulative ack is not allowed "
                                  f"on a {kind} subscription")

    async def _log(self, txn: TxnId, append: Callable[[], tuple[int | list[int], asyncio.Future[None]]],
                   undo: Callable[[], None]) -> None:
        """Write the record of a request already reserved in memory; undo the reservation if
        the write fails. The outcome is settled by a callback, so a caller that is cancelled
        meanwhile cannot leave a reservation without its record."""
        try:
            seq, written = append()
            seqs = [seq] if isinstance(seq, int) else list(seq)     # a request may be several records
        except Exception as exc:          # could not even queue the write (closed environment...)
            undo()
            raise PersistenceError(f"[{self._name}] cannot log the ack of Transaction:{txn}: {exc}") from exc
        outcome: Outcome[None] = Outcome()
        in_flight = self._in_flight.setdefault(txn, set())
        in_flight.add(outcome)

        def settle(done: asyncio.Future[None]) -> None:
            error = asyncio.CancelledError("write cancelled") if done.cancelled() else done.exception()
            if error is None:
                self._records.setdefault(txn, []).extend(seqs)
                outcome.set_result(None)
            else:
                undo()
                outcome.set_exception(PersistenceError(
                    f"[{self._name}] cannot log the ack of Transaction:{txn}: {error}"))
            in_flight.discard(outcome)
            if not in_flight and self._in_flight.get(txn) is in_flight:
                del self._in_flight[txn]

        written.add_done_callback(settle)
        await outcome.waiter()      # a cancelled caller cancels nothing else

    def _check_may_ack(self, txn: TxnId) -> None:
        if txn in self._ending:
            raise InvalidTxnStatusError(f"[{self._name}] Transaction:{txn} is ending on this subscription")
        low_watermark = self._low_watermarks.get(txn.most_bits, -1)
        if txn.least_bits <= low_watermark:
            raise InvalidTxnStatusError(f"[{self._name}] Transaction:{txn} has already ended (low watermark "
                                        f"{low_watermark} of coordinator {txn.most_bits})")

    def _check_written(self, position: Position) -> None:
        lac = self.cursor.ledger.lac
        if position > lac:
            raise ValueError(f"[{self._name}] {position} is beyond the last entry {lac}")

    # --- end of transactions --------------------------------------------------------------

    async def commit(self, txn: TxnId, low_watermark: int) -> list[Position]:
        """Apply `txn`'s acks to the cursor and delete its records, atomically. Returns the
        entries it acked individually (in order), then its cumulative position if it had one.
        An unknown or already ended transaction: success, []."""
        self._check_ready()
        txn = check_txn(txn)
        low_watermark = check_low_watermark(low_watermark)
        positions = await self._end(txn, TxnAction.COMMIT)
        await self._advance_low_watermark(txn, low_watermark)
        return positions

    async def abort(self, txn: TxnId, low_watermark: int) -> list[Position]:
        """Drop `txn`'s acks and delete its records. Returns the entries to deliver again (in
        order), then its cumulative position if it had one: every unacknowledged message up to
        it is to be delivered again (Pulsar redelivers all the consumer's unacked messages)."""
        self._check_ready()
        txn = check_txn(txn)
        low_watermark = check_low_watermark(low_watermark)
        positions = await self._end(txn, TxnAction.ABORT)
        await self._advance_low_watermark(txn, low_watermark)
        return positions

    async def _end(self, txn: TxnId, action: TxnAction) -> list[Position]:
        running = self._ending.get(txn)
        if running is None:
            task = asyncio.ensure_future(self._end_now(txn, action))
            self._ending[txn] = (action, task)
            task.add_done_callback(lambda _: self._ending.pop(txn, None))
        else:
            running_action, task = running
            if running_action != action:
                doing = "committed" if running_action is TxnAction.COMMIT else "aborted"
                raise InvalidTxnStatusError(f"[{self._name}] Transaction:{txn} is being {doing}, "
                                            f"cannot {action.name.lower()} it")
        # The work goes on if the caller is cancelled: its outcome must reach the memory.
        return list(await asyncio.shield(task))

    async def _end_now(self, txn: TxnId, action: TxnAction) -> list[Position]:
        while in_flight := self._in_flight.get(txn):
            await asyncio.wait([outcome.waiter() for outcome in in_flight])
        individual, cumulative = self._acks.acks_of(txn)
        seqs = list(self._records.get(txn, ()))
        if not individual and cumulative is None and not seqs:
            self._txns.discard(txn)
            return []
        # The records go with the cursor's write where the store can (one LMDB transaction),
        # else after it: deleted first, a crash in between would lose committed acks; deleted
        # after, it leaves records that the replay applies again (to the same effect).
        together = self.store.deletes_with_cursor
        try:
            writes = self._apply_to_cursor(individual, cumulative) if action is TxnAction.COMMIT else []
            if seqs and together:
                writes.append(self.store.delete_records(seqs))
        except Exception as exc:          # could not queue the writes; the txn stays as it was
            raise PersistenceError(f"[{self._name}] cannot {action.name.lower()} "
                                   f"Transaction:{txn}: {exc}") from exc
        for outcome in await asyncio.gather(*writes, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise PersistenceError(f"[{self._name}] cannot {action.name.lower()} "
                                       f"Transaction:{txn}: {outcome}") from outcome
        if seqs and not together:
            try:
                await self.store.delete_records(seqs)
            except Exception as exc:
                raise PersistenceError(f"[{self._name}] cannot {action.name.lower()} "
                                       f"Transaction:{txn}: {exc}") from exc
        self._acks.drop(txn)
        self._records.pop(txn, None)
        self._txns.discard(txn)           # nothing of it is left here
        return sorted(individual) + ([cumulative] if cumulative is not None else [])

    def _apply_to_cursor(self, individual: dict[Position, Reservation],
                         cumulative: Position | None) -> list[asyncio.Future[None]]:
        """Queue the acks on the cursor. Must be followed, in the same event-loop turn, by
        the deletion of the records, so that both land in one LMDB write transaction."""
        cursor = self.cursor
        writes = []
        whole = sorted(position for position, held in individual.items() if held.whole)
        if whole:
            writes.append(cursor.ack(whole))
        for position, held in sorted(individual.items()):
            if held.ack_set is not None:
                writes.append(cursor.ack_batch_indexes(position, list(held.ack_set), held.batch_size))
        if cumulative is not None:
            writes.append(cursor.ack_cumulative(cumulative))
        # Always write the cursor's state: after a failed commit the cursor's memory already
        # holds these acks, so a repeated commit changes nothing there and would write nothing.
        writes.append(cursor.persist())
        return writes

    async def _advance_low_watermark(self, ended: TxnId, low_watermark: int) -> None:
        """Every txn of `ended`'s coordinator up to `low_watermark` has ended. Any of them still
        holding acks here acked after its end reached us (Pulsar's handleLowWaterMark): abort
        it, and hand its positions to `on_release`."""
        coordinator = ended.most_bits
        low_watermark = max(low_watermark, self._low_watermarks.get(coordinator, -1))
        if low_watermark < 0:
            return
        self._low_watermarks[coordinator] = low_watermark
        stale = []
        for txn in self._txns.take_up_to(coordinator, low_watermark):
            if not (txn in self._records or self._acks.holds(txn)):
                continue                                # ended: nothing left of it here
            if txn == ended or txn in self._ending or self._in_flight.get(txn):
                self._txns.add(txn)                     # being written or ended: looked at again later
            else:
                stale.append(txn)
        for txn in stale:
            try:
                released = await self._end(txn, TxnAction.ABORT)
            except PersistenceError as exc:
                logger.warning("[%s] aborting Transaction:%s below the low watermark %d failed: %s",
                               self._name, txn, low_watermark, exc)
                self._txns.add(txn)
                continue
            logger.warning("[%s] aborted Transaction:%s below the low watermark %d",
                           self._name, txn, low_watermark)
            if self._on_release is not None:
                try:
                    self._on_release(released, txn=txn)
                except Exception:
                    logger.exception("[%s] on_release failed for %s", self._name, released)

    # --- dispatch -------------------------------------------------------------------------

    def is_fully_pending(self, position: Position, batch_size: int = 1) -> bool:
        self._check_ready()
        position = check_entry_position(position)
        batch_size = check_batch_size(batch_size)
        if self.cursor.is_acked(position) or self._under_cumulative(position):
            return True
        held = self._acks.individual_ack_positions.get(position)
        if held is not None and held.whole:
            return True
        free = ackset_new(batch_size)
        acked = self.cursor.batch_ack_set(position)
        if acked is not None:
            free = ackset_and(free, acked)
        if held is not None:
            free = ackset_and(free, held.requested())
        return ackset_is_fully_acked(free, batch_size)

    def pending_ack_set(self, position: Position) -> list[int] | None:
        self._check_ready()
        position = check_entry_position(position)
        if self._under_cumulative(position):
            return []
        held = self._acks.individual_ack_positions.get(position)
        if held is None:
            return None
        if held.whole:
            return []
        acked = self.cursor.batch_ack_set(position)
        return list(held.requested()) if acked is None else ackset_and(held.requested(), acked)

    def _under_cumulative(self, position: Position) -> bool:
        holder = self._acks.cumulative_ack_of_txn
        return holder is not None and position <= holder[1]

    # --- lifecycle ------------------------------------------------------------------------

    def stats(self) -> dict:
        holder = self._acks.cumulative_ack_of_txn
        txns = sorted(self._acks.txns() | set(self._records))
        per_txn = {}
        for txn in txns:
            individual, cumulative = self._acks.acks_of(txn)
            per_txn[str(txn)] = {
                "individual_positions": len(individual),
                "cumulative_position": None if cumulative is None else str(cumulative),
                "log_records": len(self._records.get(txn, ())),
            }
        return {
            "state": self.state.value,
            "subscription": self._name,
            "pending_individual_positions": len(self._acks.individual_ack_positions),
            "pending_cumulative_ack": None if holder is None else {"txn": str(holder[0]),
                                                                   "position": str(holder[1])},
            "transactions": per_txn,
            "low_watermarks": dict(self._low_watermarks),       # coordinator id -> lwm
            "log_records": sum(len(seqs) for seqs in self._records.values()),
            "replay_error": None if self._replay_error is None else str(self._replay_error),
        }

    async def close(self) -> None:
        """Refuse new calls, then wait for the writes under way."""
        self.state = HandleState.CLOSED
        pending = [task for _action, task in self._ending.values()]
        pending += [outcome.waiter() for outcomes in self._in_flight.values() for outcome in outcomes]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def _check_ready(self) -> None:
        if self.state is HandleState.READY:
            return
        if self.state is HandleState.ERROR:
            raise ServiceNotReadyError(f"PendingAckHandle not replay error! ({self._replay_error})")
        if self.state is HandleState.CLOSED:
            raise ServiceNotReadyError(f"PendingAckHandle have been closed! ({self._name})")
        raise ServiceNotReadyError(f"PendingAckHandle of {self._name} has not replayed its log yet")
