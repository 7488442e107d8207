"""A consumer as the broker sees it: where a subscription's dispatcher sends messages.

The transport is a `ConsumerSink`: the embedded client's in-process queue, or a network
connection sending MESSAGE frames. The broker-side `Consumer` keeps what Pulsar keeps per
consumer: its permits (how many more messages it asked for) and its pending acknowledgements
(entries delivered and not yet acknowledged), which go back to the subscription for
redelivery when the consumer leaves.
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
        self.pending: dict[Position, int] = {}      # delivered, unacknowledged: position -> batch size
        self.active = False
        self.connected = True
        self.auto_consume_schema = False            # subscribed with AUTO_CONSUME: takes the topic's schema

    def __repr__(self) -> str:
        return f"Consumer({self.name!r}, permits={self.permits}, pending={len(self.pending)})"
