"""Subscription: a named cursor on a topic, its consumers, its dispatcher and its pending acks.

A durable subscription's cursor is persisted; a reader's (non-durable) cursor is not and it
has no pending acks. The subscription type (Exclusive, Shared, Failover, Key_Shared) is set by
its first consumer, as in Pulsar, and later consumers must use the same type.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from pyengine.broker.consumer import Consumer
from pyengine.broker.delayed import wall_clock_ms
from pyengine.broker.dispatcher import SINGLE_ACTIVE_TYPES, Dispatcher
from pyengine.broker.rates import RateCounter
from pyengine.broker.transactions import check_txn_design
from pyengine.errors import (ConsumerAssignError, ConsumerBusyError, MetadataError, NotAllowedError,
                             TransactionConflictError)
from pyengine.protocol.pulsar_api_pb2 import CommandSubscribe
from pyengine.storage import Entry, ManagedCursor
from pyengine.subscription_properties import check_subscription_properties
from pyengine.transaction.outcome import mark_retrieved
from pyengine.transaction.pendingack import IndividualAck, PendingAckHandle
from pyengine.transaction.pendingack.validation import check_ack_set
from pyengine_kernels import (Position, TxnId, ackset_acked_indexes, ackset_and, ackset_andnot,
                              ackset_is_fully_acked, ackset_new, ackset_or)

if TYPE_CHECKING:
    from pyengine.broker.topic import Topic

log = logging.getLogger(__name__)

# Pulsar's MINIMUM_BACKLOG_FOR_EXPIRY_CHECK: a subscription with consumers and a shorter backlog
# is almost caught up, and an expiry whose oldest message is not expired is not issued.
MINIMUM_BACKLOG_FOR_EXPIRY_CHECK = 1000

SUBSCRIPTION_TYPES = ("exclusive", "shared", "failover", "key_shared")
_WIRE_SUB_TYPES = {"exclusive": CommandSubscribe.Exclusive, "shared": CommandSubscribe.Shared,
                   "failover": CommandSubscribe.Failover, "key_shared": CommandSubscribe.Key_Shared}


def wire_sub_type(sub_type: str | None) -> int:
    """CommandSubscribe.SubType of a subscription type (Exclusive until a consumer says)."""
    return _WIRE_SUB_TYPES[sub_type or "exclusive"]


def normalize_sub_type(sub_type: str) -> str:
    value = str(sub_type).lower().replace("-", "_")
    if value not in SUBSCRIPTION_TYPES:
        raise ValueError(f"subscription type must be one of {', '.join(SUBSCRIPTION_TYPES)}, not {sub_type!r}")
    return value


def key_shared_mode(consumer: Consumer) -> str:
    """A Key_Shared consumer's KeySharedMode: STICKY when it asked for hash ranges."""
    return "AUTO_SPLIT" if consumer.sticky_ranges is None else "STICKY"


@dataclass(slots=True)
class _WaitingRewind:
    """What a consumer's rewind holds while it waits for the v5 pending acks (see
    `Subscription.redeliver_unacknowledged`): the consumer's permits, set aside (those it had
    and those it gave since), and the redeliveries it asked for, with their futures."""

    permits: int = 0
    redeliveries: list[tuple[list[Position] | None, int | None, asyncio.Future[None]]] = field(default_factory=list)


class Subscription:
    def __init__(self, topic: Topic, name: str, cursor: ManagedCursor, *,
                 pending_ack: PendingAckHandle | None, sub_type: str | None = None) -> None:
        self.topic = topic
        self.name = name
        self.cursor = cursor
        self.pending_ack = pending_ack
        self.sub_type = sub_type
        self.rate_out = RateCounter()          # delivered to its consumers, past and present
        # Key_Shared: no per-key order kept while consumers change (allowOutOfOrderDelivery)
        self.allow_out_of_order_delivery = False
        self.key_shared_mode: str | None = None        # Key_Shared: AUTO_SPLIT or STICKY
        self.dispatcher = Dispatcher(self)
        # Entries taken out of their consumer's pending set because a txn's ack reserved them:
        # an abort must deliver them again, also when that consumer is gone by then.
        self._reserved_by_txn: dict[TxnId, set[Position]] = {}
        # Consumers whose rewind waits for the v5 pending acks to apply decisions, and what
        # they asked since (see redeliver_unacknowledged); the tasks of those rewinds.
        self._rewinding: dict[Consumer, _WaitingRewind] = {}
        self._rewinds: set[asyncio.Task[None]] = set()
        # Transactions being ended here (`end_txn`), by (txn, commit).
        self._ending_txns: dict[tuple[TxnId, bool], asyncio.Task[None]] = {}
        # Message expiry (Pulsar's totalMsgExpired, lastExpireTimestamp): entries expired since
        # the topic was loaded, and when an expiry last moved the cursor (ms, 0: never).
        self.total_msg_expired = 0
        self.last_expire_timestamp = 0
        self.rate_expired = RateCounter()      # entries expired, for Pulsar's msgRateExpired
        self._closed = False

    @property
    def durable(self) -> bool:
        return self.cursor.durable

    @property
    def consumers(self) -> list[Consumer]:
        return self.dispatcher.consumers

    @property
    def subscription_properties(self) -> dict[str, str]:
        """Its properties (PIP-105), a copy: given when it was created, kept in its cursor."""
        return dict(self.cursor.cursor_properties)

    async def update_subscription_properties(self, properties: Mapping[str, str]) -> None:
        """Replace its properties whole (Pulsar's updateSubscriptionProperties): durable when
        this returns, a reader's kept in memory."""
        await self.cursor.set_cursor_properties(check_subscription_properties(properties))

    # --- consumers ------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer, sub_type: str) -> None:
        sub_type = normalize_sub_type(sub_type)
        if self.consumers:
            if sub_type != self.sub_type:
                raise ConsumerBusyError(
                    f"subscription {self.name} on {self.topic.name} is {self.sub_type}, not {sub_type}")
            if sub_type == "exclusive":
                raise ConsumerBusyError(f"exclusive subscription {self.name} on {self.topic.name} "
                                        "already has a consumer")
            if sub_type == "key_shared":
                self._check_key_shared_compatible(consumer)
        else:
            # The first consumer sets it (Pulsar makes a new dispatcher with its KeySharedMeta).
            self.allow_out_of_order_delivery = sub_type == "key_shared" and consumer.allow_out_of_order_delivery
        if sub_type == "key_shared" and consumer.sticky_ranges is not None:
            self._check_sticky_ranges(consumer)
        if sub_type == "key_shared":      # kept once they leave, as Pulsar keeps its dispatcher
            self.key_shared_mode = key_shared_mode(consumer)
        self.sub_type = sub_type
        if self.pending_ack is not None:
            self.pending_ack.subscription_type = wire_sub_type(sub_type)
        self.dispatcher.add_consumer(consumer)

    def _check_key_shared_compatible(self, consumer: Consumer) -> None:
        """As Pulsar's checkForConsumerCompatibilityErrorWithDispatcher: while a Key_Shared
        subscription has consumers, its mode (AutoSplit or Sticky) and its
        allowOutOfOrderDelivery are theirs; a consumer asking for others is refused."""
        active, joining = key_shared_mode(self.consumers[0]), key_shared_mode(consumer)
        where = f"Key_Shared subscription {self.name} on {self.topic.name}"
        if active != joining:
            raise ConsumerBusyError(f"{where}: its key_shared mode {active!r} is different than the "
                                    f"connecting consumer's key_shared mode {joining!r}")
        if consumer.allow_out_of_order_delivery != self.allow_out_of_order_delivery:
            raise ConsumerBusyError(
                f"{where} " + ("allows out of order delivery while the connecting consumer does not"
                               if self.allow_out_of_order_delivery else
                               "does not allow out of order delivery while the connecting consumer does"))

    def _check_sticky_ranges(self, consumer: Consumer) -> None:
        """As Pulsar's HashRangeExclusiveStickyKeyConsumerSelector: a Sticky consumer brings a
        non-empty list of hash ranges, each start <= end, none overlapping a range of the
        subscription's other consumers (or another of its own)."""
        ranges = consumer.sticky_ranges or []
        if not ranges:
            raise ConsumerAssignError("Ranges for KeyShared policy must not be empty")
        taken = [(start, end, other) for other in self.consumers for start, end in other.sticky_ranges or ()]
        for index, (start, end) in enumerate(ranges):
            if start > end:
                raise ConsumerAssignError(f"Fixed hash range start > end: [{start}, {end}]")
            for other_start, other_end, other in taken + [(s, e, consumer) for s, e in ranges[:index]]:
                if start <= other_end and other_start <= end:
                    raise ConsumerAssignError(
                        f"Range conflict with consumer {other.name!r}: [{start}, {end}] overlaps "
                        f"[{other_start}, {other_end}]")

    def remove_consumer(self, consumer: Consumer) -> None:
        self.dispatcher.remove_consumer(consumer)
        self.topic.touch()

    def check_unsubscribe_by(self, consumer: Consumer | None) -> None:
        """A consumer may delete its subscription only as its one consumer: else Apache's
        answer (PersistentSubscription.doUnsubscribe), a MetadataError."""
        if any(c is not consumer for c in self.consumers):
            raise MetadataError(f"Unconnected or shared consumer attempting to unsubscribe: subscription "
                                f"{self.name} has other consumers")

    def flow(self, consumer: Consumer, permits: int) -> None:
        if permits < 0:
            raise ValueError("permits must be >= 0")
        waiting = self._rewinding.get(consumer)
        if waiting is not None:         # given with the rewind it follows
            waiting.permits += permits
            return
        self.dispatcher.flow(consumer, permits)

    # --- acknowledgements -----------------------------------------------------------------

    def ack_individual(self, consumer: Consumer | None,
                       acks: list[IndividualAck]) -> asyncio.Future[None]:
        """Acknowledge messages (whole entries or batch indexes); the future resolves when the
        cursor state is durable. A message reserved by an open transaction belongs to that
        transaction: a plain acknowledgement of it is ignored. A batch-index ack whose batch
        size is not the entry's (see `check_batch_ack`) is left out, the others taken: the
        future then fails with NotAllowedError once they are durable."""
        self._check_ackable(ack.position for ack in acks)
        _check_names_entries(ack.position for ack in acks)
        reasons = [self._batch_ack_refusal(consumer, ack) for ack in acks]
        refused = [reason for reason in reasons if reason is not None]
        if refused:
            acks = [ack for ack, reason in zip(acks, reasons) if reason is None]
            if not acks:
                failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                failed.set_exception(NotAllowedError(_refusal(refused)))
                return failed
        whole: list[Position] = []
        future: asyncio.Future[None] | None = None
        if self.topic.compaction.horizon is not None and self._reads_compacted(consumer):
            acks = [self._compacted_out_acked(ack) for ack in acks]
        for ack in acks:
            if self.pending_ack is not None:
                if self.pending_ack.is_fully_pending(
                        ack.position,
                        ack.batch_size if ack.ack_set is not None else self._batch_size(ack.position, consumer)):
                    log.debug("ignoring plain ack of %s reserved by a transaction", ack.position)
                    continue
                ack = self._without_reserved_indexes(ack)
            if ack.ack_set is None or ackset_is_fully_acked(list(ack.ack_set), ack.batch_size):
                whole.append(ack.position)
            else:
                future = self.cursor.ack_batch_indexes(ack.position, list(ack.ack_set), ack.batch_size)
        if whole:
            future = self.cursor.ack(whole)
        acked = [a.position for a in acks if self.cursor.is_acked(a.position)]
        self.dispatcher.acked(acked)
        self.dispatcher.recount([a.position for a in acks if a.ack_set is not None])
        done = future if future is not None else self.cursor.persist()
        return _refused_after(done, _refusal(refused)) if refused else done

    def _without_reserved_indexes(self, ack: IndividualAck) -> IndividualAck:
        """A plain ack of a batch some indexes of which an open transaction holds: those stay
        unacknowledged (PIP-31: a message in PENDING_ACK is not deleted by a normal ack, which
        is dropped for it), the others are acknowledged. Taken whole, the entry was acked and
        the transaction's abort gave nothing back."""
        assert self.pending_ack is not None
        held = self.pending_ack.individual_ack_positions.get(ack.position)
        if held is None or held.ack_set is None:
            return ack
        size = held.batch_size
        reserved = ackset_andnot(ackset_new(size), list(held.ack_set))     # set bit: held by a txn
        stays = reserved if ack.ack_set is None else ackset_or(list(ack.ack_set), reserved)
        return IndividualAck(ack.position, size, tuple(stays))

    def _check_ackable(self, positions: Iterable[Position]) -> None:
        """As Pulsar's ManagedCursor, an acknowledgement past the topic's last entry is
        refused: it names no message yet, and the one written there later would be taken as
        acknowledged (an id of another topic, say, acknowledged on this one)."""
        lac = self.topic.ledger.lac
        for position in positions:
            if position > lac:
                raise NotAllowedError(f"Invalid mark deleted position {position}: after the last entry ({lac}) "
                                      f"of {self.topic.name}")

    def _reads_compacted(self, consumer: Consumer | None) -> bool:
        """Whether acks of `consumer` (None: the subscription's) are of messages it was given
        from the compacted view. Only a read-compacted consumer of an Exclusive/Failover
        subscription is: any other consumer was given every message of a batch, so the
        indexes the view compacted out are its own to acknowledge."""
        if self.sub_type not in ("exclusive", "failover"):
            return False
        if consumer is not None:
            return bool(getattr(consumer, "read_compacted", False))
        return any(getattr(c, "read_compacted", False) for c in self.consumers)

    def _compacted_out_acked(self, ack: IndividualAck) -> IndividualAck:
        """A batch-index ack of a batch of the compacted view: its compacted-out messages,
        never delivered, count as acknowledged (else the entry would never be)."""
        if ack.ack_set is None:
            return ack
        mask = self.topic.compaction.compacted_out_mask_at(ack.position)
        if mask is None:
            return ack
        return IndividualAck(ack.position, ack.batch_size, tuple(ackset_and(list(ack.ack_set), mask)))

    def _compacted_out_taken_by_txn(self, ack: IndividualAck) -> IndividualAck:
        """A transactional batch-index ack of a batch of the compacted view, as the plain one:
        the compacted-out messages, never delivered, are acknowledged with it, so that the
        commit acknowledges the entry once every message the consumer saw is. Only those still
        free are taken: one acknowledged on the cursor, or held by another transaction, would
        make the request conflict over messages neither consumer saw. An abort gives them
        back free, and the next ack of the entry takes them."""
        if ack.ack_set is None or self.pending_ack is None:
            return ack
        mask = self.topic.compaction.compacted_out_mask_at(ack.position)
        if mask is None:
            return ack
        size = ack.batch_size
        compacted_out = ackset_andnot(ackset_new(size), mask)      # set bit: compacted out
        cursor_free = self.cursor.batch_ack_set(ack.position)
        if cursor_free is not None:
            compacted_out = ackset_and(compacted_out, cursor_free)
        held = self.pending_ack.individual_ack_positions.get(ack.position)
        if held is not None:
            if held.whole:
                return ack
            compacted_out = ackset_and(compacted_out, list(held.requested()))
        return IndividualAck(ack.position, size, tuple(ackset_andnot(list(ack.ack_set), compacted_out)))

    def _batch_size(self, position: Position, consumer: Consumer | None = None) -> int:
        """The number of messages of the entry at `position`: a whole-entry ack (a client
        without batch-index acks) carries none, and is for all of them, not for index 0."""
        return self._entry_batch_size(position, consumer) or 1

    def _entry_batch_size(self, position: Position, consumer: Consumer | None = None) -> int | None:
        """The number of messages of the entry at `position` as the broker knows it (None: the
        position holds no entry): recorded when the entry was dispatched, by `consumer` first
        (an ack's usual case: one dict lookup), else stored with the entry. Pulsar's broker
        takes it from its consumers' pending acks the same way (Consumer's
        getAckOwnerConsumerAndBatchSize), never from the client."""
        if consumer is not None:
            size = consumer.pending.get(position)
            if size is not None:
                return size
        for other in self.consumers:
            size = other.pending.get(position)
            if size is not None:
                return size
        entry = self.topic.ledger.read_entry(position)
        return entry.num_messages if entry is not None else None

    def _batch_ack_refusal(self, consumer: Consumer | None, ack: IndividualAck) -> str | None:
        """Why the batch-index ack `ack` cannot be taken (None: it can, or it is not one)."""
        if ack.ack_set is None:
            return None
        return self._batch_size_refusal(consumer, ack.position, ack.batch_size)

    def _batch_size_refusal(self, consumer: Consumer | None, position: Position, batch_size: int) -> str | None:
        size = self._entry_batch_size(position, consumer)
        if size is None:
            return f"{position} holds no entry of {self.topic.name}"
        if batch_size != size:
            return f"the batch at {position} holds {size} messages, not {batch_size}"
        return None

    def check_batch_size(self, consumer: Consumer | None, position: Position, batch_size: int) -> None:
        """`check_batch_ack` before an ack set is built (the embedding API builds it from its
        caller's message id: a wrong size is refused before it sizes that work). A position
        after the last entry is refused first, as an ack of it would be (`_check_ackable`)."""
        self._check_ackable((position,))
        reason = self._batch_size_refusal(consumer, position, batch_size)
        if reason is not None:
            raise NotAllowedError(_refusal([reason]))

    def check_batch_ack(self, consumer: Consumer | None, ack: IndividualAck) -> None:
        """A batch-index ack is taken only with the batch size of its entry, as the broker
        knows it (`_entry_batch_size`): its ack set was built for that size, and one built for
        another would acknowledge other indexes (a batch of 3's clears bits 3.. of a batch of
        10), or size the ack-set work by the client's number (hundreds of millions). Nor is
        a batch-index ack of a position that holds no entry taken: there is no message to
        acknowledge, and no size to bound it by. NotAllowedError for one that is not taken."""
        reason = self._batch_ack_refusal(consumer, ack)
        if reason is not None:
            raise NotAllowedError(_refusal([reason]))

    def ack_cumulative(self, consumer: Consumer | None, position: Position) -> asyncio.Future[None]:
        if self.sub_type in ("shared", "key_shared"):
            raise NotAllowedError(f"cumulative acknowledgement is not allowed on {self.sub_type} subscriptions")
        self._check_ackable((position,))
        future = self.cursor.ack_cumulative(position)
        # Everything up to `position` is done with: held, to deliver again, and its redelivery
        # count (kept for ever otherwise: one per message ever redelivered).
        dispatcher = self.dispatcher
        covered = {p for p in dispatcher.redelivery_counts if p <= position}
        covered.update(p for p in dispatcher.redeliveries if p <= position)
        if consumer is not None:
            covered.update(p for p in consumer.pending if p <= position)
        dispatcher.acked(sorted(covered))
        return future

    async def ack_with_transaction(self, consumer: Consumer | None, txn: TxnId,
                                   acks: list[IndividualAck] | None = None,
                                   cumulative: Position | None = None,
                                   after: asyncio.Future[Any] | None = None) -> None:
        """`after`: the txn's registration of this subscription while it is being written
        (`pyengine.broker.transactions.append_condition`)."""
        pending = self._txn_pending_ack(txn)
        positions = [cumulative] if cumulative is not None else [ack.position for ack in acks or ()]
        self._check_ackable(positions)
        _check_names_entries(positions)
        if cumulative is not None:
            self._check_cumulative_txn_ack()
            self._check_cumulative_txn_ack_of(consumer, txn, cumulative)
            await pending.cumulative_ack(txn, cumulative, after=after)
            self._taken_by_txn(consumer, txn, cumulative=cumulative)
        else:
            # Refused whole (as the pending acks refuse a request in conflict): reserving the
            # rest would commit acks its client was told failed.
            acks = [self._whole_entry_sized(consumer, ack) for ack in acks or ()]
            for ack in acks:
                self.check_batch_ack(consumer, ack)
                if ack.ack_set is not None:
                    try:        # a client's malformed ack set: refused, not an internal error
                        check_ack_set(ack.ack_set, ack.batch_size)
                    except (TypeError, ValueError) as exc:
                        raise NotAllowedError(f"acknowledgement of {ack.position} refused: {exc}") from None
            # Computed and reserved in one event-loop turn: no other request runs between.
            acks = [self._compacted_out_taken_by_txn(ack) for ack in acks] if self._txn_view_compacted(consumer) \
                else list(acks or [])
            await pending.individual_ack(txn, acks, after=after)
            self._taken_by_txn(consumer, txn, acks=acks)

    def _whole_entry_sized(self, consumer: Consumer | None, ack: IndividualAck) -> IndividualAck:
        """A whole-entry ack (no ack set) comes with size 1; the pending acks check it against
        the indexes the cursor holds acknowledged by that size, so it takes the entry's: by
        index 0 alone, it was refused when index 0 was acknowledged, taken when index 1 was."""
        if ack.ack_set is not None or ack.batch_size != 1:
            return ack
        size = self._entry_batch_size(ack.position, consumer)
        return ack if size is None or size == 1 else IndividualAck(ack.position, size)

    def _txn_pending_ack(self, txn: TxnId) -> PendingAckHandle:
        if self.pending_ack is None:
            raise NotAllowedError(f"subscription {self.name} cannot acknowledge in a transaction "
                                  "(a reader's subscription is not durable)")
        check_txn_design(self.topic.buffer, txn, self.topic.name)
        return self.pending_ack

    def _check_cumulative_txn_ack(self) -> None:
        if self.sub_type in ("shared", "key_shared"):
            raise NotAllowedError(f"cumulative acknowledgement is not allowed on {self.sub_type} subscriptions")

    def _txn_view_compacted(self, consumer: Consumer | None) -> bool:
        return self.topic.compaction.horizon is not None and self._reads_compacted(consumer)

    def _taken_by_txn(self, consumer: Consumer | None, txn: TxnId, cumulative: Position | None = None,
                      acks: list[IndividualAck] | None = None) -> None:
        """`txn` now holds everything up to `cumulative` and `acks`: the consumers no longer
        hold those messages (nor count them unacknowledged)."""
        assert self.pending_ack is not None
        own = [consumer] if consumer is not None else []
        taken: list[tuple[Position, list[Consumer]]] = []
        if cumulative is not None:
            taken += [(p, own) for p in (consumer.pending if consumer else {}) if p <= cumulative]
        if acks:
            # Any consumer may acknowledge a message individually: as Pulsar's ack owner, the
            # one it was given to no longer holds it (nor counts it unacknowledged).
            everyone = own + [c for c in self.consumers if c is not consumer]
            taken += [(a.position, everyone) for a in acks
                      if self.pending_ack.is_fully_pending(a.position, a.batch_size)]
            # As Pulsar: a transaction's batch-index acks lower the consumer's unacked count now.
            self.dispatcher.recount([a.position for a in acks if a.ack_set is not None])
        for position, holders in taken:
            if [holder for holder in holders if holder.pending.pop(position, None) is not None]:
                self._reserved_by_txn.setdefault(txn, set()).add(position)

    async def ack_cumulative_in_batch_with_transaction(self, consumer: Consumer | None, txn: TxnId,
                                                       ack: IndividualAck,
                                                       after: asyncio.Future[Any] | None = None) -> None:
        """A transactional cumulative ack of a message inside a batch, as the Java client sends
        it: the batch's entry with the ack set of its later indexes (set bits, still free).
        It covers every entry before the batch, cumulatively, and the batch's indexes up to the
        message, individually: one request to the pending acks, both or neither (Pulsar holds
        it as one cumulative position with an ack set). What the cursor or this transaction
        already acknowledged is left out, so consecutive transactions can each take a slice of
        one batch (acking the whole entry would lose the slices after the message)."""
        assert ack.ack_set is not None
        pending = self._txn_pending_ack(txn)
        self._check_ackable((ack.position,))
        self.check_batch_ack(consumer, ack)
        self._check_cumulative_txn_ack()
        self._check_cumulative_txn_ack_of(consumer, txn, ack.position)
        size = ack.batch_size
        requested = ackset_acked_indexes(list(ack.ack_set), size)
        if not requested:
            raise ValueError(f"a cumulative acknowledgement of {ack.position} acknowledges no message of its batch")
        message = requested[-1]
        mine = pending.individual_ack_of_txn.get(txn, {}).get(ack.position)
        if self.cursor.is_acked(ack.position) or _acked_in(self.cursor.batch_ack_set(ack.position), message) \
                or (mine is not None and (mine.ack_set is None or _acked_in(list(mine.ack_set), message))):
            # Already acknowledged (say, delivered again after a reconnect): a transaction that
            # took it again must fail, or its outputs would be committed twice.
            raise TransactionConflictError(f"[{self.topic.name}][{self.name}] Transaction:{txn} try to cumulative "
                                           f"ack batch message:{ack.position}:{message} already acked before")
        covered = self.cursor.mark_delete
        holder = pending.cumulative_ack_of_txn
        if holder is not None and holder[0] == txn and holder[1] > covered:
            covered = holder[1]
        before = self.topic.ledger.previous_position(ack.position)
        all_indexes = ackset_new(size)
        free = list(ack.ack_set)              # in Pulsar's convention: a set bit is not acked
        cursor_free = self.cursor.batch_ack_set(ack.position)
        if cursor_free is not None:           # indexes the cursor acked stay out of the request
            free = ackset_or(free, ackset_andnot(all_indexes, cursor_free))
        if mine is not None and mine.ack_set is not None:
            free = ackset_or(free, ackset_andnot(all_indexes, list(mine.ack_set)))
        indexes = IndividualAck(ack.position, size, tuple(free))
        if self._txn_view_compacted(consumer):
            indexes = self._compacted_out_taken_by_txn(indexes)
        # (ledger, -1): no stored entry precedes the batch (the ledgers before it, consumed,
        # were trimmed), so there is nothing to acknowledge cumulatively.
        if before.entry_id >= 0 and before > covered:
            await pending.cumulative_ack_in_batch(txn, before, indexes, after=after)
            self._taken_by_txn(consumer, txn, cumulative=before, acks=[indexes])
        else:
            await pending.individual_ack(txn, [indexes], after=after)
            self._taken_by_txn(consumer, txn, acks=[indexes])

    def auto_ack(self, positions: list[Position]) -> None:
        """Markers and aborted entries: acknowledged so they never count as backlog."""
        self.cursor.ack(positions)

    # --- transactions ---------------------------------------------------------------------

    async def end_txn(self, txn: TxnId, commit: bool, low_watermark: int) -> None:
        if self.pending_ack is None:
            return
        # Carried to its end though the caller is cancelled (the coordinator abandons a call
        # that takes too long, then repeats it): the handle's part goes on regardless, and the
        # repeat finds the txn ended there, with nothing left to give back. A repeat while it
        # runs waits for it rather than give the same messages back a second time.
        key = (txn, commit)
        ending = self._ending_txns.get(key)
        if ending is None:
            ending = asyncio.ensure_future(self._end_txn(txn, commit, low_watermark))
            self._ending_txns[key] = ending
            ending.add_done_callback(partial(self._txn_ended, key))
        await asyncio.shield(ending)

    def _txn_ended(self, key: tuple[TxnId, bool], ending: asyncio.Task[None]) -> None:
        if self._ending_txns.get(key) is ending:
            del self._ending_txns[key]
        mark_retrieved(ending)          # its caller may be gone; a repeat raises it again

    async def _end_txn(self, txn: TxnId, commit: bool, low_watermark: int) -> None:
        assert self.pending_ack is not None
        if commit:
            acked = await self.pending_ack.commit(txn, low_watermark)
            self._reserved_by_txn.pop(txn, None)
            # A batch the transaction acked only some indexes of is still in flight: its other
            # messages must stay redeliverable.
            self.dispatcher.acked([position for position in acked if self.cursor.is_acked(position)])
        else:
            holder = self.pending_ack.cumulative_ack_of_txn
            released = await self.pending_ack.abort(txn, low_watermark)
            reserved = self._reserved_by_txn.pop(txn, set())
            again = reserved.union(released)
            if holder is not None and holder[0] == txn:
                # Every unacknowledged message up to a cumulative ack comes back (Pulsar
                # redelivers all the consumer's unacked messages), not only those that were
                # pending at the consumer when it acked: the dispatcher skipped the others
                # while the ack held them (after a restart, all of them).
                again.update(self._passed_over_up_to(holder[1]))
            self._give_back(again)

    def committed_by_pending_ack(self, positions: list[Position], txn: TxnId | None = None) -> None:
        """The pending-ack handle committed `txn` on its own (a v5 decision it watched):
        `positions`, the entries now acknowledged whole, leave flight, and what its acks took
        from the consumers is no longer to be given back (as `end_txn`'s commit). Kept, the
        next abort would take it for an ended txn's and deliver it again."""
        if txn is not None:
            self._reserved_by_txn.pop(txn, None)
        self.dispatcher.acked(positions)

    def released_by_pending_ack(self, positions: list[Position], *, txn: TxnId) -> None:
        """The pending-ack handle aborted `txn` on its own (a v5 decision it watched, a v4
        transaction below a coordinator's low watermark) and gives back `positions`: the
        entries it acked individually, then a cumulative ack's position. As for an abort
        through `end_txn`, every message it held comes back: those taken from their
        consumer's pending set, and all the dispatcher passed over up to a cumulative ack.
        Only `txn`'s: another transaction that no longer holds acks in the handle may be one
        whose commit is under way (a v4 low-watermark abort runs inside a commit)."""
        again = set(positions)
        again.update(self._reserved_by_txn.pop(txn, ()))
        if positions and self.sub_type not in ("shared", "key_shared"):
            # The last position may be a cumulative ack's (Exclusive/Failover only).
            again.update(self._passed_over_up_to(max(positions)))
        self._give_back(again)

    def _give_back(self, again: set[Position]) -> None:
        """Deliver again what an ended transaction's acks held. On Exclusive and Failover, with
        every message the consumers hold unacknowledged, as Pulsar's single-active dispatcher
        rewinds the cursor rather than redeliver single messages: the stream comes again in
        order (messages after them, delivered already, come again too), not the released
        messages after later ones."""
        if again and self.sub_type in SINGLE_ACTIVE_TYPES:
            # What the cursor acknowledged meanwhile (a plain cumulative ack, a skip) does not
            # come again, so it makes no consumer's later copies stale (the consumer stayed
            # stale for good: nothing asked for the stream again)
            unacked = [position for position in again if not self.cursor.is_acked(position)]
            earliest = min(unacked) if unacked else None
            for consumer in self.consumers:
                if earliest is not None and consumer.last_delivered is not None and consumer.last_delivered >= earliest:
                    consumer.stale_since(earliest)
                again.update(consumer.pending)
        self.dispatcher.redeliver(sorted(again))

    def _check_cumulative_txn_ack_of(self, consumer: Consumer | None, txn: TxnId, position: Position) -> None:
        """Whether `consumer` may ack up to `position` cumulatively in `txn`. An ack names only
        where it ends, so two rules keep it from covering messages it did not process, or
        that another consumer processes (Pulsar has neither):

        - not from a Failover consumer that is no longer the active one: what it held went to
          the active one, whose cumulative ack leaves out what the cursor acknowledged, so
          both transactions would commit the same messages.
        - not over copies the consumer was sent that went stale (`Consumer.stale_from`),
          until it asks for the stream again (a redeliver-all; an aborted transaction's
          client does it):
          - the subscription gave back messages (an ended transaction's) after the consumer
            had been sent later ones: the dispatcher passed over them while the transaction
            held them (as Pulsar's), so its application may hold later copies and ack one
            before the stream comes again, taking the given-back messages unprocessed (lost;
            the client cannot tell: its ack left first);
          - it was active, then another consumer was handed what it held, then it was active
            again: its queue still holds the old copies, which the other consumer may have
            processed and committed meanwhile (and its ack, above the cursor's position,
            would commit them twice)."""
        if consumer is None:
            return
        where = f"[{self.topic.name}][{self.name}] Transaction:{txn} try to cumulative ack {position}"
        if self.sub_type == "failover" and not consumer.active:
            raise TransactionConflictError(
                f"{where}: {consumer.name} is not the active consumer (its messages went to the active one)")
        if consumer.stale_from is not None and position >= consumer.stale_from:
            raise TransactionConflictError(
                f"{where}: what this consumer was sent from {consumer.stale_from} on is stale (an ended "
                "transaction's messages given back after it was sent later ones, or handed over to another "
                "consumer); they come again: ask for redelivery")

    def _passed_over_up_to(self, position: Position) -> list[Position]:
        """The entries up to `position` the dispatcher has read past and that are neither
        acknowledged nor in flight at a consumer (markers and aborted entries left out)."""
        cursor, ledger = self.cursor, self.topic.ledger
        last = min(position, ledger.previous_position(cursor.read_position))
        in_flight = {p for consumer in self.consumers for p in consumer.pending}
        passed = []
        start = ledger.next_position(cursor.mark_delete)
        while start <= last:
            entries = ledger.read_entries(start, 1000, last)
            if not entries:
                break
            for entry in entries:
                at = entry.position
                if not (entry.is_marker or cursor.is_acked(at) or at in in_flight
                        or (entry.txn_most >= 0 and self.topic.buffer.hides(entry))):
                    passed.append(at)
            start = ledger.next_position(entries[-1].position)
        return passed

    # --- positioning ----------------------------------------------------------------------

    def redeliver_unacknowledged(self, consumer: Consumer, positions: list[Position] | None = None, *,
                                 epoch: int | None = None) -> asyncio.Future[None] | None:
        """Deliver again what `consumer` holds unacknowledged: all of it, or those of
        `positions` it holds (as Pulsar: a message it no longer holds, acknowledged or out at
        another consumer since, is not its to give back). `epoch`: the request's PIP-84 epoch,
        the consumer's from the redelivery on (what it was sent before carries an older one).

        A rewind (all of it) of an Exclusive/Failover consumer whose pending acks are v5 ones
        first has them apply the decisions already taken on the txns holding acks here
        (`PendingAckHandle.resolve_decided`): the client asks after its abort, whose
        header watch may reach the subscription later, and the messages an aborted cumulative
        ack held then came after later ones. Such a rewind returns a future, done once it is
        (None: done at once); until then the consumer's epoch stays, and its flows and
        redeliveries wait behind it, in order (one overtaking it would send the stream again
        under the newer epoch), and nothing is dispatched to it."""
        waiting = self._rewinding.get(consumer)
        if waiting is not None:
            done = asyncio.get_running_loop().create_future()
            waiting.redeliveries.append((positions, epoch, done))
            return done
        if positions is None and self.sub_type in SINGLE_ACTIVE_TYPES and self.pending_ack is not None:
            resolving = self.pending_ack.resolve_decided()
            if resolving is not None:
                # Nothing goes to the consumer until the rewind: what went out meanwhile (the
                # header watch applying the abort gives its messages back) would carry the epoch
                # the rewind ends, dropped by the client, or received twice by one with no epoch.
                waiting = self._rewinding[consumer] = _WaitingRewind(permits=consumer.permits)
                consumer.permits = 0
                rewind = asyncio.ensure_future(self._rewind_once_resolved(consumer, resolving, epoch))
                self._rewinds.add(rewind)
                done = asyncio.get_running_loop().create_future()
                rewind.add_done_callback(partial(self._rewind_ended, consumer, waiting, done))
                return done
        self._redeliver_now(consumer, positions, epoch)
        return None

    async def _rewind_once_resolved(self, consumer: Consumer, resolving: asyncio.Future[None],
                                    epoch: int | None) -> None:
        waiting = self._rewinding[consumer]
        here = False
        try:
            try:
                await resolving
            except Exception as exc:        # left to the header watch, as before the rewind waited
                log.warning("[%s][%s] applying the decided transactions before a rewind failed: %s",
                            self.topic.name, self.name, exc)
            here = consumer in self.consumers
        finally:
            del self._rewinding[consumer]
            if not here:                    # it left, or the subscription closes: nothing to give it
                for _positions, _epoch, done in waiting.redeliveries:
                    _settle_after(None, done)
        if not here:
            return
        self._redeliver_now(consumer, None, epoch)
        if waiting.permits:
            self.dispatcher.flow(consumer, waiting.permits)
        for index, (positions, later_epoch, done) in enumerate(waiting.redeliveries):
            again = self._rewinding.get(consumer)
            if again is not None:           # one of them waits in turn: the others after it
                again.redeliveries.extend(waiting.redeliveries[index:])
                return
            _settle_after(self.redeliver_unacknowledged(consumer, positions, epoch=later_epoch), done)

    def _rewind_ended(self, consumer: Consumer, waiting: _WaitingRewind, done: asyncio.Future[None],
                      rewind: asyncio.Task[None]) -> None:
        """Settle the rewind's future however its task ended. Cancelled (the subscription
        closes), also before it first ran: nothing is left to give a closed subscription's
        consumer, so the rewind and the redeliveries queued behind it end quietly; their
        callers' own tasks were not cancelled."""
        self._rewinds.discard(rewind)
        if self._rewinding.get(consumer) is waiting:
            del self._rewinding[consumer]
        if rewind.cancelled() or rewind.exception() is not None:
            for _positions, _epoch, queued in waiting.redeliveries:
                _settle_after(None, queued)
        if done.done():
            return
        if not rewind.cancelled() and rewind.exception() is not None:
            done.set_exception(rewind.exception())
        else:
            done.set_result(None)

    def _redeliver_now(self, consumer: Consumer, positions: list[Position] | None, epoch: int | None) -> None:
        """The redelivery itself (see redeliver_unacknowledged), nothing left to wait for."""
        if epoch is not None:
            consumer.advance_epoch(epoch)
        if positions is None:
            consumer.stale_from = None             # the stream comes again, in order
            positions = list(consumer.pending)
        else:
            positions = [position for position in positions if position in consumer.pending]
        # As Pulsar's Consumer.redeliverUnacknowledgedMessages: the consumer is no longer
        # blocked on its unacked limit (a consumer at its limit that nacks gets them back).
        consumer.blocked_on_unacked = False
        # Pulsar's msgRateRedeliver counts the messages asked for again (a batch's unacked ones).
        consumer.rate_redeliver.add(sum(map(consumer.pending.unacked_of, positions)), 0)
        self.dispatcher.redeliver(positions, consumer)

    async def seek(self, position: Position, *, earliest: bool | None = None,
                   ack_set: list[int] | None = None) -> None:
        """Reset the cursor to `position`. `earliest`: whether this is a seek to
        MessageId.earliest (None: when `position` is the first stored entry); for
        read-compacted consumers it goes to the start of the compacted view. `ack_set`: a
        seek to a message inside the batch at `position` (its earlier indexes acknowledged)."""
        if ack_set:
            # Checked against the entry: when the set acknowledges every message of it, the
            # seek goes past it (never a batch left unacknowledged with nothing to deliver).
            entry = self.topic.ledger.read_entry(position)
            if entry is None:
                ack_set = None
            elif ackset_is_fully_acked(ack_set, max(entry.num_messages, 1)):
                position, ack_set = self.topic.ledger.next_position(position), None
        saved = self.cursor.seek(position, ack_set)        # the cursor moves in memory now
        # The dispatcher follows the cursor at once, not after the save: a pass meanwhile would
        # deliver from the new position what a later reset drops, the cursor already past it.
        # Also when the save fails (the caller gets the error; a retry saves it).
        for waiting in self._rewinding.values():
            waiting.permits = 0             # the reset below takes them back, as the others
        if any(getattr(c, "read_compacted", False) for c in self.consumers):
            # Into the compacted view, whose entries may be in ledgers trimmed since: at its
            # start for the earliest position (the first stored entry), else at its first
            # entry from `position` on.
            if earliest is None:
                earliest = position == self.topic.ledger.first_position()
            target = None if earliest else position
            self.topic.compaction.rewind_to_view(self.cursor, target)
        self.dispatcher.reset()
        self.dispatcher.notify()
        await saved

    async def clear_backlog(self) -> None:
        """Acknowledge everything a reader can see now (Pulsar's skip_all / clear-backlog): up
        to the read horizon, not the LAC, so an open transaction's entries are still delivered
        if it commits."""
        horizon = self.topic.buffer.max_read_position()
        if horizon <= self.cursor.mark_delete or self._closed:
            return
        skipped = {p for p in self.dispatcher.redeliveries if p <= horizon}
        skipped.update(self.dispatcher.held_back_up_to(horizon))
        skipped.update(p for consumer in self.consumers for p in consumer.pending if p <= horizon)
        await self.cursor.ack_cumulative(horizon)
        self.dispatcher.acked(sorted(skipped))

    async def skip_messages(self, count: int) -> None:
        """Acknowledge the next `count` entries a consumer would be given (Pulsar's
        skipMessages: whole entries, those already acknowledged not counted). Markers and
        entries of aborted transactions are passed over without counting; nothing beyond the
        read horizon is skipped (an open transaction's entries are delivered if it commits).
        A transaction's pending acks on a skipped entry stay its own: its commit finds the
        entry acknowledged, its abort gives nothing back."""
        if count <= 0:
            raise ValueError(f"the number of messages to skip must be > 0, not {count}")
        cursor, buffer = self.cursor, self.topic.buffer

        def visible(entry: Entry) -> bool:
            return not (entry.is_marker or cursor.is_acked(entry.position)
                        or (entry.txn_most >= 0 and buffer.hides(entry)))
        await self._skip(count, visible)

    async def skip_entries(self, count: int) -> None:
        """Acknowledge the next `count` stored entries, whatever they hold (markers, aborted
        entries, entries already acknowledged: Pulsar's skipEntries with
        IndividualDeletedEntries.Include, as its backlog eviction skips), never beyond the read
        horizon."""
        if count <= 0:
            raise ValueError(f"the number of entries to skip must be > 0, not {count}")
        await self._skip(count, lambda entry: True)

    async def _skip(self, count: int, counted: Callable[[Entry], bool]) -> None:
        """Acknowledge up to the `count`-th entry from the mark-delete position for which
        `counted` is true (the entries not counted before it go with it)."""
        ledger = self.topic.ledger
        horizon = self.topic.buffer.max_read_position()
        last = self.cursor.mark_delete
        start = ledger.next_position(last)
        while count > 0 and start <= horizon:
            entries = ledger.read_entries(start, min(count, 1000) + 16, horizon)
            if not entries:
                break
            for entry in entries:
                if counted(entry):
                    if count == 0:
                        break
                    count -= 1
                last = entry.position
            else:
                start = ledger.next_position(entries[-1].position)
                continue
            break
        await self._acknowledge_up_to(last)

    async def _acknowledge_up_to(self, last: Position) -> int:
        """Move the mark-delete position to `last` (nothing when it is there already), taking
        what it covers out of the consumers' pending sets, the redeliveries and the delayed
        messages held back, as skip and expiry do. Returns the entries the move took out of
        the backlog (counted as it is made: acks racing the write are not in it)."""
        cursor = self.cursor
        if last <= cursor.mark_delete or self._closed:
            # Closed (unsubscribed, its topic unloaded) since the caller took it: a save now
            # would write a deleted cursor's record again.
            return 0
        skipped = {p for p in self.dispatcher.redeliveries if p <= last}
        skipped.update(self.dispatcher.held_back_up_to(last))
        skipped.update(p for consumer in self.consumers for p in consumer.pending if p <= last)
        before = cursor.backlog()
        done = cursor.ack_cumulative(last)
        moved = max(0, before - cursor.backlog())
        self.dispatcher.acked(sorted(skipped))
        self.dispatcher.notify()
        await done
        return moved

    # --- message expiry (message TTL) -------------------------------------------------------

    async def expire_messages(self, ttl_seconds: int, now_ms: int) -> bool:
        """Acknowledge every message published `ttl_seconds` or more before `now_ms` (Pulsar's
        PersistentSubscription.expireMessages: the mark-delete position moves to the newest
        expired entry). The entries are taken in order from the mark-delete position and the
        first one not expired ends the search (publish times need not be monotonic: nothing
        younger than the TTL is ever expired). Entries already acknowledged are passed over;
        markers and aborted entries are tested as messages are (Pulsar's expiry reads raw
        entries), or a backlog of them would outlive every TTL. Never past the read horizon: an open transaction's
        entries, and all after them, are not expired however old, as they are not readable
        yet. A transaction's pending acks on an expired entry stay its own (as for skip: its
        commit finds the entry acknowledged, its abort gives nothing back), as in Pulsar, whose
        expiry mark-deletes without asking the pending-ack handle.

        Returns False when the expiry was not issued, as Pulsar decides it: no backlog, or
        connected consumers, a backlog under 1000 entries and the oldest message not expired."""
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds < 0:
            raise ValueError(f"an expiry time is a whole number of seconds >= 0, not {ttl_seconds!r}")
        backlog = self.backlog()
        if backlog == 0:
            return False
        last = await self._newest_expired(now_ms - ttl_seconds * 1000)
        if last is None and self.consumers and backlog < MINIMUM_BACKLOG_FOR_EXPIRY_CHECK:
            return False
        self.last_expire_timestamp = wall_clock_ms()
        if last is not None:
            await self._expire_up_to(last)
        return True

    async def expire_up_to(self, position: Position) -> bool:
        """Acknowledge everything up to `position` (Pulsar's expire-by-message-id), but never
        past the read horizon. As Pulsar, a position beyond the topic's last entry expires
        nothing (False: not issued), but the request is still recorded as the last expiry
        (PersistentSubscription.expireMessages(Position) sets it before asking its monitor)."""
        self.last_expire_timestamp = wall_clock_ms()
        if position > self.topic.ledger.lac:
            return False
        last = min(position, self.topic.buffer.max_read_position())
        if last > self.cursor.mark_delete:
            await self._expire_up_to(last)
        return True

    async def _expire_up_to(self, last: Position) -> None:
        # As Pulsar counts them: the entries the move took out of the backlog (the backlog
        # just before the mark-delete, not before the search: acks during it are not expiry).
        expired = await self._acknowledge_up_to(last)
        self.total_msg_expired += expired
        self.rate_expired.add(expired, 0)

    async def _newest_expired(self, cutoff_ms: int) -> Position | None:
        """The newest entry, up to the read horizon, such that every entry not acknowledged
        from the mark-delete position to it was published at or before `cutoff_ms`; None when
        the oldest such entry is younger."""
        cursor, ledger, buffer = self.cursor, self.topic.ledger, self.topic.buffer
        horizon = buffer.max_read_position()
        found = None
        start = ledger.next_position(cursor.mark_delete)
        while start <= horizon and not self.topic.closed and not self._closed:
            entries = ledger.read_entries(start, 1000, horizon)
            if not entries:
                break
            for entry in entries:
                at = entry.position
                if cursor.is_acked(at):
                    continue
                # Markers and aborted entries expire by their publish time too, as in Pulsar
                # (its search reads raw entries): left, they would stay in the backlog for good.
                if entry.publish_time > cutoff_ms:
                    return found
                found = at
            start = ledger.next_position(entries[-1].position)
            horizon = buffer.max_read_position()
            await asyncio.sleep(0)             # a long backlog does not hold the loop
        return found

    def backlog(self) -> int:
        return self.cursor.backlog()

    def stats(self) -> dict:
        return {
            "type": self.sub_type,
            "durable": self.durable,
            "msgBacklog": self.backlog(),
            "msgDelayed": self.dispatcher.number_of_delayed_messages(),
            "totalMsgExpired": self.total_msg_expired,
            "lastExpireTimestamp": self.last_expire_timestamp,
            "markDeletePosition": str(self.cursor.mark_delete),
            "readPosition": str(self.cursor.read_position),
            # As Pulsar, unackedMessages counts on Shared and Key_Shared only (individual-ack
            # mode): Exclusive and Failover consumers show 0.
            "consumers": [{"consumerName": c.name, "availablePermits": c.permits,
                           "unackedMessages": c.unacked_messages if self.sub_type in ("shared", "key_shared") else 0,
                           "blockedConsumerOnUnackedMsgs": c.blocked_on_unacked} for c in self.consumers],
            "blockedSubscriptionOnUnackedMsgs": self.dispatcher.blocked_on_unacked,
            "pendingAck": self.pending_ack.stats() if self.pending_ack is not None else None,
        }

    async def close(self) -> None:
        self._closed = True
        for rewind in list(self._rewinds):
            rewind.cancel()
        self.dispatcher.close()
        if self.pending_ack is not None:
            await self.pending_ack.close()
        await self.cursor.flush()


def _settle_after(result: asyncio.Future[None] | None, done: asyncio.Future[None]) -> None:
    """Resolve `done` once `result` (a redelivery's; None: done already) is."""
    def settle(_: object = None) -> None:
        if not done.done():
            done.set_result(None)
    if result is None:
        settle()
    else:
        result.add_done_callback(settle)


def _check_names_entries(positions: Iterable[Position]) -> None:
    """An individual or transactional ack of a position that names no entry ((-1, -1),
    (ledger, -1): a client's earliest or malformed message id) is its bad input: refused,
    as one past the last entry is, rather than failing in the cursor's or the pending acks'
    checks with a ValueError (an UnknownError on the wire). A plain cumulative ack may name
    (ledger, -1): everything before the ledger's first entry."""
    for position in positions:
        if position.ledger_id < 0 or position.entry_id < 0:
            raise NotAllowedError(f"Invalid position {position}: it names no entry")


def _refusal(reasons: list[str]) -> str:
    """The error of acks refused (the first few reasons: an ACK may name thousands)."""
    shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
    return f"{len(reasons)} batch-index acknowledgement(s) refused: {shown}"


def _refused_after(done: asyncio.Future[None], reason: str) -> asyncio.Future[None]:
    """A future that fails as `done` does, or once `done` succeeds, with NotAllowedError
    (`reason`): the acks taken are durable, the others were refused."""
    result: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def settle(_: asyncio.Future[None]) -> None:
        if result.done():
            return
        if done.cancelled():
            result.cancel()
        elif done.exception() is not None:
            result.set_exception(done.exception())
        else:
            result.set_exception(NotAllowedError(reason))
    done.add_done_callback(settle)
    return result


def _acked_in(ack_set: list[int] | None, index: int) -> bool:
    """Whether batch index `index` is acknowledged in `ack_set` (a clear bit; a missing word
    is acknowledged); None is no batch state at all: nothing acknowledged."""
    if ack_set is None:
        return False
    word = index // 64
    return word >= len(ack_set) or not (ack_set[word] >> (index % 64)) & 1
