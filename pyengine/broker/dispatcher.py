"""Dispatcher: moves a subscription's entries to its consumers, READ_COMMITTED.

One pass (`_dispatch`, scheduled on the event loop whenever something may have changed: new
entries, a moved read horizon, permits, acks, redeliveries) does what Pulsar's persistent
dispatchers do:

* read from the cursor's read position up to the transaction buffer's max read position, and
  never further: nothing at or after the first entry of an open transaction is delivered;
* acknowledge, instead of delivering, commit/abort markers and entries of aborted transactions,
  so they never count as backlog and never stall a reader (Pulsar #11877, #22610);
* skip entries already acknowledged, and entries reserved in full by open transactions
  (Pulsar #19581); deliver partly acknowledged batches with their ack set;
* deliver entries put back for redelivery first, in position order; Key_Shared entries put
  back because their key's consumer could not take them are kept by that consumer
  (`ReplayQueue`), so a pass passes over a busy consumer's whole backlog in one step;
* Key_Shared: read no new entries while the entries to deliver again reach the look-ahead cap
  (Pulsar's keySharedLookAheadMsgInReplayThresholdPerConsumer times the consumers, at most
  ...PerSubscription), so what is held back for a blocked consumer stays bounded;
* honour permits, and choose the consumer by subscription type: the active consumer
  (Exclusive, Failover), round robin (Shared), or the key's consumer (Key_Shared: the
  consistent-hash ring of Pulsar 4.0's default selector, or the consumers' STICKY ranges, over
  the same 2^16 key hashes as Pulsar: hash_ring.py);
* Exclusive and Failover: count no redeliveries (Pulsar's RedeliveryTrackerDisabled); when
  another Failover consumer becomes the active one, deliver nothing for the broker's
  active_consumer_failover_delay_time_ms, then give it what the previous one left
  unacknowledged (Pulsar's delayed cursor rewind), so that acknowledgements still on their
  way are not delivered twice;
* Key_Shared, per-key order while consumers come and go (Pulsar 4.0's draining hashes,
  PIP-379): a key hash is delivered to one consumer at a time. When the consumers change, a
  hash whose previous consumer still holds unacknowledged entries of it "drains" there: the
  new consumer gets none of its entries (they wait with the replays) until that consumer
  acknowledges them or leaves (its entries are then delivered again, first). The other keys
  go on at once. An entry read while an earlier one of its key waits with the replays waits
  too. Not on a subscription whose consumers allow out-of-order delivery
  (KeySharedMeta.allowOutOfOrderDelivery): there a key goes to its consumer now at once;
* Shared and Key_Shared: hold back a message whose `deliver_at_time` is still to come (delayed
  delivery, `pyengine.broker.delayed`) and deliver it with the replays once its time has come;
  Exclusive and Failover subscriptions (and readers) deliver it at once, as Pulsar does;
* Shared and Key_Shared: stop giving messages to a consumer that holds as many unacknowledged
  messages as its limit, and to the whole subscription when its consumers together do, until
  acknowledgements (or redeliveries, or a consumer leaving) bring the count under half the
  limit (Pulsar's maxUnackedMessagesPerConsumer and maxUnackedMessagesPerSubscription, its
  blockedConsumerOnUnackedMsgs and blockedDispatcherOnUnackmsgs). Messages are counted, a
  batch's indexes already acknowledged or reserved by a transaction left out; a blocked
  subscription still gives out what it delivers again (only its new reads stop, as Pulsar's);
* Exclusive and Failover subscriptions (and readers) whose active consumer reads compacted
  (`read_compacted`): while the cursor is at or before the compaction horizon, read the
  topic's compacted view (`pyengine.broker.compaction`) instead of the ledger, from the
  cursor's position on, then go on with the ledger after the horizon (Pulsar's
  CompactedTopicImpl.asyncReadEntriesOrWait). Entries keep their original positions, so
  acknowledgements, redeliveries and seeks work on them as on the ledger's.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import heapq
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from pyengine.broker.consumer import Consumer, Delivery, unacked_messages
from pyengine.broker.delayed import DelayedDeliveryTracker, deliver_at_time
from pyengine.broker.hash_ring import HashRing, murmur_hash, ring_key_hash, sticky_key_hash
from pyengine.broker.policies import DelayedDelivery, UnackedLimits
from pyengine.protocol.commands import parse_message_metadata
from pyengine.storage.entry import Entry, split_headers_and_payload
from pyengine_kernels import Position, ackset_acked_indexes, ackset_and

if TYPE_CHECKING:
    from pyengine.broker.subscription import Subscription

log = logging.getLogger(__name__)

READ_BATCH = 200            # entries read from storage per step
# What one pass gives out at most, then the next pass goes on (on a later loop turn, after the
# connections wrote it and said whether they can take more): a consumer with huge permits read
# the whole backlog into its connection's buffer in one pass.
PASS_BYTES = 1 << 20
PASS_ENTRIES = 5 * READ_BATCH
READ_RETRY_S = (0.1, 10.0)  # a pass whose read failed is tried again after this, doubling up to a cap
RING_POINTS = 100           # points per consumer on the Key_Shared hash ring (Pulsar's default)
FAILOVER_RING_POINTS = 100  # points per consumer on a Failover topic's ring (CONSUMER_CONSISTENT_HASH_REPLICAS)
DELAYING_TYPES = ("shared", "key_shared")   # the subscription types that honour deliver_at_time
LIMITED_TYPES = ("shared", "key_shared")    # the subscription types whose unacked messages are limited
SINGLE_ACTIVE_TYPES = ("exclusive", "failover")     # one consumer receives (Pulsar's single-active dispatcher)


NONE_KEY = b"NONE_KEY"       # what an entry without a key is routed by (Pulsar's Commands.NONE_KEY)


def java_string_order(name: str) -> bytes:
    """A sort key that orders names as Java's String.compareTo does: by UTF-16 code units (a
    character outside the BMP, a surrogate pair, sorts before U+E000..U+FFFF), not by code
    points."""
    return name.encode("utf-16-be", "surrogatepass")


def entry_key(entry: Entry) -> bytes:
    """The key an entry is routed by, as Pulsar's Commands.peekStickyKey: the ordering key,
    else the partition key (base64-decoded when `partition_key_b64_encoded`, as the Java client
    sends keyBytes()), else NONE_KEY (also for metadata that does not parse)."""
    try:
        md = parse_message_metadata(split_headers_and_payload(entry.data)[0])
    except ValueError:
        return NONE_KEY
    if md.HasField("ordering_key"):
        return md.ordering_key
    if not md.HasField("partition_key"):
        return NONE_KEY
    if md.partition_key_b64_encoded:
        try:
            return base64.b64decode(md.partition_key, validate=True)
        except ValueError:
            return NONE_KEY             # Pulsar's decoder throws there: peekStickyKey's fallback
    key = md.partition_key
    # A key that is not UTF-8 comes as bytes (pyengine.protocol.text): routed by those bytes.
    return key if type(key) is bytes else key.encode()


class ReplayQueue:
    """The entries to deliver again, a set of positions (Pulsar's redelivery/replay set).

    Key_Shared entries put back because the consumer of their key could not take them are
    kept with their key hash (as Pulsar's replay set keeps sticky key hashes), grouped by that
    consumer: a pass skips the group of a consumer that still cannot take anything in one
    step, instead of sorting and walking all it holds back (quadratic while one consumer is
    blocked and the others go on). So are the Key_Shared entries given back by a consumer
    (negative acks, a consumer gone), whose hash their consumer kept. The other entries
    (delayed messages due, entries given back by a transaction) have no known key until they
    are read again.
    """

    def __init__(self, owner_of: Callable[[int], Consumer | None]) -> None:
        self._owner_of = owner_of                   # a key hash's consumer now (None: nobody's)
        self._unkeyed: list[Position] = []          # sorted
        self._held: dict[Consumer | None, list[Position]] = {}  # by the key's consumer, sorted
        self._owners: dict[Position, Consumer | None] = {}      # the held ones: their group
        self._hashes: dict[Position, int] = {}                  # the held ones: their key hash
        self._hash_counts: dict[int, int] = {}                  # the held ones by key hash

    def __len__(self) -> int:
        return len(self._unkeyed) + len(self._owners)

    def __bool__(self) -> bool:
        return bool(self._unkeyed) or bool(self._owners)

    def __contains__(self, position: object) -> bool:
        return position in self._owners or _find(self._unkeyed, position) >= 0

    def __iter__(self) -> Iterator[Position]:
        return iter(self._unkeyed + list(self._owners))    # a copy: safe to change meanwhile

    def add(self, position: Position) -> None:
        """Put back an entry whose key is not known (one held back already stays so)."""
        if position in self._owners:
            return
        index = bisect.bisect_left(self._unkeyed, position)
        if index == len(self._unkeyed) or self._unkeyed[index] != position:
            self._unkeyed.insert(index, position)

    def update(self, positions: Iterable[Position]) -> None:
        for position in positions:
            self.add(position)

    def hold(self, position: Position, hash_value: int) -> None:
        """Key_Shared: put back an entry of key hash `hash_value` (one its consumer could not
        take, or one given back)."""
        self.discard(position)
        owner = self._owner_of(hash_value)
        bisect.insort(self._held.setdefault(owner, []), position)
        self._owners[position] = owner
        self._hashes[position] = hash_value
        self._hash_counts[hash_value] = self._hash_counts.get(hash_value, 0) + 1

    def holds_hash(self, hash_value: int) -> bool:
        """Whether an entry of key hash `hash_value` is held (Pulsar's containsStickyKeyHash)."""
        return hash_value in self._hash_counts

    def discard(self, position: Position) -> None:
        if position in self._owners:
            owner = self._owners.pop(position)
            hash_value = self._hashes.pop(position)
            left = self._hash_counts[hash_value] - 1
            if left:
                self._hash_counts[hash_value] = left
            else:
                del self._hash_counts[hash_value]
            group = self._held[owner]
            del group[_find(group, position)]
            if not group:
                del self._held[owner]
            return
        index = _find(self._unkeyed, position)
        if index >= 0:
            del self._unkeyed[index]

    def difference_update(self, positions: Iterable[Position]) -> None:
        for position in list(positions):
            self.discard(position)

    def clear(self) -> None:
        self._unkeyed.clear()
        self._held.clear()
        self._owners.clear()
        self._hashes.clear()
        self._hash_counts.clear()

    def regroup(self, keyed: bool) -> None:
        """The consumers changed: group the held entries by their key's consumer now (not
        Key_Shared any more, `keyed` False: their keys no longer matter)."""
        hashes = self._hashes
        self._held, self._owners, self._hashes = {}, {}, {}
        if not keyed:
            self._hash_counts = {}
            self.update(hashes)
            return
        owners: dict[int, Consumer | None] = {}
        for position, hash_value in hashes.items():
            if hash_value not in owners:
                owners[hash_value] = self._owner_of(hash_value)
            owner = owners[hash_value]
            self._held.setdefault(owner, []).append(position)
            self._owners[position] = owner
            self._hashes[position] = hash_value
        for group in self._held.values():
            group.sort()

    def walk(self, can_take: Callable[[Consumer], bool], horizon: Position,
             blocked: Callable[[int, Consumer], bool] | None = None) -> Iterator[Position]:
        """The entries to offer again now, in position order, up to `horizon`: those of no
        known key, and those held for a consumer that can take, less those whose key hash is
        `blocked` for that consumer (draining at another one: passed over unread, as Pulsar's
        replay filter). The caller takes each one out before offering it, and may hold it
        again: a refusal, after which the later entries of its key hash are passed over too
        (their order). A consumer's group is left for the rest of the walk once that consumer
        cannot take (nothing frees up during a pass)."""
        # The entry walked last of each group; None stands for the entries of no known key
        # (the entries held for nobody are not walked). Each group is walked forwards from
        # there, so an entry held again (behind) is not offered twice.
        heads: list[tuple[Position, int, Consumer | None]] = []
        if self._unkeyed:
            heads.append((self._unkeyed[0], 0, None))
        for tie, (owner, group) in enumerate(self._held.items(), 1):
            if owner is not None and can_take(owner):
                heads.append((group[0], tie, owner))
        heapq.heapify(heads)
        refused: set[int] = set()
        while heads:
            position, tie, owner = heapq.heappop(heads)
            if position > horizon:
                return
            if owner is not None and not can_take(owner):
                continue
            hash_value = self._hashes.get(position)
            if hash_value is None or not (hash_value in refused or
                                          (blocked is not None and blocked(hash_value, owner))):
                yield position
                if position in self._owners:        # held again: refused
                    refused.add(self._hashes[position])
            group = self._unkeyed if owner is None else self._held.get(owner)
            if group:
                index = bisect.bisect_right(group, position)
                if index < len(group):
                    heapq.heappush(heads, (group[index], tie, owner))


def _find(positions: list[Position], position: object) -> int:
    """The index of `position` in the sorted `positions`, -1 when absent."""
    index = bisect.bisect_left(positions, position)     # type: ignore[arg-type]
    return index if index < len(positions) and positions[index] == position else -1


@dataclass(slots=True)
class DrainingHash:
    """Key_Shared: a key hash draining at `consumer` (Pulsar's DrainingHashEntry; the entries
    it waits for are that consumer's pending entries of the hash)."""

    consumer: Consumer
    blocked_attempts: int = 0           # deliveries of the hash to another consumer refused


class DrainingHashStats(NamedTuple):
    """Pulsar's DrainingHash stats: a hash, its unacknowledged entries, its blocked attempts."""

    hash_value: int
    unack_msgs: int
    blocked_attempts: int


class Dispatcher:
    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.consumers: list[Consumer] = []
        self.redeliveries = ReplayQueue(self._owner)
        self.redelivery_counts: dict[Position, int] = {}
        self._scheduled = False
        self._retry: asyncio.TimerHandle | None = None     # a pass again after a failed read
        self._retry_delay = READ_RETRY_S[0]
        self._next_shared = 0
        self._next_by_priority: dict[int, int] = {}    # Shared, consumers of several priorities
        self._priority_levels: list[int] | None = None   # their levels, highest first (None: one level)
        # A non-partitioned Failover topic's hash ring: (consumer names, sorted hashes, hash -> index).
        self._failover_ring: tuple[tuple[str, ...], list[int], dict[int, int]] | None = None
        self._ring: HashRing[Consumer] = HashRing(RING_POINTS)    # Key_Shared AUTO_SPLIT consumers
        self._sticky = False                # Key_Shared: the key hashes are STICKY slots (else the ring's)
        # Key_Shared (PIP-379): the key hashes whose consumer changed while the previous one
        # still holds unacknowledged entries of them, by hash; and per consumer, how many of
        # its draining hashes were cleared since it joined (Pulsar's drainingHashesClearedTotal).
        self._draining: dict[int, DrainingHash] = {}
        self._draining_cleared: dict[Consumer, int] = {}
        self._replaying = False             # during a pass: offering entries put back for redelivery
        self._more = False                  # during a pass: it stopped at its bounds (`PASS_BYTES`)
        self._closed = False
        # Exclusive/Failover: the consumer picked as the active one, and the handover to it
        # while a Failover switch waits (activeConsumerFailoverDelayTimeMillis).
        self._active: Consumer | None = None
        self._handover: asyncio.TimerHandle | None = None
        # Delayed delivery (Shared, Key_Shared): created with the first message held back.
        self.delayed: DelayedDeliveryTracker | None = None
        self._delay_policy: DelayedDelivery | None = None    # during a pass: looked up once
        # Unacked-messages limits (Shared, Key_Shared): looked up again when a policy changes.
        self._limits: tuple[int, UnackedLimits] | None = None    # (policies version, limits)
        self._consumer_limit = 0            # during a pass: 0 is no limit
        self._subscription_limit = 0
        self._subscription_unacked = 0      # during a pass: the consumers' unacked messages
        self.blocked_on_unacked = False     # the whole subscription reached its limit

    # --- membership -----------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        consumer.pending.on_released = lambda hash_value: self._hash_released(consumer, hash_value)
        if self.subscription.sub_type in SINGLE_ACTIVE_TYPES:
            # The subscription may have become Exclusive/Failover (its earlier consumers all
            # left): what was held back is delivered now, as that type does not delay, and
            # without the counts of its Shared days (that type counts no redeliveries).
            if self.delayed is not None:
                self.redeliveries.update(self.delayed.clear())
            self.redelivery_counts.clear()
        self.consumers.append(consumer)
        if consumer.sticky_ranges is None:
            self._ring.add(consumer, consumer.name)
        self._rebuild_ring()
        self._update_priority_levels()
        self._update_active()
        self.notify()

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        self._ring.remove(consumer)
        if not self.consumers:
            self.blocked_on_unacked = False     # nothing is unacknowledged any more (no pass runs)
        consumer.connected = False
        self.redeliver(list(consumer.pending), consumer, count=False)   # its draining hashes go
        self._draining_cleared.pop(consumer, None)
        self._rebuild_ring()
        self._update_priority_levels()
        self._update_active()
        self.notify()

    def _update_priority_levels(self) -> None:
        """Taken when consumers come and go, not for every entry a Shared pass selects for."""
        levels = sorted({c.priority for c in self.consumers})
        self._priority_levels = levels if len(levels) > 1 else None

    def _update_active(self) -> None:
        """Exclusive/Failover: pick the active consumer again. When another one is picked while
        one was active, a Failover subscription hands over after the broker's
        active_consumer_failover_delay_time_ms (Pulsar's scheduleReadOnActiveConsumer): until
        then nothing is delivered, and acknowledgements the previous consumer makes meanwhile
        keep those messages from being delivered again. A handover already waiting is not
        restarted. The first consumer of a subscription (nothing to hand over) starts at once,
        where Pulsar makes it wait the delay too."""
        if self.subscription.sub_type not in SINGLE_ACTIVE_TYPES:
            self._cancel_handover()
            self._active = None
            return
        previous, active = self._active, self.active_consumer()
        self._active = active
        if active is previous or active is None or self._handover is not None:
            return
        delay_ms = self._failover_delay_ms()
        if previous is not None and delay_ms > 0:
            self._handover = asyncio.get_running_loop().call_later(delay_ms / 1000, self._hand_over)
        else:
            self._hand_over()

    def _failover_delay_ms(self) -> int:
        """How long a Failover switch waits (Pulsar's activeConsumerFailoverDelayTimeMillis;
        Exclusive: never)."""
        if self.subscription.sub_type != "failover":
            return 0
        return self.subscription.topic.service.config.active_consumer_failover_delay_time_ms

    def _hand_over(self) -> None:
        """The picked consumer becomes the active one: the consumers hear whether they are, and
        what the others hold unacknowledged goes to it, in order (Pulsar's cursor rewind; a
        consumer that left has given its messages back already)."""
        self._handover = None
        active = self._active
        for consumer in self.consumers:
            now_active = consumer is active
            if now_active != consumer.active:
                consumer.active = now_active
                consumer.sink.active_changed(now_active)
        for consumer in self.consumers:
            if consumer is not active and consumer.pending:
                # Its copies go stale: the active one processes them now (its application may
                # still hold them, and take them if it is made the active one again).
                consumer.stale_since(min(consumer.pending))
                self.redeliver(list(consumer.pending), consumer, count=False)
        self.notify()

    def _cancel_handover(self) -> None:
        if self._handover is not None:
            self._handover.cancel()
            self._handover = None

    def active_consumer(self) -> Consumer | None:
        """Exclusive/Failover: the consumer that receives, as Pulsar's
        pickAndScheduleActiveConsumer: among the consumers of the highest priority (the lowest
        priority level) in name order, a partition's by its index (partitions spread over
        them), a non-partitioned topic's on a consistent-hash ring of their names by the hash
        of the topic's name (Pulsar >= 3.0: each topic of a subscription gets its own)."""
        if not self.consumers:
            return None
        ordered = sorted(self.consumers, key=lambda c: (c.priority, java_string_order(c.name)))
        top = [c for c in ordered if c.priority == ordered[0].priority]
        if len(top) == 1:
            return top[0]
        partition = self.subscription.topic.partition_index
        if partition >= 0:
            return top[partition % len(top)]
        names = tuple(c.name for c in top)
        if self._failover_ring is None or self._failover_ring[0] != names:
            points: dict[int, int] = {}
            for index, name in enumerate(names):
                for replica in range(FAILOVER_RING_POINTS):
                    points[murmur_hash(f"{name}{replica}".encode())] = index     # later ones win, as a TreeMap's put
            self._failover_ring = (names, sorted(points), points)
        _, hashes, points = self._failover_ring
        at = bisect.bisect_left(hashes, murmur_hash(self.subscription.topic.name.encode()))
        return top[points[hashes[at % len(hashes)]]]

    def _rebuild_ring(self) -> None:
        keyed = self.subscription.sub_type == "key_shared"
        if keyed:
            sticky = any(c.sticky_ranges is not None for c in self.consumers)
            if self.consumers and sticky != self._sticky:
                # The selector changed (its consumers all left, others came): the hashes held
                # were slots of the other one, so those entries are read and hashed again.
                self.redeliveries.regroup(False)
                self._sticky = sticky
            if self._keeps_key_order():
                self._register_draining_hashes()
        self.redeliveries.regroup(keyed)        # keys held back may have another consumer now

    # --- Key_Shared draining hashes (PIP-379) ------------------------------------------------

    def _keeps_key_order(self) -> bool:
        """Key_Shared: whether a key's entries wait for those of it given out or held back
        before (Pulsar: unless the subscription allows out-of-order delivery)."""
        return not self.subscription.allow_out_of_order_delivery

    def _register_draining_hashes(self) -> None:
        """The consumers changed: a key hash a consumer holds unacknowledged entries of and no
        longer owns drains at that consumer, and the others get none of its entries until it
        acknowledges them (or leaves); one owned by its holder again drains no more."""
        for hash_value, draining in list(self._draining.items()):
            if self._owner(hash_value) is draining.consumer:
                self._clear_draining(hash_value)
        for consumer in self.consumers:
            for hash_value in consumer.pending.hash_counts:
                if hash_value not in self._draining and self._owner(hash_value) is not consumer:
                    self._draining[hash_value] = DrainingHash(consumer)

    def _blocked(self, hash_value: int, consumer: Consumer) -> bool:
        """Whether entries of key hash `hash_value` are kept from `consumer`: the hash drains
        at another consumer (Pulsar's shouldBlockStickyKeyHash, counting the attempts)."""
        draining = self._draining.get(hash_value)
        if draining is None or draining.consumer is consumer:
            return False
        draining.blocked_attempts += 1
        return True

    def _hash_released(self, consumer: Consumer, hash_value: int) -> None:
        """`consumer` holds no entry of key hash `hash_value` any more."""
        draining = self._draining.get(hash_value)
        if draining is not None and draining.consumer is consumer:
            self._clear_draining(hash_value)
            if draining.blocked_attempts:
                self.notify()               # what it kept from the new consumer can go now

    def _clear_draining(self, hash_value: int) -> None:
        consumer = self._draining.pop(hash_value).consumer
        if consumer in self.consumers:
            self._draining_cleared[consumer] = self._draining_cleared.get(consumer, 0) + 1

    def draining_hashes(self, consumer: Consumer) -> list[DrainingHashStats]:
        """Key_Shared: the key hashes draining at `consumer` now (Pulsar's drainingHashes)."""
        return [DrainingHashStats(hash_value, consumer.pending.hash_counts.get(hash_value, 0),
                                  draining.blocked_attempts)
                for hash_value, draining in self._draining.items() if draining.consumer is consumer]

    def draining_hashes_cleared(self, consumer: Consumer) -> int:
        """Key_Shared: how many hashes stopped draining at `consumer` since it joined."""
        return self._draining_cleared.get(consumer, 0)

    # --- inputs ---------------------------------------------------------------------------

    def flow(self, consumer: Consumer, permits: int) -> None:
        consumer.permits += permits
        self.notify()

    def redeliver(self, positions: list[Position], consumer: Consumer | None = None, *, count: bool = True) -> None:
        """Put entries back to be delivered again (negative acks, a consumer gone, an aborted
        transaction's acknowledgements). An entry the cursor has not read yet is left to the
        normal read: put back as well, it would be delivered twice (an aborted transaction may
        have acknowledged it before its delivery, or before a restart moved the read back).
        `count`: raise their redelivery counts; never on Exclusive/Failover, whose messages
        always carry 0 (Pulsar's single-active dispatcher has RedeliveryTrackerDisabled), so a
        client's dead-letter policy never strands a message there."""
        if self.subscription.sub_type in SINGLE_ACTIVE_TYPES:
            count = False
        cursor = self.subscription.cursor
        for position in positions:
            hash_value = None
            if consumer is not None:
                hash_value = consumer.pending.hash_of(position)
                consumer.pending.pop(position, None)
            else:
                # Given back by a transaction (say, a batch it acked part of): delivered again,
                # it is no longer held (nor counted unacknowledged) where it was delivered.
                for holder in self.consumers:
                    holder.pending.pop(position, None)
            if cursor.is_acked(position) or position >= cursor.read_position:
                continue
            if hash_value is not None and self.subscription.sub_type == "key_shared":
                self.redeliveries.hold(position, hash_value)   # its key's later entries wait for it
            else:
                self.redeliveries.add(position)
            if count:
                self.redelivery_counts[position] = self.redelivery_counts.get(position, 0) + 1
        self.notify()

    def acked(self, positions: list[Position]) -> None:
        for position in positions:
            self.redelivery_counts.pop(position, None)
            self.redeliveries.discard(position)
            for consumer in self.consumers:
                consumer.pending.pop(position, None)
        if self.delayed is not None:
            self.delayed.discard(positions)
        if self._any_blocked():
            self.notify()

    def recount(self, positions: list[Position]) -> None:
        """Some messages of the batches at `positions` were acknowledged, or reserved by a
        transaction: the consumers holding them hold fewer unacknowledged messages."""
        cursor, pending_ack = self.subscription.cursor, self.subscription.pending_ack
        for position in positions:
            for consumer in self.consumers:
                size = consumer.pending.get(position)
                if size is None:
                    continue
                free = pending_ack.pending_ack_set(position) if pending_ack is not None else None
                if free is None:
                    free = cursor.batch_ack_set(position)
                if free is not None:
                    consumer.pending.lower_unacked(position, size - len(ackset_acked_indexes(free, size)))
        if self._any_blocked():
            self.notify()

    def _any_blocked(self) -> bool:
        return self.blocked_on_unacked or any(c.blocked_on_unacked for c in self.consumers)

    def reset(self) -> None:
        """Forget everything in flight (the cursor was moved by a seek)."""
        self.redeliveries.clear()
        self.redelivery_counts.clear()
        self._draining.clear()              # nothing is unacknowledged any more
        if self.delayed is not None:
            self.delayed.clear()            # the cursor reads them again from where it now is
        for consumer in self.consumers:
            consumer.pending.clear()
            consumer.permits = 0
            consumer.sink.reset()
            # The stream comes again from the cursor: nothing sent before is stale any more, as
            # after a redeliver-all (a network consumer is disconnected by a seek: a new one).
            consumer.stale_from = consumer.last_delivered = None

    def notify(self) -> None:
        if self._scheduled or self._closed:
            return
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._run)

    def number_of_delayed_messages(self) -> int:
        """Messages held back for delayed delivery now (Pulsar's msgDelayed)."""
        return len(self.delayed) if self.delayed is not None else 0

    def held_back_up_to(self, position: Position) -> list[Position]:
        """The positions held back for delayed delivery at or before `position`."""
        return self.delayed.positions_up_to(position) if self.delayed is not None else []

    def close(self) -> None:
        self._closed = True
        self._cancel_handover()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self.delayed is not None:
            self.delayed.close()
        for consumer in list(self.consumers):
            consumer.connected = False
            consumer.sink.closed_by_broker()
        self.consumers.clear()

    # --- the pass -------------------------------------------------------------------------

    def _run(self) -> None:
        self._scheduled = False
        if self._closed or not self.consumers or self._handover is not None:
            return                          # a Failover handover waiting: nothing is read meanwhile
        try:
            self._dispatch()
        except Exception:
            # A read failed (what the pass gave out is delivered all the same): nothing else
            # may wake the dispatcher, so the pass is tried again after a backoff, as Pulsar's
            # dispatchers retry a failed read.
            log.exception("[%s][%s] dispatch failed, retrying in %.1f s", self.subscription.topic.name,
                          self.subscription.name, self._retry_delay)
            if self._retry is None:
                self._retry = asyncio.get_running_loop().call_later(self._retry_delay, self._retry_pass)
                self._retry_delay = min(self._retry_delay * 2, READ_RETRY_S[1])
        else:
            self._retry_delay = READ_RETRY_S[0]

    def _retry_pass(self) -> None:
        self._retry = None
        self.notify()

    def _dispatch(self) -> None:
        sub = self.subscription
        topic = sub.topic
        cursor = sub.cursor
        horizon = topic.buffer.max_read_position()
        outbox: dict[Consumer, list[Delivery]] = {}
        auto_acked: list[Position] = []
        select = self._selector()
        keyed = sub.sub_type == "key_shared"
        delays = sub.sub_type in DELAYING_TYPES
        # Only entries that may carry a deliver_at_time are searched for one: those stored
        # before the topic was loaded, and all once a delayed message was published.
        delays_everywhere = delays and topic.delayed_seen
        delays_up_to = topic.delayed_unchecked_up_to
        compacted = self._compaction_horizon()
        self._delay_policy = None
        limited = self._look_up_limits()
        given = [0, 0]                      # entries and bytes given out by this pass

        def offer(entry: Entry, from_view: bool = False) -> bool:
            """Deliver `entry` or leave it to be delivered later. False when nobody can take
            anything more (stop reading)."""
            position = entry.position
            if entry.is_marker or (entry.txn_most >= 0 and topic.buffer.hides(entry)):
                auto_acked.append(position)
                return True
            if cursor.is_acked(position):
                return True
            if delays and (delays_everywhere or position <= delays_up_to) and self._hold_back(entry):
                return True
            batch_ack_set = None
            pending_ack = sub.pending_ack
            if pending_ack is not None:
                if pending_ack.is_fully_pending(position, entry.num_messages):
                    return True
                batch_ack_set = pending_ack.pending_ack_set(position)
            if batch_ack_set is None:
                batch_ack_set = cursor.batch_ack_set(position)
            if from_view:
                # A batch of the compacted view: its compacted-out messages count as acked.
                mask = topic.compaction.compacted_out_mask(entry)
                if mask is not None:
                    batch_ack_set = mask if batch_ack_set is None else ackset_and(batch_ack_set, mask)
            if self.blocked_on_unacked and not self._replaying:
                return False            # as Pulsar, the subscription's limit stops new reads only
            if given[0] >= PASS_ENTRIES or given[1] >= PASS_BYTES:
                self._more = True       # the next pass goes on from here
                return False
            hash_value = self.key_hash(entry_key(entry)) if keyed else None
            consumer = select(entry) if hash_value is None else self._select_by_key(hash_value)
            if consumer is None:
                if hash_value is not None and any(self._can_take(c) for c in self.consumers):
                    # Its consumer is busy, or its key drains elsewhere: later, in order, kept
                    # by that consumer.
                    self.redeliveries.hold(position, hash_value)
                    return True
                return False
            # The indexes of a batch already acknowledged are not handed out: `permits_taken`,
            # inlined for an entry with no ack set (every entry's path).
            if batch_ack_set is None:
                unacked = entry.num_messages or 1
                consumer.permits -= entry.num_messages
            else:
                unacked = unacked_messages(entry.num_messages, batch_ack_set)
                consumer.permits -= unacked
            consumer.pending.add(position, entry.num_messages, unacked, hash_value)
            if consumer.last_delivered is None or position > consumer.last_delivered:
                consumer.last_delivered = position
            if limited:
                self._subscription_unacked += unacked
                self._update_blocks(consumer)
            outbox.setdefault(consumer, []).append(
                Delivery(entry, self.redelivery_counts.get(position, 0), batch_ack_set))
            given[0] += 1
            given[1] += len(entry.data)
            return True

        self._more = False
        try:
            self._read_and_offer(offer, compacted, horizon)
        finally:
            # Also after a failed read: what was given out (permits taken, pending acks, the
            # cursor moved past it) must reach its consumer, or it is held there unsent.
            self._send(outbox, auto_acked)
        if self._more:
            self.notify()

    def _read_and_offer(self, offer: Callable[..., bool], compacted: Position | None, horizon: Position) -> None:
        """The steps of a pass that read (see `_dispatch`)."""
        sub = self.subscription
        topic = sub.topic
        cursor = sub.cursor
        # 0. Delayed messages whose time has come join the replays (Pulsar's
        #    getMessagesToReplayNow), not counted as redeliveries.
        if self.delayed is not None:
            for position in self.delayed.pop_due():
                if not cursor.is_acked(position):
                    self.redeliveries.add(position)

        # 1. Entries to deliver again, oldest first (those held for a busy consumer left unread).
        if self.redeliveries:
            self._replaying = True
            try:
                blocked = self._blocked if self._keeps_key_order() else None
                for position in self.redeliveries.walk(self._can_take, horizon, blocked):
                    if not self._any_permits(replay=True):
                        break
                    self.redeliveries.discard(position)
                    from_view = compacted is not None and position <= compacted
                    try:
                        if from_view:
                            entry = topic.compaction.read_entry(position)
                        else:
                            entry = topic.ledger.read_entry(position)
                        offered = entry is None or offer(entry, from_view)
                    except BaseException:
                        self.redeliveries.add(position)      # still to deliver again: the retry does
                        raise
                    if not offered:
                        self.redeliveries.add(position)
                        break
            finally:
                self._replaying = False

        # 2. New entries: the compacted view up to the compaction horizon for a consumer that
        #    reads compacted, then the ledger up to the read horizon.
        while compacted is not None and cursor.read_position <= compacted and self._any_permits():
            entries = topic.compaction.read_entries(cursor.read_position, READ_BATCH)
            if not entries:
                after = topic.ledger.next_position(compacted)
                if after > cursor.read_position:
                    cursor.read_position = after
                break
            stopped = False
            for entry in entries:
                if not offer(entry, True):
                    stopped = True
                    break
                cursor.read_position = entry.position.next()
            if stopped:
                break
        #    Key_Shared: not while the entries held back reach the look-ahead cap (they are
        #    delivered first as their consumers take them; then reading goes on).
        look_ahead = self._look_ahead_limit()
        while self._any_permits() and (compacted is None or cursor.read_position > compacted):
            start = cursor.read_position
            if start > horizon:
                break
            if look_ahead is not None and len(self.redeliveries) >= look_ahead:
                break
            entries = topic.ledger.read_entries(start, READ_BATCH, horizon)
            if not entries:
                break
            stopped = False
            for entry in entries:
                if look_ahead is not None and len(self.redeliveries) >= look_ahead:
                    stopped = True
                    break
                if not offer(entry):
                    stopped = True
                    break
                cursor.read_position = topic.ledger.next_position(entry.position)
            if stopped:
                break

    def _send(self, outbox: dict[Consumer, list[Delivery]], auto_acked: list[Position]) -> None:
        sub = self.subscription
        topic = sub.topic
        for consumer, deliveries in outbox.items():
            msgs = nbytes = 0
            for delivery in deliveries:
                msgs += delivery.entry.num_messages
                nbytes += len(delivery.entry.data)
            consumer.rate_out.add(msgs, nbytes)
            sub.rate_out.add(msgs, nbytes)
            topic.rate_out.add(msgs, nbytes)
            try:
                consumer.sink.deliver(deliveries)
            except Exception:
                # Its sink failed (say, an embedded consumer that cannot decode a malformed
                # batch): that consumer keeps them pending (given back when it leaves), and
                # the others' entries and the auto acks of this pass still go out.
                log.exception("[%s][%s] delivering to consumer %s failed", topic.name, sub.name, consumer.name)
        if auto_acked:
            sub.auto_ack(auto_acked)

    def _look_ahead_limit(self) -> int | None:
        """Key_Shared: how many entries held back for redelivery stop the reading of new ones,
        None for no cap (Pulsar's getEffectiveLookAheadLimit: the per-consumer threshold times
        the consumers, at most the per-subscription one; a threshold 0 is left out; both 0: the
        broker's unacked-messages limits, the per-consumer one times the consumers)."""
        if self.subscription.sub_type != "key_shared":
            return None
        config = getattr(self.subscription.topic.service, "config", None)
        per_consumer = getattr(config, "key_shared_look_ahead_msg_in_replay_threshold_per_consumer", 2000)
        per_subscription = getattr(config, "key_shared_look_ahead_msg_in_replay_threshold_per_subscription", 20_000)
        consumers = len(self.consumers)
        if per_consumer > 0:
            limit = per_consumer * consumers
            if 0 < per_subscription < limit:
                limit = per_subscription
            return limit
        if per_subscription > 0:
            return per_subscription
        unacked_per_subscription = getattr(config, "max_unacked_messages_per_subscription", 200_000)
        unacked_by_consumers = getattr(config, "max_unacked_messages_per_consumer", 50_000) * consumers
        limits = [limit for limit in (unacked_per_subscription, unacked_by_consumers) if limit > 0]
        return min(limits) if limits else None

    def _compaction_horizon(self) -> Position | None:
        """The compaction horizon when the subscription's active consumer reads compacted
        (Exclusive/Failover, readers), else None."""
        if self.subscription.sub_type not in ("exclusive", "failover"):
            return None
        active = self.active_consumer()
        if active is None or not getattr(active, "read_compacted", False):
            return None
        return self.subscription.topic.compaction.horizon

    def _strict_delivery(self) -> bool:
        """isDelayedDeliveryDeliverAtTimeStrict of the broker (strict when there is none)."""
        config = getattr(self.subscription.topic.service, "config", None)
        return getattr(config, "delayed_delivery_deliver_at_time_strict", True)

    def _hold_back(self, entry: Entry) -> bool:
        """Delayed delivery: whether `entry` is to be held back until its deliver_at_time
        (and is now tracked). Pulsar's trackDelayedDelivery."""
        deliver_at = deliver_at_time(entry.data)
        if deliver_at is None:
            return False
        policy = self._delay_policy
        topic = self.subscription.topic
        if policy is None:
            try:
                policy = topic.service.policies.delayed_delivery(topic.name)
            except Exception:               # no policy store (tests), or an unreadable one
                policy = DelayedDelivery()
            self._delay_policy = policy
        if not policy.active:
            return False
        tracker = self.delayed
        if tracker is None:
            tracker = self.delayed = DelayedDeliveryTracker(
                self.notify, tick_time_ms=policy.tick_time_ms, strict=self._strict_delivery(),
                clock=topic.service.config.clock)
        tracker.tick_time_ms = policy.tick_time_ms
        return tracker.add(entry.position, deliver_at)

    def _any_permits(self, *, replay: bool = False) -> bool:
        """Whether a consumer may be given a message now: a new one, or (`replay`) one to
        deliver again, which a subscription blocked on its unacked messages still gives out
        (Pulsar's readMoreEntries replays while blockedDispatcherOnUnackmsgs)."""
        if self.subscription.sub_type in ("exclusive", "failover"):
            active = self.active_consumer()
            return active is not None and active.permits > 0 and active.writable
        if self.blocked_on_unacked and not replay:
            return False
        return any(self._can_take(c) for c in self.consumers)

    def _can_take(self, consumer: Consumer) -> bool:
        """Shared, Key_Shared: whether `consumer` may be given a message now."""
        return consumer.permits > 0 and consumer.writable and not consumer.blocked_on_unacked

    def _look_up_limits(self) -> bool:
        """At the start of a pass: the unacked-messages limits that apply (none on Exclusive
        and Failover subscriptions; the per-consumer one only on durable subscriptions, as
        Pulsar's), and who is blocked by them now. Whether any limit applies."""
        sub = self.subscription
        limits = None
        if sub.sub_type in LIMITED_TYPES:
            policies = getattr(sub.topic.service, "policies", None)
            if policies is not None:
                if self._limits is None or self._limits[0] != policies.version:
                    try:
                        self._limits = (policies.version, policies.unacked_limits(sub.topic.name))
                    except Exception:       # an unreadable policy store: Pulsar's defaults
                        self._limits = (policies.version, UnackedLimits())
                limits = self._limits[1]
        self._consumer_limit = limits.per_consumer if limits is not None and sub.durable else 0
        self._subscription_limit = limits.per_subscription if limits is not None else 0
        self._subscription_unacked = sum(c.unacked_messages for c in self.consumers)
        for consumer in self.consumers:
            self._update_blocks(consumer)
        return limits is not None

    def _update_blocks(self, consumer: Consumer) -> None:
        """Block `consumer` (the subscription) at its limit; unblock it once it holds half of
        it or less (the subscription: less than half), Pulsar's rules."""
        limit, unacked = self._consumer_limit, consumer.unacked_messages
        if limit <= 0:
            consumer.blocked_on_unacked = False
        elif unacked >= limit:
            consumer.blocked_on_unacked = True
        elif consumer.blocked_on_unacked and unacked <= limit // 2:
            consumer.blocked_on_unacked = False
        limit, unacked = self._subscription_limit, self._subscription_unacked
        if limit <= 0:
            self.blocked_on_unacked = False
        elif unacked >= limit:
            self.blocked_on_unacked = True
        elif self.blocked_on_unacked and (unacked < limit // 2 or unacked == 0):
            # Nothing unacknowledged also unblocks: Pulsar's integer half of a limit of 1 is 0,
            # which no count is under, and that subscription would never be given more.
            self.blocked_on_unacked = False

    def _selector(self) -> Callable[[Entry], Consumer | None]:
        sub_type = self.subscription.sub_type
        if sub_type in ("exclusive", "failover"):
            active = self.active_consumer()
            return lambda entry: (active if active is not None and active.permits > 0 and active.writable
                                  else None)
        return self._select_round_robin

    def _select_round_robin(self, entry: Entry) -> Consumer | None:
        """Shared: round-robin over the consumers of the highest priority (the lowest priority
        level) that can take an entry, as Pulsar's getNextConsumer goes to a lower level only
        when no consumer of a higher one has permits."""
        consumers = self.consumers
        if self._priority_levels is not None:
            for level in self._priority_levels:
                members = [c for c in consumers if c.priority == level]
                start = self._next_by_priority.get(level, 0)
                for step in range(len(members)):
                    consumer = members[(start + step) % len(members)]
                    if self._can_take(consumer):
                        self._next_by_priority[level] = (start + step + 1) % len(members)
                        return consumer
            return None
        for step in range(len(consumers)):
            consumer = consumers[(self._next_shared + step) % len(consumers)]
            if self._can_take(consumer):
                self._next_shared = (self._next_shared + step + 1) % len(consumers)
                return consumer
        return None

    def _select_by_key(self, hash_value: int) -> Consumer | None:
        """Key_Shared: the consumer of key hash `hash_value` when it may be given an entry of
        it now: not while the hash drains at another consumer, nor (a new read) while an
        earlier entry of it waits to be delivered again (Pulsar's canDispatchEntry; neither
        when out-of-order delivery is allowed)."""
        consumer = self._owner(hash_value)
        if consumer is None or not self._can_take(consumer):
            return None
        if not self._keeps_key_order():
            return consumer
        if not self._replaying and self.redeliveries.holds_hash(hash_value):
            return None
        if self._draining and self._blocked(hash_value, consumer):
            return None
        return consumer

    def key_hash(self, key: bytes) -> int:
        """Key_Shared: the hash of `key` (hash_ring.py: a slot of this subscription's selector,
        the value Pulsar reports)."""
        return sticky_key_hash(key) if self._sticky else ring_key_hash(key)

    def _owner(self, hash_value: int) -> Consumer | None:
        if self._sticky:
            for consumer in self.consumers:
                if any(start <= hash_value <= end for start, end in consumer.sticky_ranges or ()):
                    return consumer
            return None
        return self._ring.select(hash_value)

    def key_hash_ranges(self, consumer: Consumer) -> list[tuple[int, int]]:
        """Key_Shared: the key hashes `consumer` is given (Pulsar's keyHashRangeArrays)."""
        if consumer.sticky_ranges is not None:
            return sorted(consumer.sticky_ranges)
        return self._ring.ranges_of(consumer)
