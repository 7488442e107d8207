"""Topic names, normalised as Pulsar does.

`my-topic` is `persistent://public/default/my-topic`; `tenant/ns/topic` gets the `persistent://`
domain; a partition of a partitioned topic is `<topic>-partition-<n>`. Names are compared and
stored in their normalised (full) form only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyengine.errors import InvalidTopicNameError

DOMAINS = ("persistent", "non-persistent", "segment", "topic")
PARTITION_SUFFIX = "-partition-"
# Pulsar allows these in tenant / namespace names; topic local names are freer.
_NAME_PART = re.compile(r"^[-=:.\w]+$")
_MAX_NAME = 1024


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
        return cls(domain, tenant, namespace, local)

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local_name}"

    @property
    def namespace_name(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    @property
    def partition_index(self) -> int:
        """The partition number of `<topic>-partition-<n>`, else -1."""
        base, sep, index = self.local_name.rpartition(PARTITION_SUFFIX)
        return int(index) if sep and base and index.isdigit() else -1

    @property
    def partitioned_topic(self) -> TopicName:
        """The partitioned topic a partition belongs to (itself when not a partition)."""
        if self.partition_index < 0:
            return self
        return TopicName(self.domain, self.tenant, self.namespace, self.local_name.rpartition(PARTITION_SUFFIX)[0])

    def partition(self, index: int) -> TopicName:
        if index < 0:
            raise ValueError("a partition index is >= 0")
        return TopicName(self.domain, self.tenant, self.namespace, f"{self.local_name}{PARTITION_SUFFIX}{index}")


def normalize_topic(name: str) -> str:
    """The full form of a topic name (raises InvalidTopicNameError)."""
    return str(TopicName.parse(name))
