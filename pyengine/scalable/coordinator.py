"""SubscriptionCoordinator: which consumer of a subscription reads which active segment.

Round robin as the spec: active segments sorted by the start of their hash range, consumers
sorted by name, segment i to consumer i mod n. Used for StreamConsumer and CheckpointConsumer
(QueueConsumers attach to every segment and never register).

A registration is a persistent session (spec, Consumer Session Lifecycle): the consumer's name
and assignment are written to the metadata store when they change; whether it is connected and
its grace-period timer live only in the leader's memory. A consumer that disconnects keeps its
segments for `grace_period` seconds; reconnecting under the same name within it resumes the
same assignment without a rebalance; when the timer fires it is evicted and the others take its
segments. A new leader loads the registrations and gives every consumer a fresh grace period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pyengine.naming import TopicName
from pyengine.scalable.layout import HashRange, SegmentLayout
from pyengine.scalable.resources import ConsumerRecord, ScalableTopicResources

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AssignedSegment:
    segment_id: int
    hash_range: HashRange
    topic: str                    # the segment:// topic to consume

    def to_json(self) -> dict:
        return {"segmentId": self.segment_id, "hashRange": self.hash_range.to_json(),
                "underlyingTopicName": self.topic}


@dataclass(frozen=True)
class ConsumerAssignment:
    layout_epoch: int
    assigned_segments: tuple[AssignedSegment, ...]

    @property
    def segment_ids(self) -> list[int]:
        return [s.segment_id for s in self.assigned_segments]

    def to_json(self) -> dict:
        return {"layoutEpoch": self.layout_epoch, "assignedSegments": [s.to_json() for s in self.assigned_segments]}


AssignmentListener = Callable[[ConsumerAssignment], None]


@dataclass
class ConsumerRegistration:
    consumer_name: str
    consumer_id: int = -1
    on_assignment: AssignmentListener | None = None     # pushes assignment updates to the consumer
    record: ConsumerRecord = field(default_factory=lambda: ConsumerRecord(""))
    connected: bool = False
    grace_timer: asyncio.TimerHandle | None = None


def round_robin(layout: SegmentLayout, consumer_names: list[str]) -> dict[str, list[int]]:
    """Segment ids per consumer name: the spec's rebalancing algorithm."""
    names = sorted(consumer_names)
    out: dict[str, list[int]] = {name: [] for name in names}
    if names:
        for i, segment in enumerate(layout.active_segments):
            out[names[i % len(names)]].append(segment.segment_id)
    return out


class SubscriptionCoordinator:
    def __init__(self, topic: TopicName, subscription: str, resources: ScalableTopicResources,
                 layout: SegmentLayout, grace_period: float) -> None:
        self.topic = topic
        self.subscription = subscription
        self.resources = resources
        self.layout = layout
        self.grace_period = grace_period
        self.consumers: dict[str, ConsumerRegistration] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    async def restore(self) -> None:
        """Load the persisted registrations (a new leader): all disconnected, fresh timers.
        Assignments computed against an older layout are recomputed now."""
        for record in await self.resources.consumers(self.topic, self.subscription):
            registration = ConsumerRegistration(record.consumer_name, record=record)
            self.consumers[record.consumer_name] = registration
            self._start_grace(registration)
        if any(r.record.layout_epoch != self.layout.epoch for r in self.consumers.values()):
            await self._rebalance()

    def assignment_of(self, consumer_name: str) -> ConsumerAssignment:
        record = self.consumers[consumer_name].record
        segments = []
        for sid in record.segment_ids:
            info = self.layout.all_segments.get(sid)
            if info is not None:
                segments.append(AssignedSegment(sid, info.hash_range, info.topic_name(self.topic)))
        return ConsumerAssignment(record.layout_epoch, tuple(segments))

    async def add_consumer(self, consumer_name: str, consumer_id: int = -1,
                           on_assignment: AssignmentListener | None = None) -> ConsumerAssignment:
        async with self._lock:
            registration = self.consumers.get(consumer_name)
            if registration is not None:            # a reconnect: same session, same segments
                self._cancel_grace(registration)
                registration.connected = True
                registration.consumer_id = consumer_id
                registration.on_assignment = on_assignment
                return self.assignment_of(consumer_name)
            registration = ConsumerRegistration(consumer_name, consumer_id, on_assignment,
                                                ConsumerRecord(consumer_name), connected=True)
            self.consumers[consumer_name] = registration
            await self._rebalance(quiet={consumer_name})
            return self.assignment_of(consumer_name)

    def disconnect(self, consumer_name: str) -> None:
        """The consumer's connection dropped: keep its session for the grace period."""
        registration = self.consumers.get(consumer_name)
        if registration is not None and registration.connected:
            registration.connected = False
            registration.on_assignment = None
            self._start_grace(registration)

    async def remove_consumer(self, consumer_name: str) -> None:
        async with self._lock:
            registration = self.consumers.pop(consumer_name, None)
            if registration is None:
                return
            self._cancel_grace(registration)
            await self.resources.delete_consumer(self.topic, self.subscription, consumer_name)
            await self._rebalance()

    async def on_layout_change(self, layout: SegmentLayout) -> None:
        async with self._lock:
            self.layout = layout
            await self._rebalance()

    def close(self) -> None:
        """Drop the in-memory keep-alive state (leadership lost or topic released)."""
        self._closed = True
        for registration in self.consumers.values():
            self._cancel_grace(registration)

    # --- internals ------------------------------------------------------------------------

    async def _rebalance(self, quiet: set[str] = frozenset()) -> None:
        """Recompute, persist the changed registrations, push to the affected consumers
        (not to `quiet` ones, which get theirs as a return value)."""
        plan = round_robin(self.layout, list(self.consumers))
        for name, segment_ids in plan.items():
            registration = self.consumers[name]
            record = registration.record
            if record.segment_ids == segment_ids and record.layout_epoch == self.layout.epoch \
                    and record.version is not None:
                continue
            record.segment_ids, record.layout_epoch = segment_ids, self.layout.epoch
            await self.resources.save_consumer(self.topic, self.subscription, record)
            if registration.on_assignment is not None and name not in quiet:
                try:
                    registration.on_assignment(self.assignment_of(name))
                except Exception:
                    log.exception("pushing an assignment to consumer %s failed", name)

    def _start_grace(self, registration: ConsumerRegistration) -> None:
        self._cancel_grace(registration)
        loop = asyncio.get_running_loop()
        registration.grace_timer = loop.call_later(self.grace_period, self._spawn_eviction, registration.consumer_name)

    def _spawn_eviction(self, consumer_name: str) -> None:
        task = asyncio.get_running_loop().create_task(self._grace_expired(consumer_name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    def _cancel_grace(registration: ConsumerRegistration) -> None:
        if registration.grace_timer is not None:
            registration.grace_timer.cancel()
            registration.grace_timer = None

    async def _grace_expired(self, consumer_name: str) -> None:
        if self._closed:
            return
        registration = self.consumers.get(consumer_name)
        if registration is None or registration.connected:
            return
        log.info("consumer %s of %s/%s did not come back within %.1fs: evicted",
                 consumer_name, self.topic, self.subscription, self.grace_period)
        try:
            await self.remove_consumer(consumer_name)
        except Exception:
            log.exception("evicting consumer %s failed", consumer_name)
