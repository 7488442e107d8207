"""A consumer as the broker sees it: where a subscription's dispatcher sends messages.

The transport is a `ConsumerSink`: the embedded client's in-process queue, or a network
connection sending MESSAGE frames. The broker-side `Consumer` keeps what Pulsar keeps per
consumer: its permits (how many more messages it asked for) and its pending acknowledgements
(entries delivered and not yet acknowledged), which go back to the subscription for
redelivery when the consumer leaves. The pending acknowledgements also count the consumer's
unacknowledged messages (Pulsar's unackedMessages), which Shared and Key_Shared subscriptions
limit (maxUnackedMessagesPerConsumer).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pyengine.broker.rates import RateCounter
from pyengine.storage.entry import Entry
from pyengine_kernels import Position, ackset_acked_indexes


def unacked_messages(num_messages: int, ack_set: list[int] | None) -> int:
    """The messages of an entry handed out to a consumer: every one, or with an ack set (a
    batch partly acknowledged) those it leaves unacknowledged."""
    size = max(num_messages, 1)
    return size if ack_set is None else size - len(ackset_acked_indexes(ack_set, size))


def permits_taken(num_messages: int, ack_set: list[int] | None) -> int:
    """The permits the dispatcher takes for an entry, as Pulsar's Consumer.sendMessages: a
    permit per message, none for the indexes of a batch already acknowledged (the Java client
    gives none back for them)."""
    return num_messages if ack_set is None else unacked_messages(num_messages, ack_set)


@dataclass(slots=True)
class Delivery:
    """One entry sent to a consumer."""

    entry: Entry
    redelivery_count: int = 0
    ack_set: list[int] | None = None     # batch indexes already acknowledged are clear bits

    @property
    def permits(self) -> int:
        """What it took of its consumer's permits (what a consumer that does not queue it
        gives back)."""
        return permits_taken(self.entry.num_messages, self.ack_set)


class ConsumerSink(Protocol):
    def deliver(self, deliveries: list[Delivery]) -> None:
        """Hand entries to the consumer (must not block: queue them)."""

    def active_changed(self, active: bool) -> None:
        """Failover: this consumer became (or stopped being) the active one."""

    def reset(self) -> None:
        """The subscription was reset (seek): drop what was received and not yet consumed."""

    def closed_by_broker(self) -> None:
        """The broker removed the consumer (topic deleted or terminated, unsubscribe)."""


class PendingAcks(dict[Position, int]):
    """Entries delivered and not yet acknowledged (position -> batch size), with the number of
    their messages still unacknowledged: a batch's whole size, less its indexes acknowledged.
    Key_Shared entries also keep their key hash, and the entries pending per hash (Pulsar's
    pending acks carry the sticky key hash: a hash's count is what its draining waits for).
    Every way an entry leaves (`pop`, `del`, `clear`) gives its messages back; `on_released`
    hears of a hash whose last pending entry left (not on `clear`)."""

    def __init__(self) -> None:
        super().__init__()
        self._unacked: dict[Position, int] = {}
        self.unacked_messages = 0
        self._hashes: dict[Position, int] = {}
        self.hash_counts: dict[int, int] = {}      # Key_Shared: pending entries by key hash
        self.on_released: Callable[[int], None] | None = None

    def add(self, position: Position, batch_size: int, unacked: int, hash_value: int | None = None) -> None:
        if position in self:                # delivered again to the same consumer: counted once
            self._forget(position, release=False)
            super().__delitem__(position)
        super().__setitem__(position, batch_size)
        self._unacked[position] = unacked
        self.unacked_messages += unacked
        if hash_value is not None:
            self._hashes[position] = hash_value
            self.hash_counts[hash_value] = self.hash_counts.get(hash_value, 0) + 1

    def unacked_of(self, position: Position) -> int:
        """The messages of a pending entry not yet acknowledged (0: not pending)."""
        return self._unacked.get(position, 0)

    def hash_of(self, position: Position) -> int | None:
        """The key hash of a pending Key_Shared entry (None: not pending, or not Key_Shared)."""
        return self._hashes.get(position)

    def __setitem__(self, position: Position, batch_size: int) -> None:
        self.add(position, batch_size, batch_size)

    def __delitem__(self, position: Position) -> None:
        super().__delitem__(position)
        self._forget(position)

    def pop(self, position: Position, *default: int | None) -> int | None:  # type: ignore[override]
        batch_size = super().pop(position, *default)
        self._forget(position)
        return batch_size

    def clear(self) -> None:
        super().clear()
        self._unacked.clear()
        self.unacked_messages = 0
        self._hashes.clear()
        self.hash_counts.clear()

    def _forget(self, position: Position, *, release: bool = True) -> None:
        self.unacked_messages -= self._unacked.pop(position, 0)
        hash_value = self._hashes.pop(position, None)
        if hash_value is None:
            return
        left = self.hash_counts[hash_value] - 1
        if left:
            self.hash_counts[hash_value] = left
            return
        del self.hash_counts[hash_value]
        if release and self.on_released is not None:
            self.on_released(hash_value)

    def lower_unacked(self, position: Position, unacked: int) -> None:
        """Some messages of the batch at `position` were acknowledged (or reserved by a
        transaction): `unacked` of them are left."""
        current = self._unacked.get(position)
        if current is not None and unacked < current:
            self._unacked[position] = max(unacked, 0)
            self.unacked_messages -= current - max(unacked, 0)


_ids = itertools.count()
NO_CONSUMER_EPOCH = -1          # the client gave none (Pulsar's DEFAULT_CONSUMER_EPOCH)


class Consumer:
    def __init__(self, sink: ConsumerSink, *, name: str | None = None, consumer_id: int | None = None,
                 priority: int = 0, sticky_ranges: list[tuple[int, int]] | None = None,
                 allow_out_of_order_delivery: bool = False, consumer_epoch: int = NO_CONSUMER_EPOCH) -> None:
        self.consumer_id = next(_ids) if consumer_id is None else consumer_id
        self.name = name or f"consumer-{self.consumer_id}"
        self.sink = sink
        self.priority = priority
        self.permits = 0
        self.sticky_ranges = sticky_ranges          # Key_Shared STICKY mode hash ranges
        # Key_Shared: the consumer's KeySharedMeta.allowOutOfOrderDelivery (a subscription's
        # consumers all share its first consumer's)
        self.allow_out_of_order_delivery = allow_out_of_order_delivery
        self.pending = PendingAcks()                # delivered, unacknowledged: position -> batch size
        # Shared/Key_Shared: the consumer reached its unacked-messages limit and gets nothing
        # more until acknowledgements bring it down to half the limit (Pulsar's rule).
        self.blocked_on_unacked = False
        # False while its sink cannot take more now (a network consumer's connection has a full
        # write buffer): nothing more is dispatched to it until it can, as Pulsar dispatches
        # only to a writable channel. Its sink tells the dispatcher when it can again.
        self.writable = True
        self.active = False
        self.connected = True
        self.auto_consume_schema = False            # subscribed with AUTO_CONSUME: takes the topic's schema
        self.rate_out = RateCounter()               # delivered to it (Pulsar's msgRateOut, msgOutCounter)
        self.rate_redeliver = RateCounter()         # messages it asked to have again (msgRateRedeliver)
        # PIP-84: the client's epoch, from its SUBSCRIBE and raised by its redelivery requests;
        # stamped on Exclusive/Failover messages, so that the client drops those it receives
        # from before its last redelivery request.
        self.consumer_epoch = consumer_epoch
        # Exclusive/Failover: the furthest entry sent to it, and where the copies it was sent
        # went stale: the subscription gave back an ended transaction's messages when it had
        # been sent later ones, or handed what it held over to another consumer (see
        # `Subscription._check_cumulative_txn_ack_of`); cleared by its redeliver-all.
        self.last_delivered: Position | None = None
        self.stale_from: Position | None = None

    def stale_since(self, position: Position) -> None:
        """What it was sent from `position` on is stale (see `stale_from`)."""
        if self.stale_from is None or position < self.stale_from:
            self.stale_from = position

    def __repr__(self) -> str:
        return f"Consumer({self.name!r}, permits={self.permits}, pending={len(self.pending)})"

    def advance_epoch(self, epoch: int) -> None:
        """A redelivery request's epoch: kept when newer (Pulsar's single-active dispatcher)."""
        if epoch > self.consumer_epoch:
            self.consumer_epoch = epoch

    @property
    def unacked_messages(self) -> int:
        """Messages delivered and not yet acknowledged (Pulsar's unackedMessages)."""
        return self.pending.unacked_messages
