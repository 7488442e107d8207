"""SubscriptionCoordinator: which consumer of a subscription reads which active segment.

Round robin as the spec: active segments sorted by the start of their hash range, consumers
sorted by name, segment i to consumer i mod n. Used for StreamConsumer and CheckpointConsumer
(QueueConsumers attach to every segment and never register).

Ordering across splits and merges: a child segment is not handed out while one of its sealed
ancestors still has a backlog on this subscription. The ancestor is assigned in its place (to
the consumer the child would go to), and the coordinator re-checks the backlogs every
DRAIN_POLL seconds until they are drained; only then do the children go out. So every message of
a key in a parent is delivered (and acknowledged) before any of its messages in a child.

A registration is a persistent session (spec, Consumer Session Lifecycle): the consumer's name
and assignment are written to the metadata store when they change; whether it is connected and
its grace-period timer live only in the leader's memory. A consumer that disconnects keeps its
segments for `grace_period` seconds; reconnecting under the same name within it resumes the
same assignment without a rebalance; when the timer fires it is evicted and the others take its
segments. A new leader loads the registrations and gives every consumer a fresh grace period.

Fencing. Every write of a record is a compare-and-set on the version (and mod revision) this
coordinator read or wrote, and a new leader's restore rewrites every record it loads (a claim).
A deposed leader that has not noticed yet (a paused process: its grace timers and rebalances
still run) then has its writes refused instead of evicting the new leader's sessions or pushing
an assignment of the same layout epoch as the new leader's. Every write is also guarded by the
controller's election record (`leadership`, resources.py), which refuses what no version can: a
deposed leader creating the record of a consumer new to it. A refused write closes the
coordinator and calls `on_conflict` (the controller steps down); the error it returns is raised.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pyengine.errors import ConsumerBusyError, PulsarError, ServiceNotReadyError
from pyengine.metadata import BadVersionError
from pyengine.naming import TopicName
from pyengine.scalable.layout import HashRange, SegmentLayout
from pyengine.scalable.resources import ConsumerRecord, LeaderGuard, ScalableTopicResources
from pyengine.scalable.segments import SegmentOperations

log = logging.getLogger(__name__)

DRAIN_POLL = 0.1        # seconds between backlog checks of sealed segments holding children back


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


# Told each new assignment of its consumer; an error once this controller no longer serves the
# registration: SubscriptionNotFoundError (the subscription was deleted: the consumer stops
# reading) or NotLeaderError (leadership moved: the consumer registers with the new leader).
AssignmentListener = Callable[[ConsumerAssignment | PulsarError], None]
# Whether a registration's connection still answers (a PING); one that does not is closed.
LivenessCheck = Callable[[], Awaitable[bool]]
# A write of a consumer record was refused (another leader wrote it): the coordinator's owner
# stops acting on its records; returns the error to raise.
ConflictHandler = Callable[[], BaseException]
# The guard of the coordinator's writes, asked at each write: its controller's election record
# (GuardFailedError when the controller no longer leads).
Leadership = Callable[[], LeaderGuard]


@dataclass
class ConsumerRegistration:
    consumer_name: str
    consumer_id: int = -1
    on_assignment: AssignmentListener | None = None     # pushes assignment updates to the consumer
    record: ConsumerRecord = field(default_factory=lambda: ConsumerRecord(""))
    connected: bool = False
    grace_timer: asyncio.TimerHandle | None = None
    alive: LivenessCheck | None = None          # of the connection it is connected on


def _superseded(registration: ConsumerRegistration, on_assignment: AssignmentListener | None) -> bool:
    """Whether a request about `on_assignment`'s registration comes too late: the consumer
    registered again since with another listener (None: the caller does not say)."""
    return on_assignment is not None and registration.on_assignment is not on_assignment


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
                 layout: SegmentLayout, grace_period: float, segments: SegmentOperations | None = None,
                 on_conflict: ConflictHandler | None = None, leadership: Leadership | None = None) -> None:
        self.topic = topic
        self.on_conflict = on_conflict
        self.leadership = leadership
        self.segments = segments
        self._drain_task: asyncio.Task | None = None
        self.subscription = subscription
        self.resources = resources
        self.layout = layout
        self.grace_period = grace_period
        self.consumers: dict[str, ConsumerRegistration] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self._unregistered: PulsarError | None = None      # what unregister_all told the consumers
        self._drained: set[int] = set()     # sealed segments found drained on this subscription

    async def restore(self) -> None:
        """Load the persisted registrations (a new leader): all disconnected, fresh timers.
        Always recomputed (unchanged records are not rewritten): records of one layout epoch
        may still disagree — a rebalance the old leader stored half of, or a parent held back
        for children whose drain only a rebalance re-checks — so a matching epoch proves nothing."""
        for record in await self.resources.consumers(self.topic, self.subscription):
            registration = ConsumerRegistration(record.consumer_name, record=record)
            self.consumers[record.consumer_name] = registration
            self._start_grace(registration)
        # the claim: each record rewritten as read, so that the previous leader's writes, held
        # at the versions it knew, are refused from now on (raises once one changed since read)
        for registration in list(self.consumers.values()):
            await self._save(registration.record)
        if self.consumers:
            try:
                await self._rebalance()
            except Exception as error:
                if self._closed:
                    raise                       # a refused write: not ours to recompute
                # e.g. a segment's broker is down: the stored assignments stand meanwhile, and
                # the take-over must not fail for it (the drain watch retries)
                log.warning("recomputing the assignments of %s/%s failed (retrying): %s",
                            self.topic, self.subscription, error)
                self._watch_drain_soon()

    def assignment_of(self, consumer_name: str) -> ConsumerAssignment:
        record = self.consumers[consumer_name].record
        segments = []
        for sid in record.segment_ids:
            info = self.layout.all_segments.get(sid)
            if info is not None:
                segments.append(AssignedSegment(sid, info.hash_range, info.topic_name(self.topic)))
        return ConsumerAssignment(record.layout_epoch, tuple(segments))

    async def add_consumer(self, consumer_name: str, consumer_id: int = -1,
                           on_assignment: AssignmentListener | None = None,
                           alive: LivenessCheck | None = None) -> ConsumerAssignment:
        """Register the consumer, or resume its session. While the session is connected on
        another connection that still answers, the name is taken (ConsumerBusy, as Apache's
        exclusive consumers); a connection that stays silent is closed and the session moves
        here, as a restarted process's reconnect finds it. `alive`: the check of this
        registration's own connection, for whoever comes next."""
        await self._refuse_while_held(consumer_name, on_assignment)
        async with self._lock:
            registration = self.consumers.get(consumer_name)
            if registration is not None:            # a reconnect: same session, same segments
                if registration.connected and registration.on_assignment is not on_assignment \
                        and registration.alive is not None:
                    raise ConsumerBusyError(f"consumer {consumer_name!r} of subscription {self.subscription!r} "
                                            f"registered again meanwhile")
                self._cancel_grace(registration)
                registration.connected = True
                registration.consumer_id = consumer_id
                registration.on_assignment = on_assignment
                registration.alive = alive
                return self.assignment_of(consumer_name)
            registration = ConsumerRegistration(consumer_name, consumer_id, on_assignment,
                                                ConsumerRecord(consumer_name), connected=True, alive=alive)
            self.consumers[consumer_name] = registration
            try:
                await self._rebalance(quiet={consumer_name})
                self._check_open()          # closed while its record was written: unregistered
            except BaseException:
                # Refused: the caller forgets the consumer, so no disconnect will ever start
                # its grace period. Left registered, it would keep segments nobody reads.
                await self._withdraw(registration)
                raise
            return self.assignment_of(consumer_name)

    async def _refuse_while_held(self, consumer_name: str, on_assignment: AssignmentListener | None) -> None:
        """ConsumerBusy while another connection holds `consumer_name` and answers; a silent
        one is closed by its check and the session moves to the caller (the closed
        connection's late disconnect is then superseded, see `disconnect`).
        Before, a second registration took the session over at once: refused by the segments
        its first holder still read, it then unregistered the session, and the first holder,
        never told, stopped following the layout."""
        registration = self.consumers.get(consumer_name)
        if registration is None or not registration.connected or registration.alive is None \
                or registration.on_assignment is on_assignment:
            return
        if await registration.alive():
            raise ConsumerBusyError(f"consumer {consumer_name!r} of subscription {self.subscription!r} is "
                                    f"connected on another connection")
        registration.alive = None               # closed: the session may move

    async def _withdraw(self, registration: ConsumerRegistration) -> None:
        """Undo a registration whose first rebalance failed (best effort: what cannot be undone
        now, a grace period evicts)."""
        if self.consumers.get(registration.consumer_name) is registration:
            del self.consumers[registration.consumer_name]
        try:
            await self._delete(registration)
            if not self._closed:
                await self._rebalance()         # the others take its segments back
        except Exception:
            log.exception("undoing the registration of consumer %s of %s/%s failed", registration.consumer_name,
                          self.topic, self.subscription)
            if registration.record.version is not None and registration.consumer_name not in self.consumers \
                    and not self._closed:
                # its record stayed: keep it as a disconnected session, evicted after the grace period
                registration.connected, registration.on_assignment = False, None
                self.consumers[registration.consumer_name] = registration
                self._start_grace(registration)

    def disconnect(self, consumer_name: str, on_assignment: AssignmentListener | None = None) -> None:
        """The consumer's connection dropped: keep its session for the grace period.
        `on_assignment`: the listener that connection registered with; if the consumer has
        registered again since (a reconnect on another connection, whose old one closes only
        now), this is not its connection and nothing changes."""
        registration = self.consumers.get(consumer_name)
        if registration is not None and registration.connected \
                and not _superseded(registration, on_assignment):
            registration.connected = False
            registration.on_assignment = None
            registration.alive = None
            self._start_grace(registration)

    async def remove_consumer(self, consumer_name: str, on_assignment: AssignmentListener | None = None) -> None:
        """Unregister the consumer (`on_assignment`: as in `disconnect`, a registration made
        since on another connection is not removed)."""
        async with self._lock:
            registration = self.consumers.get(consumer_name)
            if registration is not None and not _superseded(registration, on_assignment):
                await self._remove(consumer_name)

    async def _remove(self, consumer_name: str) -> None:
        registration = self.consumers.pop(consumer_name, None)
        if registration is None:
            return
        self._cancel_grace(registration)
        try:
            await self._delete(registration)
        except Exception:
            if consumer_name not in self.consumers and not self._closed:
                # its record stayed: so does its session (disconnected), evicted again after the
                # grace period. Forgotten here, its segments would be read by no one, and its
                # name registering again would be refused by the record (a step-down).
                registration.connected, registration.on_assignment, registration.alive = False, None, None
                self.consumers[consumer_name] = registration
                self._start_grace(registration)
            raise
        await self._rebalance()

    async def on_layout_change(self, layout: SegmentLayout) -> None:
        async with self._lock:
            self.layout = layout
            await self._rebalance()

    def unregister_all(self, error: PulsarError) -> None:
        """Tell every connected consumer that this controller no longer serves its registration
        (`error`: the subscription is being deleted, told before its segments' subscriptions go,
        or a consumer would subscribe to them again and read them from the start; or leadership
        moved), and forget them all here."""
        for name, registration in list(self.consumers.items()):
            self._cancel_grace(registration)
            listener, registration.on_assignment = registration.on_assignment, None
            if listener is not None:
                try:
                    listener(error)
                except Exception:
                    log.exception("telling consumer %s that it is unregistered failed", name)
        self.consumers.clear()
        self._unregistered = error

    def close(self) -> None:
        """Drop the in-memory keep-alive state (leadership lost or topic released)."""
        self._closed = True
        if self._drain_task is not None:
            self._drain_task.cancel()
        for registration in self.consumers.values():
            self._cancel_grace(registration)

    async def settled(self) -> None:
        """Once closed: until the work under way (a registration, an eviction, a rebalance) has
        ended. It writes nothing more after the close, and what it was writing has landed: a
        deletion of the records that follows is not overtaken by one of them."""
        async with self._lock:
            pass

    def _check_open(self) -> None:
        """After a wait, before a write: a coordinator closed meanwhile (its subscription being
        deleted, its leadership lost) writes nothing more; its caller gets what the consumers
        were told."""
        if self._closed:
            raise self._unregistered or ServiceNotReadyError(
                f"the consumer sessions of {self.topic}/{self.subscription} are no longer served here")

    # --- internals ------------------------------------------------------------------------

    async def _backlog(self, segment_id: int) -> int:
        assert self.segments is not None
        stats = await self.segments.stats(self.layout.segment(segment_id).topic_name(self.topic))
        return stats.get("subscriptions", {}).get(self.subscription, {}).get("msgBacklog", 0)

    async def _gate(self, plan: dict[str, list[int]]) -> tuple[dict[str, list[int]], bool]:
        """`plan` with each child whose sealed ancestors are not drained replaced by those
        ancestors (each given once); and whether anything is held back."""
        drained: dict[int, bool] = {}
        given: set[int] = set()
        held = False

        async def undrained_ancestors(sid: int) -> list[int]:
            out: list[int] = []
            for parent in self.layout.parents(sid):
                pid = parent.segment_id
                if pid not in drained:
                    drained[pid] = pid in self._drained or await self._backlog(pid) == 0
                    if drained[pid]:
                        # a parent is sealed: nothing is written to it any more, so drained it
                        # stays. Not asked again: its broker, once down, held up every rebalance
                        # (a consumer joining, a split's notify) for good
                        self._drained.add(pid)
                ancestors = await undrained_ancestors(pid)
                out.extend(ancestors)
                if not drained[pid] and not ancestors:
                    out.append(pid)
            return out

        gated: dict[str, list[int]] = {}
        for name, segment_ids in plan.items():
            gated[name] = []
            for sid in segment_ids:
                blocking = await undrained_ancestors(sid)
                if not blocking:
                    gated[name].append(sid)
                    continue
                held = True
                for ancestor in blocking:
                    if ancestor not in given:
                        given.add(ancestor)
                        gated[name].append(ancestor)
        return gated, held

    def _watch_drain_soon(self) -> None:
        if self._drain_task is None and not self._closed:
            self._drain_task = asyncio.get_running_loop().create_task(self._watch_drain())

    async def _watch_drain(self) -> None:
        """Rebalance every DRAIN_POLL s while children are held back, or once a rebalance
        failed. A failure (a segment's broker down, the store unreachable) is retried, backing
        off: given up, the children would stay held back, or segments with no consumer."""
        delay = DRAIN_POLL
        try:
            while not self._closed:
                await asyncio.sleep(delay)
                try:
                    async with self._lock:
                        if not await self._rebalance():
                            return
                    delay = DRAIN_POLL
                except Exception as error:
                    delay = min(delay * 2, 5.0)
                    log.warning("watching the drain of %s/%s failed (again in %.1f s): %s",
                                self.topic, self.subscription, delay, error)
        finally:
            if self._drain_task is asyncio.current_task():
                self._drain_task = None

    async def _rebalance(self, quiet: set[str] = frozenset()) -> bool:
        """Recompute, persist the changed registrations, push to the affected consumers
        (not to `quiet` ones, which get theirs as a return value). True while children are
        held back behind undrained parents (a task re-checks them)."""
        try:
            return await self._apply(quiet)
        except Exception:
            # retried (as a drain): the changes that caused it (a consumer removed, a layout
            # change) are already made, and nothing else may come to hand their segments out
            self._watch_drain_soon()
            raise

    async def _apply(self, quiet: set[str]) -> bool:
        plan = round_robin(self.layout, list(self.consumers))
        held = False
        if self.segments is not None and plan:
            plan, held = await self._gate(plan)
        if held:
            self._watch_drain_soon()
        # Revokes before grants: every consumer giving a segment up is stored (and told) with
        # what it keeps before any consumer is given one, so a write failing part-way leaves a
        # segment to no one until the retry, never to two consumers at once.
        for name, segment_ids in plan.items():
            self._check_open()
            held_now = self.consumers[name].record.segment_ids
            if any(sid not in segment_ids for sid in held_now):
                await self._assign(name, [sid for sid in segment_ids if sid in held_now], quiet)
        for name, segment_ids in plan.items():
            self._check_open()
            await self._assign(name, segment_ids, quiet)
        return held

    async def _assign(self, name: str, segment_ids: list[int], quiet: set[str]) -> None:
        """Store `segment_ids` as consumer `name`'s assignment (at the layout's epoch) and push
        it, unless stored already."""
        registration = self.consumers[name]
        record = registration.record
        if record.segment_ids == segment_ids and record.layout_epoch == self.layout.epoch \
                and record.version is not None:
            return
        previous = record.segment_ids, record.layout_epoch
        record.segment_ids, record.layout_epoch = segment_ids, self.layout.epoch
        try:
            await self._save(record)
        except BaseException:
            # not stored: the next rebalance must see the difference and store it
            record.segment_ids, record.layout_epoch = previous
            raise
        if registration.on_assignment is not None and name not in quiet:
            try:
                registration.on_assignment(self.assignment_of(name))
            except Exception:
                log.exception("pushing an assignment to consumer %s failed", name)

    def _guard(self) -> LeaderGuard | None:
        return self.leadership() if self.leadership is not None else None

    async def _save(self, record: ConsumerRecord) -> None:
        self._check_open()
        try:
            await self.resources.save_consumer(self.topic, self.subscription, record, guard=self._guard())
        except BadVersionError as error:            # GuardFailedError too: we were deposed
            raise self._refused(record.consumer_name, error) from error

    async def _delete(self, registration: ConsumerRegistration) -> None:
        try:
            await self.resources.delete_consumer(self.topic, self.subscription, registration.record,
                                                 guard=self._guard())
        except BadVersionError as error:
            raise self._refused(registration.consumer_name, error) from error

    def _refused(self, consumer_name: str, error: BadVersionError) -> BaseException:
        """Another leader wrote the record since we read or wrote it: this coordinator stops
        (no more writes, timers or pushes) and its owner steps down; the error to raise."""
        if self._closed:
            return error
        log.warning("the record of consumer %s of %s/%s was written by another leader: stopping (%s)",
                    consumer_name, self.topic, self.subscription, error)
        self.close()
        return self.on_conflict() if self.on_conflict is not None else error

    def _start_grace(self, registration: ConsumerRegistration) -> None:
        self._cancel_grace(registration)
        loop = asyncio.get_running_loop()
        registration.grace_timer = loop.call_later(self.grace_period, self._spawn_eviction, registration)

    def _spawn_eviction(self, registration: ConsumerRegistration) -> None:
        task = asyncio.get_running_loop().create_task(self._grace_expired(registration, registration.grace_timer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    def _cancel_grace(registration: ConsumerRegistration) -> None:
        if registration.grace_timer is not None:
            registration.grace_timer.cancel()
            registration.grace_timer = None

    async def _grace_expired(self, registration: ConsumerRegistration, timer: asyncio.TimerHandle | None) -> None:
        """The grace timer `timer` of `registration` fired. Checked again once the coordinator
        is free: a reconnect (or a disconnect starting a new timer) may have been served
        while this eviction waited for it, and then the session stays."""
        if self._closed:
            return
        consumer_name = registration.consumer_name
        try:
            async with self._lock:
                if self._closed or self.consumers.get(consumer_name) is not registration \
                        or registration.connected or registration.grace_timer is not timer:
                    return
                log.info("consumer %s of %s/%s did not come back within %.1fs: evicted",
                         consumer_name, self.topic, self.subscription, self.grace_period)
                await self._remove(consumer_name)
        except Exception:
            log.exception("evicting consumer %s failed", consumer_name)
