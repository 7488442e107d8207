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
from dataclasses import dataclass
from typing import Protocol

from pyengine.storage.entry import Entry
from pyengine_kernels import Position


@dataclass(slots=True)
class Delivery:
    """One entry sent to a consumer."""

    entry: Entry
    redelivery_count: int = 0
    ack_set: list[int] | None = None     # batch indexes already acknowledged are clear bits


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
    Every way an entry leaves (`pop`, `del`, `clear`) gives its messages back."""

    def __init__(self) -> None:
        super().__init__()
        self._unacked: dict[Position, int] = {}
        self.unacked_messages = 0

    def add(self, position: Position, batch_size: int, unacked: int) -> None:
        self.pop(position, None)            # delivered again to the same consumer: counted once
        super().__setitem__(position, batch_size)
        self._unacked[position] = unacked
        self.unacked_messages += unacked

    def __setitem__(self, position: Position, batch_size: int) -> None:
        self.add(position, batch_size, batch_size)

    def __delitem__(self, position: Position) -> None:
        super().__delitem__(position)
        self.unacked_messages -= self._unacked.pop(position, 0)

    def pop(self, position: Position, *default: int | None) -> int | None:  # type: ignore[override]
        self.unacked_messages -= self._unacked.pop(position, 0)
        return super().pop(position, *default)

    def clear(self) -> None:
        super().clear()
        self._unacked.clear()
        self.unacked_messages = 0

    def lower_unacked(self, position: Position, unacked: int) -> None:
        """Some messages of the batch at `position` were acknowledged (or reserved by a
        transaction): `unacked` of them are left."""
        current = self._unacked.get(position)
        if current is not None and unacked < current:
            self._unacked[position] = max(unacked, 0)
            self.unacked_messages -= current - max(unacked, 0)


_ids = itertools.count()


class Consumer:
    def __init__(self, sink: ConsumerSink, *, name: str | None = None, consumer_id: int | None = None,
                 priority: int = 0, sticky_ranges: list[tuple[int, int]] | None = None) -> None:
        self.consumer_id = next(_ids) if consumer_id is None else consumer_id
        self.name = name or f"consumer-{self.consumer_id}"
        self.sink = sink
        self.priority = priority
        self.permits = 0
        self.sticky_ranges = sticky_ranges          # Key_Shared STICKY mode hash ranges
        self.pending = PendingAcks()                # delivered, unacknowledged: position -> batch size
        # Shared/Key_Shared: the consumer reached its unacked-messages limit and gets nothing
        # more until acknowledgements bring it down to half the limit (Pulsar's rule).
        self.blocked_on_unacked = False
        self.active = False
        self.connected = True
        self.auto_consume_schema = False            # subscribed with AUTO_CONSUME: takes the topic's schema

    def __repr__(self) -> str:
        return f"Consumer({self.name!r}, permits={self.permits}, pending={len(self.pending)})"

    @property
    def unacked_messages(self) -> int:
        """Messages delivered and not yet acknowledged (Pulsar's unackedMessages)."""
        return self.pending.unacked_messages
