"""Topic names, normalised as Pulsar does.

`my-topic` is `persistent://public/default/my-topic`; `tenant/ns/topic` gets the `persistent://`
domain; a partition of a partitioned topic is `<topic>-partition-<n>`, `n` written as Pulsar
writes it (decimal, no sign, no leading zero, a Java int). Names are compared and stored in their
normalised (full) form only.

Pulsar also reads a legacy V1 name, `persistent://tenant/cluster/namespace/topic`: its TopicName
takes any fourth part as the local name of a namespace `tenant/cluster/namespace`, so a V2 local
name never contains '/'. pyengine has no cluster level, and does not support V1 names: a
persistent or non-persistent name with a '/' in its topic part is refused (InvalidTopicNameError)
rather than read as a topic whose local name contains a '/'.

Scalable topics (PIP-468) add two domains: `topic://tenant/ns/name` names a scalable topic (its
segment DAG lives in the metadata store; it has no ledger of its own), and
`segment://tenant/ns/name/{hexStart}-{hexEnd}-{segmentId}` names one segment of it, a topic with a
managed ledger like a persistent one. The descriptor is Pulsar's `%04x-%04x-%d` (lowercase hex,
the hash range inclusive).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from pyengine.errors import InvalidTopicNameError

DOMAINS = ("persistent", "non-persistent", "segment", "topic")
PARTITION_SUFFIX = "-partition-"
# Pulsar allows these in tenant / namespace names; topic local names are freer.
_NAME_PART = re.compile(r"^[-=:.\w]+$")
_MAX_NAME = 1024
# A stored name is an LMDB key (at most 511 bytes), some with a suffix: topic, subscription and
# producer names are limited to this many UTF-8 bytes, so that none fails a group commit that
# other clients' writes share.
MAX_NAME_BYTES = 384


def stored_name_problem(kind: str, name: str) -> str | None:
    """Why `name` (a subscription's or a producer's) cannot be stored, or None."""
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        return f"a {kind} name must be valid text (UTF-8): {name!r}"
    if size > MAX_NAME_BYTES:
        return f"a {kind} name has at most {MAX_NAME_BYTES} bytes (UTF-8), not {size}"
    return None
HASH_MIN, HASH_MAX = 0x0000, 0xFFFF
_DESCRIPTOR = re.compile(r"^([0-9a-fA-F]{4})-([0-9a-fA-F]{4})-(0|[1-9][0-9]{0,18})$")
_PARTITION_INDEX = re.compile(r"0|[1-9][0-9]{0,9}")        # as Pulsar reads it: ASCII, no sign, no leading 0
_MAX_PARTITION_INDEX = 2**31 - 1


def format_segment_descriptor(start: int, end: int, segment_id: int) -> str:
    """`{hexStart}-{hexEnd}-{segmentId}`, as Pulsar's SegmentTopicName.formatDescriptor."""
    if not (HASH_MIN <= start <= end <= HASH_MAX) or segment_id < 0:
        raise ValueError(f"bad segment range/id: [{start}, {end}] id {segment_id}")
    return f"{start:04x}-{end:04x}-{segment_id}"


def parse_segment_descriptor(descriptor: str) -> tuple[int, int, int]:
    """(start, end, segment_id) of a descriptor; InvalidTopicNameError when malformed."""
    match = _DESCRIPTOR.match(descriptor) if isinstance(descriptor, str) else None
    if match is None:
        raise InvalidTopicNameError(
            f"invalid segment descriptor {descriptor!r}: expected {{hexStart}}-{{hexEnd}}-{{segmentId}}, "
            "e.g. 0000-7fff-1")
    start, end, segment_id = int(match[1], 16), int(match[2], 16), int(match[3])
    if start > end:
        raise InvalidTopicNameError(f"invalid segment descriptor {descriptor!r}: start above end")
    if segment_id >= 1 << 63:
        raise InvalidTopicNameError(f"invalid segment descriptor {descriptor!r}: segment id out of range")
    return start, end, segment_id


@dataclass(frozen=True, slots=True)
class TopicName:
    domain: str
    tenant: str
    namespace: str
    local_name: str

    @classmethod
    def parse(cls, name: str) -> TopicName:
        if not isinstance(name, str):
            raise InvalidTopicNameError(f"a topic name is a string, not {type(name).__name__}")
        if not name or len(name) > _MAX_NAME:
            raise InvalidTopicNameError(f"invalid topic name {name!r}: empty or longer than {_MAX_NAME}")
        domain, sep, rest = name.partition("://")
        if not sep:
            domain, rest = "persistent", name
            parts = rest.split("/")
            if len(parts) == 1:
                parts = ["public", "default", parts[0]]
        else:
            parts = rest.split("/", 2)
        if domain not in DOMAINS:
            raise InvalidTopicNameError(f"invalid topic name {name!r}: unknown domain {domain!r}")
        if len(parts) != 3 or not all(parts):
            raise InvalidTopicNameError(
                f"invalid topic name {name!r}: expected [domain://]tenant/namespace/topic or a short name")
        tenant, namespace, local = parts
        for label, part in (("tenant", tenant), ("namespace", namespace)):
            if not _NAME_PART.match(part):
                raise InvalidTopicNameError(f"invalid topic name {name!r}: bad {label} {part!r}")
        if any(ch in local for ch in "\n\r\0") or local.strip() != local:
            raise InvalidTopicNameError(f"invalid topic name {name!r}: bad characters in {local!r}")
        if domain == "segment":
            base, sep, descriptor = local.rpartition("/")
            if not sep or not base or "/" in base:
                raise InvalidTopicNameError(
                    f"invalid segment name {name!r}: expected segment://tenant/namespace/topic/"
                    "{hexStart}-{hexEnd}-{segmentId}")
            start, end, segment_id = parse_segment_descriptor(descriptor)
            local = f"{base}/{format_segment_descriptor(start, end, segment_id)}"   # canonical (lowercase)
        elif domain == "topic" and "/" in local:
            raise InvalidTopicNameError(f"invalid scalable topic name {name!r}: no '/' in the topic part")
        elif "/" in local:
            raise InvalidTopicNameError(
                f"invalid topic name {name!r}: V1 topic names ({domain}://tenant/cluster/namespace/topic) "
                f"are not supported, use {domain}://tenant/namespace/topic (no '/' in the topic part)")
        parsed = cls(domain, tenant, namespace, local)
        try:
            size = len(str(parsed).encode())
        except UnicodeEncodeError:
            raise InvalidTopicNameError(f"invalid topic name {name!r}: not encodable as UTF-8") from None
        if size > MAX_NAME_BYTES:
            raise InvalidTopicNameError(f"invalid topic name {name!r}: longer than {MAX_NAME_BYTES} bytes (UTF-8) "
                                        "in full; names are keys of the broker's storage")
        return parsed

    @classmethod
    def segment(cls, parent: TopicName | str, start: int, end: int, segment_id: int) -> TopicName:
        """The `segment://` topic of segment `segment_id` of scalable topic `parent`."""
        parent = parent if isinstance(parent, TopicName) else cls.parse(parent)
        if parent.domain != "topic":
            raise InvalidTopicNameError(f"a segment's parent is a topic:// name, not {parent}")
        return cls("segment", parent.tenant, parent.namespace,
                   f"{parent.local_name}/{format_segment_descriptor(start, end, segment_id)}")

    @property
    def is_segment(self) -> bool:
        return self.domain == "segment"

    @property
    def is_scalable(self) -> bool:
        """A `topic://` name: a scalable topic, whose data lives in its segments."""
        return self.domain == "topic"

    @property
    def scalable_topic(self) -> TopicName:
        """The `topic://` topic a segment belongs to."""
        if not self.is_segment:
            raise InvalidTopicNameError(f"{self} is not a segment:// topic")
        return TopicName("topic", self.tenant, self.namespace, self.local_name.rpartition("/")[0])

    @property
    def segment_descriptor(self) -> str:
        if not self.is_segment:
            raise InvalidTopicNameError(f"{self} is not a segment:// topic")
        return self.local_name.rpartition("/")[2]

    @property
    def segment_range(self) -> tuple[int, int]:
        """The inclusive hash range [start, end] of a segment topic."""
        start, end, _ = parse_segment_descriptor(self.segment_descriptor)
        return start, end

    @property
    def segment_id(self) -> int:
        return parse_segment_descriptor(self.segment_descriptor)[2]

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local_name}"

    @property
    def namespace_name(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    @property
    def partition_index(self) -> int:
        """The partition number of `<topic>-partition-<n>`, else -1."""
        base, sep, index = self.local_name.rpartition(PARTITION_SUFFIX)
        if not (sep and base and _PARTITION_INDEX.fullmatch(index)) or int(index) > _MAX_PARTITION_INDEX:
            return -1
        return int(index)

    @property
    def partitioned_topic(self) -> TopicName:
        """The partitioned topic a partition belongs to (itself when not a partition)."""
        if self.partition_index < 0:
            return self
        return TopicName(self.domain, self.tenant, self.namespace, self.local_name.rpartition(PARTITION_SUFFIX)[0])

    def partition(self, index: int) -> TopicName:
        if not 0 <= index <= _MAX_PARTITION_INDEX:
            raise ValueError(f"a partition index is in [0, {_MAX_PARTITION_INDEX}]")
        return TopicName(self.domain, self.tenant, self.namespace, f"{self.local_name}{PARTITION_SUFFIX}{index}")


def normalize_topic(name: str) -> str:
    """The full form of a topic name (raises InvalidTopicNameError)."""
    if type(name) is not str:
        return str(TopicName.parse(name))       # which says what is wrong with it
    return _normalized(name)


@lru_cache(maxsize=4096)
def _normalized(name: str) -> str:
    # Cached: a transaction's registrations name the same few topics again and again, and
    # parsing one takes ~3 us.
    return str(TopicName.parse(name))
