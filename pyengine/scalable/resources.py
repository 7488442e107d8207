"""Where a scalable topic lives in the metadata store (the spec's paths) and its records.

    /topics/{tenant}/{namespace}/{topic}                                   ScalableTopicMetadata JSON
    /topics/{tenant}/{namespace}/{topic}/controller                        leader's broker URL (ephemeral)
    /topics/{tenant}/{namespace}/{topic}/subscriptions/{sub}               SubscriptionMetadata JSON
                                                                           (+ "deleting": true while deleted)
    /topics/{tenant}/{namespace}/{topic}/subscriptions/{sub}/consumers/{c} ConsumerRegistration JSON
    /topics/{tenant}/{namespace}/{topic}/operation                         the split/merge in progress
    /topics/{tenant}/{namespace}/{topic}/segments/{segmentId}              the broker owning the segment
    /topics/{tenant}/{namespace}/{topic}/deleting                          the topic is being (or was) deleted
    /brokers/{serviceUrl}                                                  a live broker's URLs (ephemeral)

The last four paths are ours. A segment topic lives in the data dir of the broker that created
it (no shared storage), so its owner is recorded, and brokers register their URLs for the others
to route segment operations and lookups to. The operation record: the controller writes the split
or merge it is about to run before its first step and clears it after the last, so a leader that
takes over after a crash knows what to complete or roll back (see controller.py). Every change
of it is a compare-and-set on the version its writer holds — this fences a deposed leader — and
it is cleared to `{}` rather than deleted, so its version never starts again at 0 (a leader
clearing "its" version can never hit a newer operation's record). The deleting marker outlives the
topic (a tombstone, cleared when a topic of that name is created again): a deposed leader's create
of a segment landing after the deletion is refused, where a segment of a name that never was a
scalable topic (the Segments API used alone) is not. A create that carries the incarnation of its
layout (layout.py) needs no tombstone: with no layout of that incarnation it is refused. The
tombstone stays for the creates that carry none — from a layout stored before incarnations, from
a broker of an older version, and those forwarded to a segment's owner through its admin API
while the route does not pass the incarnation on — and as nothing bounds how late one of those
lands (a paused process, a request already read by the owner), no moment after the deletion is
safe to clear it but the name's next use.

The marker names the incarnation being deleted and marks only that one: a delete that paused
while the topic was deleted and created again must not mark the new topic (nor delete its
segments or records). It is written by a compare-and-set on the version read before the layout
is checked to be of that incarnation, and cleared to `{}` rather than deleted (its version never
starts again at 0): a create clearing it or another delete marking it in between fails the
write. A marker naming another incarnation than the layout's is a stale one and marks nothing;
an empty marker (written before markers named the incarnation) marks whatever layout is there.

The controller's writes (layout, operation, subscriptions, consumers) take its `guard`: the
path and mod revision of its election record, checked by the store atomically with the write
(`GuardFailedError` once another leader's record replaced it), so a deposed leader writes
nothing, not even a record that did not exist.

Path parts are percent-encoded (Pulsar's `encodedTopicName`), so a name never adds a level.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from urllib.parse import quote, unquote

from pyengine.metadata import (AlreadyExistsError, BadVersionError, GuardFailedError, MetadataStore, NotFoundError,
                               Record)
from pyengine.naming import TopicName
from pyengine.scalable.layout import LayoutError, SegmentLayout

ROOT = "/topics"


def _enc(part: str) -> str:
    """A name as one path segment. "." and ".." are names like any other (a subscription or a
    consumer may be called so), not the path's relative segments: their dots are escaped."""
    if part in (".", ".."):
        return "%2E" * len(part)
    return quote(part, safe="-_.=:")


class ScalableTopicNotFoundError(NotFoundError):
    """No scalable topic of that name."""


class ScalableTopicExistsError(AlreadyExistsError):
    """The scalable topic exists already."""


PREPARING = "preparing"          # steps 1-2: nothing sealed, rolling back is safe
SEALING = "sealing"              # step 3 on: a terminate may have been sent, only forward
ROLLING_BACK = "rolling-back"    # a leader claimed it to roll it back: no terminate may follow
PHASES = (PREPARING, SEALING, ROLLING_BACK)
IDLE = b"{}"                     # the operation record when no operation is in progress (and the
                                 # deleting marker when no deletion is)
_NOTHING = object()              # what a cleared deleting marker marks
_ANY = object()                  # what an empty one (written before markers named it) marks
_CURRENT = object()              # is_deleting: of the topic's current incarnation

# A leader's write guard: the path and mod revision of its election record.
LeaderGuard = tuple[str, int]


def _guarded(guard: LeaderGuard | None) -> dict[str, Any]:
    """The store's keyword arguments of a write made under `guard` (None: unguarded)."""
    if guard is None:
        return {}
    path, revision = guard
    return {"guard_path": path, "guard_mod_revision": revision}


def _being_deleted(value: bytes) -> bool:
    """Whether a subscription record is marked for deletion (a record that is not a JSON
    object is an older or foreign one: a live subscription)."""
    try:
        record = json.loads(value)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("deleting") is True


def _marked(marker: bytes) -> object:
    """The incarnation a deleting marker marks (None: a layout stored before incarnations)."""
    if not marker:
        return _ANY
    raw = json.loads(marker)
    return raw["incarnation"] if "incarnation" in raw else _NOTHING


@dataclass(frozen=True)
class PendingOperation:
    """A split or merge between its first and last step: what it changes and the layout it
    leads to (computed once, so a new leader completes exactly the same change)."""

    kind: str                    # "split" | "merge"
    parent_ids: tuple[int, ...]
    base_epoch: int              # the layout epoch the operation starts from
    base_version: int            # the metadata record's version at that epoch (for the CAS)
    target: dict[str, Any]       # the resulting layout's metadata JSON
    phase: str = PREPARING
    version: int = field(default=-1, compare=False)   # of the store record, as read or written (not stored)
    # The layout record's mod revision at that epoch: with base_version, the CAS cannot land on
    # a topic deleted and created again since, whose versions start at 0 again (None: an
    # operation recorded before the field existed).
    base_revision: int | None = None
    revision: int | None = field(default=None, compare=False)   # of the store record (not stored)

    @property
    def target_layout(self) -> SegmentLayout:
        return SegmentLayout.from_metadata(self.target)

    @property
    def child_ids(self) -> list[int]:
        layout = self.target_layout
        return sorted({c for p in self.parent_ids for c in layout.segment(p).child_ids})

    def to_json(self) -> bytes:
        return json.dumps({"kind": self.kind, "parentIds": list(self.parent_ids), "baseEpoch": self.base_epoch,
                           "baseVersion": self.base_version, "baseRevision": self.base_revision,
                           "target": self.target, "phase": self.phase}).encode()

    @classmethod
    def from_json(cls, data: bytes, version: int = -1, revision: int | None = None) -> PendingOperation | None:
        """None for the cleared record. A record without a phase (written before phases
        existed) reads as PREPARING: recovery then also looks whether a parent is sealed."""
        raw = json.loads(data)
        if not raw.get("kind"):
            return None
        phase = raw.get("phase", PREPARING)
        if phase not in PHASES:
            raise ValueError(f"unknown operation phase {phase!r}")
        return cls(raw["kind"], tuple(raw["parentIds"]), raw["baseEpoch"], raw["baseVersion"], raw["target"],
                   phase, version, raw.get("baseRevision"), revision)


@dataclass
class ConsumerRecord:
    """The persisted consumer session: its name and its current assignment (segment ids)."""

    consumer_name: str
    layout_epoch: int = 0
    segment_ids: list[int] = field(default_factory=list)
    version: int | None = None            # of the store record (None: not stored yet)
    revision: int | None = None           # its mod revision (never reused, unlike a version)

    def to_json(self) -> bytes:
        return json.dumps({"consumerName": self.consumer_name, "layoutEpoch": self.layout_epoch,
                           "assignedSegments": self.segment_ids}).encode()

    @classmethod
    def from_json(cls, data: bytes, version: int, revision: int | None = None) -> ConsumerRecord:
        raw = json.loads(data)
        return cls(raw["consumerName"], raw.get("layoutEpoch", 0), list(raw.get("assignedSegments", [])), version,
                   revision)


class ScalableTopicResources:
    """Reads and writes one metadata store's scalable-topic records."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    # --- paths ----------------------------------------------------------------------------

    @staticmethod
    def namespace_path(namespace: str) -> str:
        tenant, _, ns = namespace.partition("/")
        return f"{ROOT}/{_enc(tenant)}/{_enc(ns)}"

    @classmethod
    def topic_path(cls, topic: TopicName) -> str:
        return f"{cls.namespace_path(topic.namespace_name)}/{_enc(topic.local_name)}"

    @classmethod
    def controller_path(cls, topic: TopicName) -> str:
        return f"{cls.topic_path(topic)}/controller"

    @classmethod
    def operation_path(cls, topic: TopicName) -> str:
        return f"{cls.topic_path(topic)}/operation"

    @classmethod
    def subscription_path(cls, topic: TopicName, subscription: str) -> str:
        return f"{cls.topic_path(topic)}/subscriptions/{_enc(subscription)}"

    @classmethod
    def consumer_path(cls, topic: TopicName, subscription: str, consumer: str) -> str:
        return f"{cls.subscription_path(topic, subscription)}/consumers/{_enc(consumer)}"

    # --- topics ---------------------------------------------------------------------------

    async def create(self, topic: TopicName, layout: SegmentLayout) -> None:
        tombstone = await self.store.get(self.deleting_path(topic))
        try:
            await self.store.create(self.topic_path(topic), layout.to_json_bytes())
        except AlreadyExistsError:
            raise ScalableTopicExistsError(f"scalable topic {topic} already exists") from None
        # a previous incarnation's tombstone, cleared only now that the layout fences instead
        # (no moment without either, when a late create of the old topic would be let through);
        # unless marked since: by a delete of this new topic, or a stale one marking nothing
        if tombstone is not None and tombstone.value != IDLE:
            try:
                await self.store.put(self.deleting_path(topic), IDLE, tombstone.version)
            except BadVersionError:
                pass

    async def load(self, topic: TopicName) -> tuple[SegmentLayout, int]:
        """The layout and the version of its record."""
        layout, record = await self.load_record(topic)
        return layout, record.version

    async def load_record(self, topic: TopicName) -> tuple[SegmentLayout, Record]:
        """The layout and its record (whose version and mod revision an `update` compares)."""
        record = await self.store.get(self.topic_path(topic))
        if record is None:
            raise ScalableTopicNotFoundError(f"scalable topic {topic} does not exist")
        try:
            return SegmentLayout.from_metadata(record.value), record
        except LayoutError as error:
            raise LayoutError(f"scalable topic {topic}: {error}") from None

    async def load_incarnation(self, topic: TopicName, incarnation: str | None) -> tuple[SegmentLayout, int]:
        """`load`, ScalableTopicNotFoundError also when the layout is of another incarnation (the
        topic was deleted and created again)."""
        layout, record = await self._load_incarnation_record(topic, incarnation)
        return layout, record.version

    async def _load_incarnation_record(self, topic: TopicName, incarnation: str | None
                                       ) -> tuple[SegmentLayout, Record]:
        layout, record = await self.load_record(topic)
        if layout.incarnation != incarnation:
            raise ScalableTopicNotFoundError(f"scalable topic {topic} of incarnation {incarnation or 'none'} does "
                                             f"not exist (it is of incarnation {layout.incarnation or 'none'})")
        return layout, record

    async def exists(self, topic: TopicName) -> bool:
        return await self.store.exists(self.topic_path(topic))

    async def incarnation(self, topic: TopicName) -> str | None:
        """The incarnation of the topic's layout (layout.py); None when there is no such topic
        or its layout predates incarnations."""
        try:
            layout, _ = await self.load(topic)
        except ScalableTopicNotFoundError:
            return None
        return layout.incarnation

    async def update(self, topic: TopicName, layout: SegmentLayout, expected_version: int,
                     expected_revision: int | None = None, *, guard: LeaderGuard | None = None) -> int:
        """CAS the layout (BadVersionError when someone else changed it, or when the topic was
        deleted and created again since `expected_revision`); the new version."""
        record = await self.store.put(self.topic_path(topic), layout.to_json_bytes(), expected_version,
                                      expected_mod_revision=expected_revision, **_guarded(guard))
        return record.version

    async def delete(self, topic: TopicName, incarnation: str | None) -> None:
        """Remove the records of the topic's `incarnation` but its deleting marker, which stays as
        its tombstone; nothing when they are gone already, ScalableTopicNotFoundError when the
        topic is of another incarnation (deleted and created again meanwhile)."""
        path = self.topic_path(topic)
        while True:
            try:
                _, record = await self._load_incarnation_record(topic, incarnation)
            except ScalableTopicNotFoundError:
                if await self.is_deleting(topic, incarnation):
                    return                      # removed by another delete of it
                raise
            try:
                # each record only while the layout is the one read: a delete that paused here
                # while the topic was deleted and created again must not remove the new
                # topic's subscriptions, operation or segment owners
                for child in await self.store.get_children(path):
                    if f"{path}/{child}" != self.deleting_path(topic):
                        await self.store.delete_recursive(f"{path}/{child}", guard_path=path,
                                                          guard_mod_revision=record.mod_revision)
                # the revision too: not a record of the topic created again meanwhile
                await self.store.delete(path, record.version, expected_mod_revision=record.mod_revision)
                return
            except (NotFoundError, BadVersionError):
                continue                        # changed since read (a split completed): which one is it?

    async def list(self, namespace: str) -> list[str]:
        names = []
        base = self.namespace_path(namespace)
        tenant, _, ns = namespace.partition("/")
        for child in await self.store.get_children(base):
            if await self.store.exists(f"{base}/{child}"):
                names.append(str(TopicName("topic", tenant, ns, unquote(child))))
        return sorted(names)

    # --- segment owners and live brokers ----------------------------------------------------

    @classmethod
    def owner_path(cls, segment: TopicName) -> str:
        return f"{cls.topic_path(segment.scalable_topic)}/segments/{segment.segment_id}"

    async def claim_owner(self, segment: TopicName, broker_url: str) -> str:
        """Record `broker_url` as the segment's owner unless one is recorded; the owner."""
        try:
            await self.store.create(self.owner_path(segment), broker_url.encode())
            return broker_url
        except AlreadyExistsError:
            owner = await self.owner(segment)
            return owner if owner is not None else await self.claim_owner(segment, broker_url)

    async def owner(self, segment: TopicName) -> str | None:
        record = await self.store.get(self.owner_path(segment))
        return record.value.decode() if record is not None else None

    async def keeps_segment(self, segment: TopicName) -> bool | None:
        """Whether the controller's decisions keep the segment: it is in the layout, or it is a
        child of the split or merge in progress that no leader is rolling back; None when there
        is no such scalable topic and never was (a segment made through the Segments API alone);
        False for a deleted one (its tombstone). The operation is read before the layout: an
        operation that completes between the two reads has its children in the layout by the
        time the layout is read."""
        topic = segment.scalable_topic
        operation = await self.pending_operation(topic)
        if operation is not None and operation.phase != ROLLING_BACK and segment.segment_id in operation.child_ids:
            return True
        try:
            layout, _ = await self.load(topic)
        except ScalableTopicNotFoundError:
            return False if await self.is_deleting(topic) else None
        return segment.segment_id in layout.all_segments

    @classmethod
    def deleting_path(cls, topic: TopicName) -> str:
        return f"{cls.topic_path(topic)}/deleting"

    async def mark_deleting(self, topic: TopicName, incarnation: str | None) -> None:
        """The topic's `incarnation` is being deleted: its segment topics may go, none may be
        created (kept after the topic as its tombstone). ScalableTopicNotFoundError when the
        topic is of another incarnation (see the module docstring)."""
        path = self.deleting_path(topic)
        while True:
            marker = await self.store.get(path)
            await self.load_incarnation(topic, incarnation)
            try:
                await self.store.put(path, json.dumps({"incarnation": incarnation}).encode(),
                                     marker.version if marker is not None else -1)
                return
            except BadVersionError:
                continue            # a create cleared it or another delete marked it: check again

    async def is_deleting(self, topic: TopicName, incarnation: str | None | object = _CURRENT) -> bool:
        """Whether the topic (of `incarnation` if given, else the current one) is being deleted,
        or was (its tombstone)."""
        marker = await self.store.get(self.deleting_path(topic))
        marked = _marked(marker.value) if marker is not None else _NOTHING
        if marked is _NOTHING:
            return False
        try:
            layout, _ = await self.load(topic)
        except ScalableTopicNotFoundError:
            return incarnation is _CURRENT or marked in (_ANY, incarnation)
        return marked in (_ANY, layout.incarnation) and incarnation in (_CURRENT, layout.incarnation)

    async def move_owner(self, segment: TopicName, old_url: str, new_url: str) -> bool:
        """Record `new_url` as the segment's owner if the record still names `old_url`
        (compare-and-set: a record changed meanwhile is left as it is)."""
        record = await self.store.get(self.owner_path(segment))
        if record is None or record.value.decode() != old_url:
            return False
        try:
            await self.store.put(self.owner_path(segment), new_url.encode(), record.version)
        except (NotFoundError, BadVersionError):
            return False
        return True

    async def forget_owner(self, segment: TopicName) -> None:
        try:
            await self.store.delete(self.owner_path(segment))
        except NotFoundError:
            pass

    async def forget_own_record(self, segment: TopicName, broker_url: str) -> None:
        """Forget the segment's owner record if it names `broker_url` (a record another broker
        claimed stays; it cannot be re-claimed between the read and the delete: a claim only
        creates)."""
        record = await self.store.get(self.owner_path(segment))
        if record is None or record.value.decode() != broker_url:
            return
        try:
            await self.store.delete(self.owner_path(segment), record.version)
        except (NotFoundError, BadVersionError):
            pass

    @staticmethod
    def broker_path(service_url: str) -> str:
        return f"/brokers/{_enc(service_url)}"

    async def register_broker(self, service_url: str, web_service_url: str, session: Any) -> None:
        await self.store.put(self.broker_path(service_url),
                             json.dumps({"serviceUrl": service_url, "webServiceUrl": web_service_url}).encode(),
                             session=session)

    async def web_service_url(self, service_url: str) -> str | None:
        record = await self.store.get(self.broker_path(service_url))
        return json.loads(record.value).get("webServiceUrl") if record is not None else None

    # --- the operation in progress --------------------------------------------------------

    async def begin_operation(self, topic: TopicName, operation: PendingOperation, *,
                              guard: LeaderGuard | None = None) -> PendingOperation:
        """Write the operation record over the cleared one (compare-and-set); the operation
        with the record's version. BadVersionError when another operation is in progress."""
        path = self.operation_path(topic)
        record = await self.store.get(path)
        if record is not None and PendingOperation.from_json(record.value) is not None:
            raise BadVersionError(f"another split or merge of {topic} is in progress")
        try:
            written = await self.store.put(path, operation.to_json(), record.version if record is not None else -1,
                                           **_guarded(guard))
        except GuardFailedError:
            raise
        except BadVersionError:
            raise BadVersionError(f"another split or merge of {topic} is in progress") from None
        return replace(operation, version=written.version, revision=written.mod_revision)

    async def pending_operation(self, topic: TopicName) -> PendingOperation | None:
        """The operation in progress (with its record's version), or None."""
        record = await self.store.get(self.operation_path(topic))
        if record is None:
            return None
        return PendingOperation.from_json(record.value, record.version, record.mod_revision)

    async def advance_operation(self, topic: TopicName, operation: PendingOperation, phase: str, *,
                                guard: LeaderGuard | None = None) -> PendingOperation:
        """Move the operation to `phase`, compare-and-set on the version (and mod revision)
        `operation` was read or written at: BadVersionError when anyone changed or cleared the
        record since (another leader claimed the operation, or finished it; or the topic was
        deleted and created again, its record's version starting at 0 again)."""
        moved = replace(operation, phase=phase)
        written = await self.store.put(self.operation_path(topic), moved.to_json(), operation.version,
                                       expected_mod_revision=operation.revision, **_guarded(guard))
        return replace(moved, version=written.version, revision=written.mod_revision)

    async def end_operation(self, topic: TopicName, operation: PendingOperation, *,
                            guard: LeaderGuard | None = None) -> bool:
        """Clear the record if it is still `operation` at the version read or written (not a
        newer leader's claim of it, nor another operation); whether it was cleared.
        GuardFailedError when the writer no longer holds `guard`."""
        try:
            await self.store.put(self.operation_path(topic), IDLE, operation.version,
                                 expected_mod_revision=operation.revision, **_guarded(guard))
            return True
        except GuardFailedError:
            raise
        except BadVersionError:       # includes a missing record
            return False

    # --- subscriptions and consumer sessions ----------------------------------------------

    async def subscriptions(self, topic: TopicName) -> list[str]:
        """The subscriptions of the topic, without those being deleted."""
        return sorted(name for name, deleting in (await self.subscription_states(topic)).items() if not deleting)

    async def subscription_states(self, topic: TopicName) -> dict[str, bool]:
        """Every subscription record of the topic: its name -> whether it is being deleted."""
        base = f"{self.topic_path(topic)}/subscriptions"
        states = {}
        for child in await self.store.get_children(base):
            record = await self.store.get(f"{base}/{child}")
            if record is not None:          # (a child may be only the parent of consumer records)
                states[unquote(child)] = _being_deleted(record.value)
        return states

    async def create_subscription(self, topic: TopicName, subscription: str, *,
                                  guard: LeaderGuard | None = None) -> bool | None:
        """True when created, False when it existed, None when it is being deleted (the
        deletion must be finished first)."""
        path = self.subscription_path(topic, subscription)
        try:
            await self.store.create(path, json.dumps({"subscription": subscription}).encode(), **_guarded(guard))
            return True
        except AlreadyExistsError:
            record = await self.store.get(path)
            return None if record is not None and _being_deleted(record.value) else False

    async def mark_subscription_deleting(self, topic: TopicName, subscription: str, *,
                                         guard: LeaderGuard | None = None) -> bool:
        """The first step of a deletion: mark the record (False: there is none). The segments'
        cursors go only after it, under the leader's guard, and until the record is gone the
        subscription is listed by no one, created by no one, and its deletion is finished by
        the next delete or leader. Written under `guard` also when it is marked already (a
        retry): a deposed leader is refused before it touches a cursor either way."""
        path = self.subscription_path(topic, subscription)
        while True:
            record = await self.store.get(path)
            if record is None:
                return False
            try:
                await self.store.put(path, json.dumps({"subscription": subscription, "deleting": True}).encode(),
                                     record.version, **_guarded(guard))
                return True
            except GuardFailedError:
                raise
            except BadVersionError:          # deleted or written meanwhile by another writer
                continue

    async def delete_subscription(self, topic: TopicName, subscription: str, *,
                                  guard: LeaderGuard | None = None) -> None:
        await self.store.delete_recursive(self.subscription_path(topic, subscription), **_guarded(guard))

    async def consumers(self, topic: TopicName, subscription: str) -> list[ConsumerRecord]:
        page = await self.store.list_prefix(f"{self.subscription_path(topic, subscription)}/consumers/")
        records = list(page)
        while page.more:
            page = await self.store.list_prefix(f"{self.subscription_path(topic, subscription)}/consumers/",
                                                after=page.last_path)
            records.extend(page)
        return [ConsumerRecord.from_json(r.value, r.version, r.mod_revision) for r in records]

    async def save_consumer(self, topic: TopicName, subscription: str, consumer: ConsumerRecord, *,
                            guard: LeaderGuard | None = None) -> None:
        """Write the record, compare-and-set on the version and mod revision it was read or last
        written at (not stored yet: it must not exist). BadVersionError when another leader
        wrote or deleted it since: a new leader's take-over rewrites every record it restores,
        so a deposed leader's late writes are refused (as the layout's CAS refuses its splits);
        GuardFailedError when the writer no longer holds `guard` (also for a new record, which
        has no version to compare)."""
        path = self.consumer_path(topic, subscription, consumer.consumer_name)
        if consumer.version is None:
            record = await self.store.put(path, consumer.to_json(), -1, **_guarded(guard))
        else:
            record = await self.store.put(path, consumer.to_json(), consumer.version,
                                          expected_mod_revision=consumer.revision, **_guarded(guard))
        consumer.version, consumer.revision = record.version, record.mod_revision

    async def delete_consumer(self, topic: TopicName, subscription: str, consumer: ConsumerRecord, *,
                              guard: LeaderGuard | None = None) -> None:
        """Delete the record if it is still at the version (and mod revision) `consumer` holds:
        BadVersionError when another leader wrote it since; nothing when it is gone already."""
        if consumer.version is None:
            return                              # never stored by us: not ours to delete
        try:
            await self.store.delete(self.consumer_path(topic, subscription, consumer.consumer_name),
                                    consumer.version, expected_mod_revision=consumer.revision, **_guarded(guard))
        except NotFoundError:
            pass
        # not stored any more: a caller keeping the registration (a withdrawal whose rebalance
        # failed) must not take it for a stored session, nor write it as one
        consumer.version, consumer.revision = None, None
