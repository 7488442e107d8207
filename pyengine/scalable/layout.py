"""The segment DAG of a scalable topic (PIP-468): `HashRange`, `SegmentInfo`, `SegmentLayout`.

A scalable topic's key space is the hash range [0x0000, 0xFFFF]. Each segment covers an
inclusive sub-range; the ACTIVE segments tile the whole space with no overlap. A split seals one
active segment and adds two children covering its halves ([start, mid], [mid+1, end], mid =
start + (end - start) // 2); a merge seals two adjacent active segments and adds one child
covering both. Sealed segments stay in the DAG (their backlog is still readable, and ordered
consumers drain a parent before its children) until pruned.

Everything here is immutable: a mutation returns a new layout with the epoch incremented, so
readers share a snapshot without locks. The JSON form is the spec's `ScalableTopicMetadata`,
plus one field of ours, `incarnation`: a random id drawn when the topic is created and kept by
every layout derived from it, so a topic deleted and created again under the same name (whose
segment ids start again at 0) is told apart from its predecessor (segments.py fences a late
create of the old one with it). A layout stored before the field existed has none.

Keys hash as Pulsar routes keys (Key_Shared, partitions): Murmur3 32-bit, seed 0, made
non-negative (`& 0x7FFFFFFF`), then modulo the 65536-wide range.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import mmh3

from pyengine.naming import HASH_MAX, HASH_MIN, TopicName

HASH_SPACE = HASH_MAX - HASH_MIN + 1


class LayoutError(ValueError):
    """An invalid layout operation or metadata (unknown segment, not active, not adjacent ...)."""


class SegmentNotFoundError(LayoutError):
    """No segment with that id in the layout."""


def key_hash(key: str | bytes) -> int:
    """The position of `key` in [0x0000, 0xFFFF]: Pulsar's Murmur3_32Hash modulo 65536."""
    data = key.encode() if isinstance(key, str) else bytes(key)
    return (mmh3.hash(data, 0, signed=False) & 0x7FFFFFFF) % HASH_SPACE


@dataclass(frozen=True, slots=True)
class HashRange:
    start: int
    end: int                                    # inclusive

    def __post_init__(self) -> None:
        if not (isinstance(self.start, int) and isinstance(self.end, int)) or isinstance(self.start, bool) \
                or isinstance(self.end, bool):
            raise LayoutError(f"a hash range is two integers, not {self.start!r}, {self.end!r}")
        if not HASH_MIN <= self.start <= self.end <= HASH_MAX:
            raise LayoutError(f"hash range [{self.start}, {self.end}] outside [0x0000, 0xFFFF] or reversed")

    @classmethod
    def full(cls) -> HashRange:
        return cls(HASH_MIN, HASH_MAX)

    def contains(self, hash_value: int) -> bool:
        return self.start <= hash_value <= self.end

    def split(self) -> tuple[HashRange, HashRange]:
        if self.start == self.end:
            raise LayoutError(f"hash range [{self.start}, {self.end}] is one value wide: it cannot be split")
        mid = self.start + (self.end - self.start) // 2
        return HashRange(self.start, mid), HashRange(mid + 1, self.end)

    def is_adjacent_to(self, other: HashRange) -> bool:
        return self.end + 1 == other.start or other.end + 1 == self.start

    def merge(self, other: HashRange) -> HashRange:
        if not self.is_adjacent_to(other):
            raise LayoutError(f"hash ranges {self} and {other} are not adjacent")
        return HashRange(min(self.start, other.start), max(self.end, other.end))

    def to_json(self) -> dict[str, int]:
        return {"start": self.start, "end": self.end}

    def __str__(self) -> str:
        return f"[0x{self.start:04x}, 0x{self.end:04x}]"


class SegmentState(enum.Enum):
    ACTIVE = "ACTIVE"
    SEALED = "SEALED"


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    segment_id: int
    hash_range: HashRange
    state: SegmentState
    parent_ids: tuple[int, ...] = ()
    child_ids: tuple[int, ...] = ()
    created_at_epoch: int = 0
    sealed_at_epoch: int = 0                   # 0 while active: sealing always bumps the epoch past 0

    @classmethod
    def active(cls, segment_id: int, hash_range: HashRange, epoch: int,
               parent_ids: Iterable[int] = ()) -> SegmentInfo:
        return cls(segment_id, hash_range, SegmentState.ACTIVE, tuple(parent_ids), (), epoch, 0)

    def sealed(self, epoch: int, child_ids: Iterable[int]) -> SegmentInfo:
        return SegmentInfo(self.segment_id, self.hash_range, SegmentState.SEALED, self.parent_ids,
                           tuple(child_ids), self.created_at_epoch, epoch)

    @property
    def is_active(self) -> bool:
        return self.state is SegmentState.ACTIVE

    @property
    def descriptor(self) -> str:
        """`{hexStart}-{hexEnd}-{segmentId}`, the last part of the segment's topic name."""
        return f"{self.hash_range.start:04x}-{self.hash_range.end:04x}-{self.segment_id}"

    def topic_name(self, parent: TopicName | str) -> str:
        """The `segment://` topic backing this segment of scalable topic `parent`."""
        return str(TopicName.segment(parent, self.hash_range.start, self.hash_range.end, self.segment_id))

    def to_json(self) -> dict[str, Any]:
        return {"segmentId": self.segment_id, "hashRange": self.hash_range.to_json(), "state": self.state.value,
                "parentIds": list(self.parent_ids), "childIds": list(self.child_ids),
                "createdAtEpoch": self.created_at_epoch, "sealedAtEpoch": self.sealed_at_epoch}

    @classmethod
    def from_json(cls, raw: Any) -> SegmentInfo:
        try:
            hash_range = raw["hashRange"]
            info = cls(_int(raw["segmentId"]), HashRange(_int(hash_range["start"]), _int(hash_range["end"])),
                       SegmentState(raw["state"]), tuple(_int(i) for i in raw.get("parentIds", [])),
                       tuple(_int(i) for i in raw.get("childIds", [])), _int(raw.get("createdAtEpoch", 0)),
                       _int(raw.get("sealedAtEpoch", 0)))
        except (KeyError, TypeError, ValueError) as error:
            raise LayoutError(f"bad segment record {raw!r}: {error}") from None
        return info


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LayoutError(f"expected a non-negative integer, got {value!r}")
    return value


@dataclass(frozen=True)
class SegmentLayout:
    epoch: int
    next_segment_id: int
    all_segments: Mapping[int, SegmentInfo]
    properties: Mapping[str, str] = field(default_factory=dict)
    incarnation: str | None = None             # None: stored before incarnations existed

    def __post_init__(self) -> None:
        object.__setattr__(self, "all_segments", MappingProxyType(dict(self.all_segments)))
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))
        # Sorted by range start: find_active_segment bisects it.
        active = sorted((s for s in self.all_segments.values() if s.is_active), key=lambda s: s.hash_range.start)
        object.__setattr__(self, "_active", tuple(active))
        object.__setattr__(self, "_starts", [s.hash_range.start for s in active])

    # --- construction -------------------------------------------------------------------

    @classmethod
    def initial(cls, num_segments: int = 1, properties: Mapping[str, str] | None = None) -> SegmentLayout:
        """`num_segments` active root segments dividing [0x0000, 0xFFFF] into equal ranges, epoch 0."""
        if isinstance(num_segments, bool) or not isinstance(num_segments, int) or not 1 <= num_segments <= HASH_SPACE:
            raise LayoutError(f"the number of initial segments is 1..{HASH_SPACE}, not {num_segments!r}")
        segments = {}
        for i in range(num_segments):
            start = HASH_MIN + i * HASH_SPACE // num_segments
            end = HASH_MIN + (i + 1) * HASH_SPACE // num_segments - 1
            segments[i] = SegmentInfo.active(i, HashRange(start, end), 0)
        return cls(0, num_segments, segments, properties or {}, uuid.uuid4().hex)

    # --- queries ------------------------------------------------------------------------

    @property
    def active_segments(self) -> tuple[SegmentInfo, ...]:
        """The ACTIVE segments sorted by the start of their hash range."""
        return self._active  # type: ignore[attr-defined]

    def segment(self, segment_id: int) -> SegmentInfo:
        if isinstance(segment_id, bool):        # True would look up (and split) segment 1
            raise TypeError(f"segment id must be an int, not {type(segment_id).__name__}")
        try:
            return self.all_segments[segment_id]
        except (KeyError, TypeError):
            raise SegmentNotFoundError(f"segment {segment_id!r} not found") from None

    def find_active_segment(self, hash_value: int) -> SegmentInfo:
        """The active segment whose range holds `hash_value` (producers route with it)."""
        if not HASH_MIN <= hash_value <= HASH_MAX:
            raise LayoutError(f"hash {hash_value} outside [0x0000, 0xFFFF]")
        index = bisect.bisect_right(self._starts, hash_value) - 1  # type: ignore[attr-defined]
        if index >= 0:
            candidate = self._active[index]  # type: ignore[attr-defined]
            if candidate.hash_range.contains(hash_value):
                return candidate
        raise LayoutError(f"no active segment covers hash 0x{hash_value:04x}")

    def segment_for_key(self, key: str | bytes) -> SegmentInfo:
        return self.find_active_segment(key_hash(key))

    def parents(self, segment_id: int) -> list[SegmentInfo]:
        return [self.all_segments[i] for i in self.segment(segment_id).parent_ids if i in self.all_segments]

    def children(self, segment_id: int) -> list[SegmentInfo]:
        return [self.all_segments[i] for i in self.segment(segment_id).child_ids if i in self.all_segments]

    def lineage(self, segment_id: int) -> list[SegmentInfo]:
        """Ancestors (oldest first), the segment, then descendants, each once (a merge joins two
        ancestries, so a plain walk would repeat shared ancestors)."""
        self.segment(segment_id)
        seen: set[int] = set()
        ancestors: list[SegmentInfo] = []

        def up(sid: int) -> None:
            for parent in self.parents(sid):
                if parent.segment_id not in seen:
                    up(parent.segment_id)
                    if parent.segment_id not in seen:
                        seen.add(parent.segment_id)
                        ancestors.append(parent)

        def down(sid: int, out: list[SegmentInfo]) -> None:
            for child in self.children(sid):
                if child.segment_id not in seen:
                    seen.add(child.segment_id)
                    out.append(child)
                    down(child.segment_id, out)

        up(segment_id)
        seen.add(segment_id)
        descendants: list[SegmentInfo] = []
        down(segment_id, descendants)
        return [*ancestors, self.all_segments[segment_id], *descendants]

    # --- mutations (each returns a new layout) ------------------------------------------

    def _active_segment(self, segment_id: int) -> SegmentInfo:
        segment = self.segment(segment_id)
        if not segment.is_active:
            raise LayoutError(f"segment {segment_id} is sealed, not active")
        return segment

    def split_segment(self, segment_id: int) -> SegmentLayout:
        parent = self._active_segment(segment_id)
        low, high = parent.hash_range.split()
        epoch, first = self.epoch + 1, self.next_segment_id
        segments = dict(self.all_segments)
        segments[segment_id] = parent.sealed(epoch, (first, first + 1))
        segments[first] = SegmentInfo.active(first, low, epoch, (segment_id,))
        segments[first + 1] = SegmentInfo.active(first + 1, high, epoch, (segment_id,))
        return SegmentLayout(epoch, first + 2, segments, self.properties, self.incarnation)

    def merge_segments(self, segment_id1: int, segment_id2: int) -> SegmentLayout:
        if segment_id1 == segment_id2:
            raise LayoutError(f"cannot merge segment {segment_id1} with itself")
        one, two = self._active_segment(segment_id1), self._active_segment(segment_id2)
        merged_range = one.hash_range.merge(two.hash_range)
        epoch, merged = self.epoch + 1, self.next_segment_id
        segments = dict(self.all_segments)
        segments[segment_id1] = one.sealed(epoch, (merged,))
        segments[segment_id2] = two.sealed(epoch, (merged,))
        segments[merged] = SegmentInfo.active(merged, merged_range, epoch, (segment_id1, segment_id2))
        return SegmentLayout(epoch, merged + 1, segments, self.properties, self.incarnation)

    def prune_segment(self, segment_id: int) -> SegmentLayout:
        """Remove a sealed segment (its data expired) and the links to it."""
        pruned = self.segment(segment_id)
        if pruned.is_active:
            raise LayoutError(f"segment {segment_id} is active: only sealed segments can be pruned")
        segments = dict(self.all_segments)
        del segments[segment_id]
        for child_id in pruned.child_ids:
            child = segments.get(child_id)
            if child is not None:
                segments[child_id] = _replace(child, parent_ids=tuple(i for i in child.parent_ids if i != segment_id))
        for parent_id in pruned.parent_ids:
            parent = segments.get(parent_id)
            if parent is not None:
                segments[parent_id] = _replace(parent, child_ids=tuple(i for i in parent.child_ids if i != segment_id))
        return SegmentLayout(self.epoch + 1, self.next_segment_id, segments, self.properties, self.incarnation)

    # --- metadata (the spec's ScalableTopicMetadata JSON) -------------------------------

    def to_metadata(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "nextSegmentId": self.next_segment_id,
                "segments": {str(sid): info.to_json() for sid, info in sorted(self.all_segments.items())},
                "properties": dict(self.properties),
                **({"incarnation": self.incarnation} if self.incarnation is not None else {})}

    def to_json_bytes(self) -> bytes:
        return json.dumps(self.to_metadata(), separators=(",", ":")).encode()

    @classmethod
    def from_metadata(cls, raw: Any) -> SegmentLayout:
        """A layout from its JSON form, checked: ids match their keys, links point both ways, the
        active segments tile [0x0000, 0xFFFF]."""
        if isinstance(raw, (bytes, bytearray, memoryview)):
            try:
                raw = json.loads(bytes(raw))
            except ValueError as error:
                raise LayoutError(f"scalable topic metadata is not JSON: {error}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("segments"), dict):
            raise LayoutError("scalable topic metadata is an object with a 'segments' object")
        segments = {}
        for key, value in raw["segments"].items():
            info = SegmentInfo.from_json(value)
            if str(info.segment_id) != key:
                raise LayoutError(f"segment record under key {key!r} has id {info.segment_id}")
            segments[info.segment_id] = info
        properties = raw.get("properties") or {}
        if not isinstance(properties, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in properties.items()):
            raise LayoutError("scalable topic properties are a string-to-string object")
        incarnation = raw.get("incarnation")
        if incarnation is not None and (not isinstance(incarnation, str) or not incarnation):
            raise LayoutError(f"a scalable topic's incarnation is a non-empty string, not {incarnation!r}")
        layout = cls(_int(raw.get("epoch")), _int(raw.get("nextSegmentId")), segments, properties, incarnation)
        layout.check()
        return layout

    def check(self) -> None:
        """Raise LayoutError unless the DAG is consistent."""
        for sid, info in self.all_segments.items():
            if sid >= self.next_segment_id:
                raise LayoutError(f"segment {sid} not below nextSegmentId {self.next_segment_id}")
            if info.is_active and (info.child_ids or info.sealed_at_epoch):
                raise LayoutError(f"active segment {sid} has children or a seal epoch")
            if not info.is_active and info.sealed_at_epoch <= info.created_at_epoch:
                raise LayoutError(f"sealed segment {sid} sealed at epoch {info.sealed_at_epoch}, "
                                  f"not after its creation at {info.created_at_epoch}")
            if max(info.created_at_epoch, info.sealed_at_epoch) > self.epoch:
                raise LayoutError(f"segment {sid} is from an epoch after the layout's {self.epoch}")
            for child in info.child_ids:
                if child in self.all_segments and sid not in self.all_segments[child].parent_ids:
                    raise LayoutError(f"segment {sid} lists child {child} that does not list it as a parent")
            for parent in info.parent_ids:
                # ids are handed out in creation order, a child after its parents: this also
                # keeps the DAG acyclic (a cycle made lineage() and the coordinator's drain
                # gate recurse without end)
                if parent >= sid:
                    raise LayoutError(f"segment {sid} lists parent {parent}, not created before it")
                if parent in self.all_segments and sid not in self.all_segments[parent].child_ids:
                    raise LayoutError(f"segment {sid} lists parent {parent} that does not list it as a child")
        expected = HASH_MIN
        for info in self.active_segments:
            if info.hash_range.start != expected:
                raise LayoutError(f"active segments do not tile the hash space at 0x{expected:04x}")
            expected = info.hash_range.end + 1
        if expected != HASH_MAX + 1:
            raise LayoutError(f"active segments do not cover the hash space from 0x{expected:04x}")


def _replace(info: SegmentInfo, **changes: Any) -> SegmentInfo:
    return dataclasses.replace(info, **changes)
