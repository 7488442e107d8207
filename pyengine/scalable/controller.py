"""ScalableTopicController: the per-topic coordinator, leader-elected through the metadata store.

Only the leader splits, merges, creates or deletes subscriptions and registers consumers;
every other instance refuses with `NotLeaderError` and serves reads (`layout`).

Split and merge run the spec's steps in its order — (1) discover the parents' subscriptions,
(2) create the child segment topics with those subscriptions at Earliest, (3) terminate the
parents, (4) CAS the layout, (5) notify the subscription coordinators — preceded by one record
of ours, the *operation* (resources.py), written before step 1 and cleared after step 5. It
holds the target layout, computed once, and a phase. A leader that takes over finds it and:

* the layout already has the target epoch (crash after the CAS): notifies, clears the record;
* the phase is *sealing* (or, for a record without phases, a parent is terminated): completes —
  creating and terminating are idempotent, and a terminated parent can only go forward
  (producers are waiting for the children; nothing can be written to the parent any more);
* otherwise: rolls back — deletes the child topics (empty: no producer can know them before the
  CAS) and clears the record; the parents never stopped taking messages.

Either way no message is lost: the parents keep every message they accepted, and a child is
visible to clients only after it has every subscription's cursor.

Fencing. A deposed leader (its session expired during a pause) may still have a step on its way
— a terminate already sent lands whenever it lands, and no check of ours can stop it. So the
rule is about *sending*: no terminate is sent unless the leader first moved the record to the
sealing phase with a compare-and-set on the version it holds ("seal" step), and a rollback
starts by claiming the record the same way (phase *rolling-back*). The store orders the two
writes: if the seal came first, the new leader sees it and completes (a late terminate is then
a repeat); if the claim came first, the deposed leader's seal fails and it sends no terminate.
A terminate can therefore land late only for an operation that is completed, never for one
rolled back. Every write of the record, its clearing included, is conditional on the writer's
version, so a deposed leader never clears (nor advances) a record a newer leader claimed or
wrote for another operation. Creating and deleting child segments is fenced at the segment's
broker instead (segments.py): it creates a child only while the record (or the layout) keeps it
and deletes one only while neither does, so a late create or delete of a deposed leader is
refused once the new leader claimed the operation or began the next one. A create also carries
the incarnation of the operation's layout (layout.py): refused for good once the topic is
deleted, even when a topic of the same name (and segment ids) is created again.

Consumer records are fenced the same way (coordinator.py): each write is a compare-and-set, and
a take-over rewrites every record it restores. A compare-and-set cannot refuse what has no
version yet — a deposed leader creating the record of a consumer or subscription new to it, or
starting an operation over the cleared record it just read — so every write of the leader is
also guarded by its election record, as etcd's elections fence a leader: the store writes only
while that record is still the one the leader won with (its mod revision), in the same atomic
write. A leader whose write is refused (deposed, or a deposed one wrote before its claim) steps
down: it drops its leader state — its consumers register again — and takes over anew, which
goes on only while the store still holds its election record (its local view of the election
may lag: a paused process). A take-over is all or nothing: the coordinators of one that fails
part-way are closed.

`fault` (tests): an async callable run after each step with the step's name, to inject crashes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager, contextmanager
from typing import AsyncIterator, Iterator

from pyengine.errors import NotAllowedError, PulsarError, ServiceNotReadyError, SubscriptionNotFoundError
from pyengine.metadata import BadVersionError, GuardFailedError, LeaderState, Session
from pyengine.naming import TopicName
from pyengine.scalable.coordinator import (AssignmentListener, ConsumerAssignment, LivenessCheck,
                                           SubscriptionCoordinator)
from pyengine.scalable.layout import LayoutError, SegmentLayout
from pyengine.scalable.resources import (
    ROLLING_BACK,
    SEALING,
    LeaderGuard,
    PendingOperation,
    ScalableTopicResources,
)
from pyengine.scalable.segments import SEGMENT_RATES, SegmentOperations

log = logging.getLogger(__name__)

STEPS = ("operation", "subscriptions", "create", "seal", "terminate", "cas", "notify")
Fault = Callable[[str], Awaitable[None]]


class NotLeaderError(NotAllowedError):
    """A mutation reached a controller that is not the leader (Pulsar: IllegalStateException)."""

    def __init__(self, topic: TopicName, leader_url: str | None) -> None:
        super().__init__(f"this broker is not the controller leader of {topic} "
                         f"(leader: {leader_url or 'none elected'})")
        self.leader_url = leader_url


class OperationTakenOverError(NotLeaderError):
    """The operation record changed under us: another leader claimed (or finished) it."""


class ScalableTopicController:
    def __init__(self, topic: TopicName, resources: ScalableTopicResources, segments: SegmentOperations,
                 broker_url: str, session: Session, *, grace_period: float = 30.0,
                 fault: Fault | None = None) -> None:
        if not topic.is_scalable:
            raise NotAllowedError(f"{topic} is not a topic:// name")
        self.topic = topic
        self.resources = resources
        self.segments = segments
        self.broker_url = broker_url
        self.grace_period = grace_period
        self.fault = fault
        self.layout: SegmentLayout | None = None
        self.version = -1
        self.subscriptions: dict[str, SubscriptionCoordinator] = {}
        self.election = resources.store.leader_election(resources.controller_path(topic), broker_url, session)
        self.layout_listeners: list[Callable[[SegmentLayout], None]] = []
        self._lock = asyncio.Lock()
        self._leading = False             # taken over: recovered and restored as leader
        self._takeover: asyncio.Task | None = None
        self._settling: asyncio.Task | None = None      # retrying a split or merge left pending
        self._closed = False
        self._store_leader: str | None = None     # the leader the store named when a take-over gave up

    # --- lifecycle --------------------------------------------------------------------------

    async def initialize(self) -> None:
        """Load the layout, stand for election; if elected, take over (recover, restore)."""
        self.layout, self.version = await self.resources.load(self.topic)
        self.election.add_listener(self._on_leader_state)
        await self.election.campaign()
        if self.election.is_leader:
            async with self._lock:
                await self._take_over()

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader and not self._closed

    @property
    def leader_url(self) -> str | None:
        return self.election.leader

    async def wait_leading(self, timeout: float | None = None) -> None:
        """Until this controller is the leader and has taken over; NotLeaderError once it is
        closed (released, or dropped with its metadata session): it will never lead."""
        async def wait() -> None:
            while not (self.is_leader and self._leading):
                if self._closed:
                    raise NotLeaderError(self.topic, self.leader_url)
                await asyncio.sleep(0.01)
            if self._takeover is not None and not self._takeover.done():
                # its last step, the subscription deletions a former leader left half done
                await asyncio.wait([self._takeover])
        await asyncio.wait_for(wait(), timeout)

    async def close(self, tell: PulsarError | None = None) -> None:
        """Release: resign the election, drop the in-memory consumer state, and tell the
        connected consumers `tell` (default: to register with the next leader)."""
        self._closed = True
        if self._takeover is not None:
            self._takeover.cancel()
        self._drop_leader_state(tell or NotLeaderError(self.topic, None))
        await self.election.resign()

    def abandon(self, *, tell: bool = False) -> None:
        """Stop without touching the store: a crashed broker (tests), or one whose metadata
        session ended (`tell`: its consumers, still connected, are sent to the next leader)."""
        self._closed = True
        if self._takeover is not None:
            self._takeover.cancel()
        self._drop_leader_state(NotLeaderError(self.topic, None) if tell else None)

    def _on_leader_state(self, state: LeaderState, leader: str | None) -> None:
        if self._closed:
            return
        if state is LeaderState.LEADING:
            if not self._leading and (self._takeover is None or self._takeover.done()):
                self._takeover = asyncio.get_running_loop().create_task(self._take_over_locked())
        elif self._leading:
            log.info("controller of %s: leadership lost (leader now %s)", self.topic, leader)
            # its consumers, still connected here, register again with the new leader (within
            # the grace period it gives the sessions it restores: they keep their segments)
            self._drop_leader_state(NotLeaderError(self.topic, leader))

    async def _take_over_locked(self) -> None:
        try:
            async with self._lock:
                await self._take_over()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("controller of %s: take-over failed", self.topic)

    async def _take_over(self) -> None:
        if self._leading or not self.is_leader:
            return
        if not await self._holds_election():
            return
        # a pending operation that cannot complete yet does not keep the new leader from
        # serving its consumers: it is retried in the background
        await self._settle(required=False)
        self.layout, self.version = await self.resources.load(self.topic)
        restored: dict[str, SubscriptionCoordinator] = {}
        states = await self.resources.subscription_states(self.topic)
        try:
            for name in sorted(name for name, deleting in states.items() if not deleting):
                restored[name] = self._coordinator(name)
                await restored[name].restore()
        except BaseException:
            # all or nothing: a retry restores them anew, and the grace timers of these must
            # not evict sessions the retry's coordinators serve
            for coordinator in restored.values():
                coordinator.close()
            raise
        if not self.is_leader:                  # lost meanwhile
            for coordinator in restored.values():
                coordinator.close()
            return
        self.subscriptions.update(restored)
        self._leading = True
        log.info("controller of %s: leading at epoch %d", self.topic, self.layout.epoch)
        for name in sorted(name for name, deleting in states.items() if deleting):
            try:
                await self._finish_deletion(name)
            except NotLeaderError:
                raise
            except Exception as error:      # the next delete or leader finishes it
                log.warning("controller of %s: the deletion of subscription %r cannot complete yet: %s",
                            self.topic, name, error)

    async def _holds_election(self) -> bool:
        """Whether the store's election record is ours, as we won it (the guard of our writes).
        The local view can lag the store: a process paused past its session's expiry still
        believes it leads while another does."""
        record = await self.resources.store.get(self.election.path)
        if record is not None and record.session_id == self.election.session.id \
                and record.mod_revision == self.election.leader_revision:
            self._store_leader = None
            return True
        self._store_leader = record.value.decode(errors="replace") if record is not None else None
        log.info("controller of %s: the election record is not ours (leader: %s): not taking over",
                 self.topic, self._store_leader)
        return False

    def _coordinator(self, subscription: str) -> SubscriptionCoordinator:
        assert self.layout is not None
        return SubscriptionCoordinator(self.topic, subscription, self.resources, self.layout, self.grace_period,
                                       self.segments, on_conflict=self._write_refused, leadership=self._leadership)

    def _leadership(self) -> LeaderGuard:
        """The guard of every write made as leader: our election record as we won it. Not
        leading (in our own view): GuardFailedError, as the store would refuse the write."""
        revision = self.election.leader_revision
        if revision is None:
            raise GuardFailedError(f"guard {self.election.path}: the controller of {self.topic} does not lead")
        return self.election.path, revision

    @contextmanager
    def _fenced(self) -> Iterator[LeaderGuard]:
        """Around a write of the controller's, given the guard: refused by the guard, we were
        deposed: step down (NotLeaderError)."""
        try:
            yield self._leadership()
        except GuardFailedError as error:
            log.info("controller of %s: %s", self.topic, error)
            raise self._write_refused() from None

    def _write_refused(self) -> NotLeaderError:
        """A write was refused: a consumer record changed since a coordinator read it (a newer
        leader claimed it, or a deposed one wrote it before our claim), or our election record
        is not the one we won with any more (deposed). Step down rather than retry on a stale
        view, and take over anew: that re-reads the records, and goes on only while the store's
        election record is still ours. The error its caller raises."""
        log.warning("controller of %s: a write was refused (another leader wrote the record, or we were "
                    "deposed): stepping down", self.topic)
        error = NotLeaderError(self.topic, None)
        self._drop_leader_state(error)
        if not self._closed:
            self._takeover = asyncio.get_running_loop().create_task(self._take_over_locked())
        return error

    def _drop_leader_state(self, tell: PulsarError | None = None) -> None:
        """Forget the sessions (kept in the store for the next leader); `tell`: the error the
        connected consumers are sent, so that they register with the leader again."""
        self._leading = False
        if self._settling is not None:
            self._settling.cancel()
        for coordinator in self.subscriptions.values():
            if tell is not None:
                coordinator.unregister_all(tell)
            coordinator.close()
        self.subscriptions.clear()

    @asynccontextmanager
    async def _as_leader(self, *, settle: bool = True) -> AsyncIterator[None]:
        """Leading, with the split or merge left pending by a failure completed first; without
        `settle` (consumers registering on a subscription that exists, leaving) a pending one
        that still cannot complete does not stop the request: it works on the stored layout,
        and the operation is retried in the background."""
        if not self.is_leader:
            raise NotLeaderError(self.topic, self.election.leader)
        async with self._lock:
            await self._take_over()
            if not (self.is_leader and self._leading):
                # elected in our own view but not in the store's: name the store's leader
                raise NotLeaderError(self.topic, self._store_leader if self.election.is_leader
                                     else self.election.leader)
            await self._settle(required=settle)
            yield

    async def _settle(self, *, required: bool) -> None:
        """Complete or roll back a pending operation (under the lock); one that fails is
        retried in the background, and raises only when `required`."""
        try:
            await self._recover_operation()
        except NotLeaderError:
            raise
        except Exception as error:
            self._settle_later()
            if required:
                raise
            log.warning("controller of %s: a pending split or merge cannot complete yet (retrying): %s",
                        self.topic, error)

    def _settle_later(self) -> None:
        if self._settling is None or self._settling.done():
            self._settling = asyncio.get_running_loop().create_task(self._settle_in_background())

    async def _settle_in_background(self) -> None:
        """Retry the pending operation, backing off, until it is done or this controller no
        longer leads: left alone, a split whose parent is sealed but not yet replaced in the
        layout holds up that part of the key space (its producers wait for a layout that
        would only come with the next admin call or a failover)."""
        delay = 0.2
        while not self._closed and self.is_leader:
            await asyncio.sleep(delay)
            try:
                async with self._lock:
                    if self._closed or not self.is_leader:
                        return
                    await self._recover_operation()
                return
            except NotLeaderError:
                return
            except Exception as error:
                delay = min(delay * 2, 10.0)
                log.info("controller of %s: the pending split or merge still cannot complete "
                         "(again in %.1f s): %s", self.topic, delay, error)

    def _check_leading(self) -> None:
        """Between the steps of a split or merge: a controller deposed meanwhile (its session
        ended: another may lead and be completing or rolling back this very operation) stops
        where it is rather than sealing parents or writing a layout it no longer owns."""
        if not self.is_leader:
            raise NotLeaderError(self.topic, self.election.leader)

    async def _after(self, step: str) -> None:
        if self.fault is not None:
            await self.fault(step)

    # --- reads ------------------------------------------------------------------------------

    async def get_layout(self) -> SegmentLayout:
        """The layout as stored now (any instance)."""
        layout, version = await self.resources.load(self.topic)
        held = self.layout
        # Read outside the lock: a read answered after a split's compare-and-set is older than
        # the layout the split stored here, and must not put the sealed parent back (the next
        # subscription would be created on it and not on the children).
        if held is None or layout.incarnation != held.incarnation or layout.epoch >= held.epoch:
            self.layout, self.version = layout, version
        return layout

    # --- split and merge --------------------------------------------------------------------

    async def split_segment(self, segment_id: int) -> SegmentLayout:
        async with self._as_leader():
            layout, record = await self.resources.load_record(self.topic)
            target = layout.split_segment(segment_id)
            return await self._start(PendingOperation("split", (segment_id,), layout.epoch, record.version,
                                                      target.to_metadata(), base_revision=record.mod_revision))

    async def merge_segments(self, segment_id1: int, segment_id2: int) -> SegmentLayout:
        async with self._as_leader():
            layout, record = await self.resources.load_record(self.topic)
            target = layout.merge_segments(segment_id1, segment_id2)
            return await self._start(PendingOperation("merge", (segment_id1, segment_id2), layout.epoch,
                                                      record.version, target.to_metadata(),
                                                      base_revision=record.mod_revision))

    async def _start(self, operation: PendingOperation) -> SegmentLayout:
        with self._fenced() as guard:
            operation = await self.resources.begin_operation(self.topic, operation, guard=guard)
        await self._after("operation")
        try:
            return await self._run(operation)
        except NotLeaderError:
            raise               # deposed mid-way: the new leader completes or rolls it back
        except PulsarError:
            # a step failed (a segment's broker is away...): complete or roll back now if we
            # can; if not, the record stays and is retried in the background (and first by
            # the next operation)
            try:
                await self._settle(required=True)
            except Exception as error:
                log.warning("controller of %s: the failed %s stays pending: %s", self.topic, operation.kind, error)
            raise

    async def _run(self, operation: PendingOperation) -> SegmentLayout:
        target = operation.target_layout
        parents = [target.segment(p).topic_name(self.topic) for p in operation.parent_ids]
        children = [target.segment(c).topic_name(self.topic) for c in operation.child_ids]
        # 1. every subscription of the parents (their union for a merge) and of the topic
        states = await self.resources.subscription_states(self.topic)
        stored = {name for name, deleting in states.items() if not deleting}
        subscriptions = set(stored)
        for parent in parents:
            present = await self.segments.subscriptions(parent)
            subscriptions.update(present)
            # a stored subscription whose creation failed on this parent: its cursor now, while
            # the parent is active (a creation retried later reaches active segments only, and a
            # parent sealed without it would read as drained: its messages never delivered)
            for missing in sorted(stored.difference(present)):
                self._check_leading()
                await self.segments.create_subscription(parent, missing)
        subscriptions.difference_update(name for name, deleting in states.items() if deleting)
        await self._after("subscriptions")
        # 2. the children, with a cursor at Earliest for each subscription
        for child in children:      # beside the first parent: the controller need not own segments
            self._check_leading()
            try:
                await self.segments.create(child, sorted(subscriptions), near=parents[0],
                                           incarnation=target.incarnation)
            except NotAllowedError:
                await self._check_holding(operation)      # refused as another leader claimed it?
                raise
            await self._after("create")
        # 3. seal the parents, one after the other — once the record says so: from here on the
        # operation only goes forward, and a leader that claimed it meanwhile fences us off
        self._check_leading()
        operation = await self._advance(operation, SEALING)
        await self._after("seal")
        for parent in parents:
            self._check_leading()
            await self.segments.terminate(parent)
            await self._after("terminate")
        # 4. the layout, compare-and-set against the version (and mod revision: not a topic
        # deleted and created again meanwhile) the operation started from
        self._check_leading()
        try:
            with self._fenced() as guard:
                self.version = await self.resources.update(self.topic, target, operation.base_version,
                                                           operation.base_revision, guard=guard)
            self.layout = target
        except BadVersionError:
            current, version = await self.resources.load(self.topic)
            if current.epoch < target.epoch or not all(c in current.all_segments for c in operation.child_ids):
                raise
            self.layout, self.version = current, version        # applied before a crash
        await self._after("cas")
        # 5. rebalance the ordered consumers
        await self._notify(self.layout)
        await self._after("notify")
        await self._end(operation)
        return self.layout

    async def _advance(self, operation: PendingOperation, phase: str) -> PendingOperation:
        """The operation record moved to `phase` if it is still at the version we hold;
        NotLeaderError when another leader claimed (or finished) the operation meanwhile."""
        try:
            with self._fenced() as guard:
                return await self.resources.advance_operation(self.topic, operation, phase, guard=guard)
        except BadVersionError:
            log.info("controller of %s: the %s of %s was taken over by another leader", self.topic,
                     operation.kind, operation.parent_ids)
            raise OperationTakenOverError(self.topic, self.election.leader) from None

    async def _end(self, operation: PendingOperation) -> None:
        """Clear the operation record if it is still ours (a newer leader's claim of it, or
        its next operation, stays)."""
        with self._fenced() as guard:
            await self.resources.end_operation(self.topic, operation, guard=guard)

    async def _check_holding(self, operation: PendingOperation) -> None:
        """OperationTakenOverError when the operation record is no longer at the version we
        hold: a segment's broker refused our create or delete because another leader claimed
        the operation (or finished it) meanwhile (fencing, segments.py)."""
        current = await self.resources.pending_operation(self.topic)
        if current is None or current.version != operation.version:
            raise OperationTakenOverError(self.topic, self.election.leader)

    async def _notify(self, layout: SegmentLayout) -> None:
        for coordinator in list(self.subscriptions.values()):
            try:
                await coordinator.on_layout_change(layout)
            except NotLeaderError:
                raise
            except Exception as error:
                # it has the layout and retries the rebalance itself (its drain watch): the
                # split or merge is done, and the subscriptions after it must hear of it too
                log.warning("controller of %s: rebalancing %s at epoch %d failed (retrying): %s",
                            self.topic, coordinator.subscription, layout.epoch, error)
        for listener in list(self.layout_listeners):
            try:
                listener(layout)
            except Exception:
                log.exception("layout listener failed")

    async def _recover_operation(self) -> None:
        """Complete or roll back the operation in progress, if any. Read again when its record
        changes under us (a deposed leader moving it on: a bounded number of writes)."""
        for _ in range(5):
            try:
                return await self._recover_once()
            except OperationTakenOverError:
                if not self.is_leader:
                    raise
        raise BadVersionError(f"the operation record of {self.topic} keeps changing")

    async def _recover_once(self) -> None:
        operation = await self.resources.pending_operation(self.topic)
        if operation is None:
            return
        layout, version = await self.resources.load(self.topic)
        target = operation.target_layout
        if layout.epoch >= target.epoch:
            log.info("controller of %s: the %s of %s was applied before a crash: finishing",
                     self.topic, operation.kind, operation.parent_ids)
            self.layout, self.version = layout, version
            await self._notify(layout)
            await self._end(operation)
            return
        parents = [target.segment(p).topic_name(self.topic) for p in operation.parent_ids]
        # sealing: a terminate may have been sent (and may land any time): only forward
        forward = layout.epoch == operation.base_epoch
        if not (forward and operation.phase == SEALING):
            # claim it first: the leader that began it can no longer enter the sealing phase
            # (its compare-and-set fails), so no terminate of it can be sent from now on. A
            # parent sealed nonetheless (a record written before phases existed): forward too.
            operation = await self._advance(operation, ROLLING_BACK)
            forward = forward and await self._any_terminated(parents)
        if forward:
            log.info("controller of %s: completing the interrupted %s of %s", self.topic, operation.kind,
                     operation.parent_ids)
            if operation.phase == ROLLING_BACK:
                # claimed above, but a parent is sealed: the segments' brokers create children
                # only for an operation that is not rolling back
                operation = await self._advance(operation, SEALING)
            await self._run(operation)
            return
        log.info("controller of %s: rolling back the interrupted %s of %s", self.topic, operation.kind,
                 operation.parent_ids)
        for child in operation.child_ids:
            if child not in layout.all_segments:
                try:
                    await self.segments.delete(target.segment(child).topic_name(self.topic))
                except NotAllowedError:
                    await self._check_holding(operation)
                    raise
        await self._end(operation)

    async def _any_terminated(self, segments: list[str]) -> bool:
        for segment in segments:
            if await self.segments.is_terminated(segment):
                return True
        return False

    # --- subscriptions and consumers ---------------------------------------------------------

    async def create_subscription(self, subscription: str) -> bool:
        """Create the subscription on every active segment, its cursor at Earliest (as the
        Segments API creates cursors, on this broker or the segment's owner). False when it
        existed."""
        _check_subscription(subscription)
        async with self._as_leader():
            return await self._create_subscription(subscription)

    async def _create_subscription(self, subscription: str) -> bool:
        with self._fenced() as guard:
            created = await self.resources.create_subscription(self.topic, subscription, guard=guard)
        if created is None:                     # a deletion left unfinished: a new subscription
            await self._finish_deletion(subscription)
            with self._fenced() as guard:
                created = await self.resources.create_subscription(self.topic, subscription, guard=guard)
            if created is None:
                raise ServiceNotReadyError(f"subscription {subscription!r} of {self.topic} is being deleted")
        assert self.layout is not None
        for segment in self.layout.active_segments:
            await self.segments.create_subscription(segment.topic_name(self.topic), subscription)
        if subscription not in self.subscriptions:
            coordinator = self._coordinator(subscription)
            try:
                await coordinator.restore()
            except BaseException:
                coordinator.close()             # its grace timers must not outlive it
                raise
            self.subscriptions[subscription] = coordinator
        return created

    async def delete_subscription(self, subscription: str) -> None:
        """Mark the subscription's record first, under the leader's guard, and only then delete
        the segments' cursors: a deposed leader that has not noticed is refused before it
        touches a cursor. A deletion cut short (a crash, a segment unreachable) is finished by
        the next delete, the next leader, or a consumer subscribing again."""
        _check_subscription(subscription)
        async with self._as_leader():
            with self._fenced() as guard:
                if not await self.resources.mark_subscription_deleting(self.topic, subscription, guard=guard):
                    raise SubscriptionNotFoundError(f"no subscription {subscription!r} on {self.topic}")
            await self._finish_deletion(subscription)

    async def _finish_deletion(self, subscription: str) -> None:
        """The steps after the mark: its consumers, every segment's cursor, then the record."""
        coordinator = self.subscriptions.pop(subscription, None)
        if coordinator is not None:
            # the spec: "unregisters all consumers", first
            coordinator.unregister_all(SubscriptionNotFoundError(
                f"subscription {subscription!r} of {self.topic} was deleted: the consumer is unregistered"))
            coordinator.close()
            # A consumer record being written (a registration under way) lands before the
            # records are deleted, not after: left, it would be a phantom session of a
            # subscription created again under the name.
            await coordinator.settled()
        assert self.layout is not None
        for segment in self.layout.all_segments.values():
            self._check_leading()
            await self.segments.delete_subscription(segment.topic_name(self.topic), subscription)
        with self._fenced() as guard:
            await self.resources.delete_subscription(self.topic, subscription, guard=guard)

    async def register_consumer(self, subscription: str, consumer_name: str, consumer_id: int = -1,
                                on_assignment: AssignmentListener | None = None,
                                alive: LivenessCheck | None = None) -> ConsumerAssignment:
        """Register (or resume) a StreamConsumer/CheckpointConsumer; its assignment. `alive`:
        whether its connection still answers (see SubscriptionCoordinator.add_consumer)."""
        _check_subscription(subscription)
        if not isinstance(consumer_name, str) or not consumer_name:
            raise NotAllowedError("a consumer name is a non-empty string")
        async with self._as_leader(settle=False):
            if subscription not in self.subscriptions:
                # a new subscription needs a settled layout: a split's children get its cursors
                await self._recover_operation()
                await self._create_subscription(subscription)
            coordinator = self.subscriptions[subscription]
        return await coordinator.add_consumer(consumer_name, consumer_id, on_assignment, alive)

    async def unregister_consumer(self, subscription: str, consumer_name: str,
                                  on_assignment: AssignmentListener | None = None) -> None:
        """`on_assignment`: the listener of the registration meant (see `consumer_disconnected`)."""
        async with self._as_leader(settle=False):
            coordinator = self.subscriptions.get(subscription)
        if coordinator is not None:
            await coordinator.remove_consumer(consumer_name, on_assignment)

    def consumer_disconnected(self, subscription: str, consumer_name: str,
                              on_assignment: AssignmentListener | None = None) -> None:
        """The connection of a registration closed. `on_assignment`, the listener it registered
        with, tells it apart from a newer registration of the same name on another connection,
        which is left alone."""
        coordinator = self.subscriptions.get(subscription)
        if coordinator is not None:
            coordinator.disconnect(consumer_name, on_assignment)

    # --- stats --------------------------------------------------------------------------------

    async def stats(self) -> dict:
        layout = await self.get_layout()
        segments = {}
        for sid, info in sorted(layout.all_segments.items()):
            topic = info.topic_name(self.topic)
            try:
                segment_stats = await self.segments.stats(topic)
            except PulsarError as error:        # its broker is down: the rest is still reported
                segment_stats = {"unavailable": str(error)}
            segments[str(sid)] = {"segmentId": sid, "hashRange": info.hash_range.to_json(),
                                  "state": info.state.value, "topic": topic,
                                  "msgInCounter": segment_stats.get("msgInCounter", 0),
                                  # the spec's per-segment rates, over the segment broker's last
                                  # stats interval
                                  **{rate: segment_stats.get(rate, 0.0) for rate in SEGMENT_RATES},
                                  "storageSize": segment_stats.get("storageSize", 0),
                                  "terminated": segment_stats.get("terminated", False),
                                  **({"unavailable": segment_stats["unavailable"]}
                                     if "unavailable" in segment_stats else {}),
                                  "subscriptions": {name: {"msgBacklog": s.get("msgBacklog", 0)}
                                                    for name, s in segment_stats.get("subscriptions", {}).items()}}
        subscriptions = {}
        for name in await self.resources.subscriptions(self.topic):
            coordinator = self.subscriptions.get(name)
            consumers = []
            for record in await self.resources.consumers(self.topic, name):
                live = coordinator.consumers.get(record.consumer_name) if coordinator else None
                consumers.append({"consumerName": record.consumer_name,
                                  "connected": bool(live and live.connected),
                                  "layoutEpoch": record.layout_epoch, "assignedSegments": record.segment_ids})
            subscriptions[name] = {"consumers": consumers, "consumerCount": len(consumers)}
        return {"topic": str(self.topic), "epoch": layout.epoch,
                "activeSegmentCount": len(layout.active_segments),
                "sealedSegmentCount": len(layout.all_segments) - len(layout.active_segments),
                "segments": segments, "subscriptions": subscriptions,
                "controllerBrokerUrl": await self.election.current_leader()}


def _check_subscription(subscription: object) -> None:
    if not isinstance(subscription, str) or not subscription or "/" in subscription:
        raise NotAllowedError(f"invalid subscription name {subscription!r}")


__all__ = ["STEPS", "LayoutError", "NotLeaderError", "ScalableTopicController"]
