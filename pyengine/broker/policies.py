"""Tenants, namespaces, partitioned topics and their policies: what Pulsar keeps in its
configuration store and the admin API manages.

Records are JSON under `/admin/...` keys of the data dir's metadata database: tenants
(`/admin/tenants/<tenant>`), namespaces with their policies (`/admin/namespaces/<t>/<ns>`),
partitioned topics (`/admin/partitioned/<topic>` -> number of partitions, or, for one with topic
properties, `{"partitions": n, "properties": {...}}`: a bare number is what data dirs written
before topic properties hold, and still what one without them is written as) and topic-level
policies (`/admin/topic-policies/<topic>`). Tenant `public` with namespace `default`, and the
system namespace `pulsar/system` holding the transaction coordinators' assign topic, exist from
the start, as in a Pulsar standalone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from dataclasses import asdict, dataclass, field
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from pyengine.broker.topic_properties import check_properties
from pyengine.errors import InvalidTopicNameError, NotAllowedError, PulsarError
from pyengine.naming import PARTITION_SUFFIX, TopicName
from pyengine.storage import StorageEnvironment
from pyengine.storage.environment import WriteFn, all_of

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[-=:.\w]+$")
DEFAULT_NAMESPACES = ("public/default", "pulsar/system")
TC_ASSIGN_TOPIC = "persistent://pulsar/system/transaction_coordinator_assign"
HEALTH_CHECK_TOPIC = "persistent://pulsar/system/healthcheck"      # see pyengine.admin.routes_brokers


class NotFoundError(PulsarError):
    """An admin object (tenant, namespace, partitioned topic) does not exist (HTTP 404)."""


class ConflictError(PulsarError):
    """An admin object already exists, or is still in use (HTTP 409)."""


@dataclass
class NamespacePolicies:
    deduplication_enabled: bool | None = None      # None: the broker's default
    retention_time_minutes: int | None = None
    retention_size_mb: int | None = None
    message_ttl_seconds: int | None = None          # Pulsar's message_ttl_in_seconds (None: the broker's default)
    transaction_version: int | None = None         # 4 | 5 overrides the topic domain's default (PIP-473)
    # Schema registry (None: the broker's default): a SchemaCompatibilityStrategy name, whether
    # a new schema may be registered by a producer or consumer, whether a producer without a
    # schema is refused on a topic that has one.
    schema_compatibility_strategy: str | None = None
    is_allow_auto_update_schema: bool | None = None
    schema_validation_enforced: bool | None = None
    # Pulsar's DelayedDeliveryPolicies of the namespace (None: the broker's default).
    delayed_delivery: dict[str, Any] | None = None
    # Pulsar's max_unacked_messages_per_consumer / _per_subscription (None: the broker's
    # default; 0: no limit).
    max_unacked_messages_per_consumer: int | None = None
    max_unacked_messages_per_subscription: int | None = None
    # Pulsar's max_producers_per_topic, max_consumers_per_topic, max_consumers_per_subscription
    # (None: the broker's default; 0: no limit).
    max_producers_per_topic: int | None = None
    max_consumers_per_topic: int | None = None
    max_consumers_per_subscription: int | None = None
    # Pulsar's backlog_quota_map: BacklogQuota JSON by BacklogQuotaType name (None: none set).
    backlog_quota_map: dict[str, dict[str, Any]] | None = None
    # Pulsar's inactive_topic_policies: InactiveTopicPolicies JSON (None: the broker's default).
    inactive_topic_policies: dict[str, Any] | None = None
    # Pulsar's autoTopicCreationOverride: AutoTopicCreation JSON (None: the broker's setting).
    auto_topic_creation_override: dict[str, Any] | None = None
    # Pulsar's autoSubscriptionCreationOverride: {"allowAutoSubscriptionCreation": B} (None: the
    # broker's setting).
    auto_subscription_creation_override: dict[str, Any] | None = None
    properties: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NamespacePolicies:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass(frozen=True)
class Retention:
    """Pulsar's RetentionPolicies: how long (minutes) and how much (MB) of a topic's consumed
    ledgers to keep; -1 keeps them without that limit, 0 not at all."""

    time_minutes: int = -1
    size_mb: int = -1

    def __post_init__(self) -> None:
        for name, value in (("retentionTimeInMinutes", self.time_minutes), ("retentionSizeInMB", self.size_mb)):
            if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                raise ValueError(f"{name} must be an integer >= -1, not {value!r}")
        if (self.time_minutes == 0) != (self.size_mb == 0):
            # As Pulsar validates it: a lone 0 next to a limit is ambiguous (-1 means no limit).
            raise ValueError("a retention of 0 minutes or 0 MB is only valid with the other also 0 "
                             "(use -1 for no limit)")

    @classmethod
    def from_json(cls, data: Any) -> Retention:
        """The admin API's body, `{"retentionTimeInMinutes": T, "retentionSizeInMB": S}`."""
        if not isinstance(data, dict) or set(data) - {"retentionTimeInMinutes", "retentionSizeInMB"}:
            raise ValueError("retention policies are {\"retentionTimeInMinutes\": int, \"retentionSizeInMB\": int}, "
                             f"not {data!r}")
        return cls(data.get("retentionTimeInMinutes", 0), data.get("retentionSizeInMB", 0))

    def to_json(self) -> dict[str, int]:
        return {"retentionTimeInMinutes": self.time_minutes, "retentionSizeInMB": self.size_mb}

    @property
    def ms_and_bytes(self) -> tuple[int, int]:
        return (self.time_minutes * 60_000 if self.time_minutes >= 0 else -1,
                self.size_mb << 20 if self.size_mb >= 0 else -1)


@dataclass(frozen=True)
class DelayedDelivery:
    """Pulsar's DelayedDeliveryPolicies: whether messages with a `deliver_at_time` are held
    back on Shared and Key_Shared subscriptions (`active`), and the tick (ms) of the timer
    that releases them: at most one timed release per tick (Pulsar's delayedDeliveryEnabled
    and delayedDeliveryTickTimeMillis, true and 1000 by default). `maxDeliveryDelayInMillis`
    (0: no limit) is a producer-side check and is kept only to round-trip the policy."""

    active: bool = True
    tick_time_ms: int = 1000
    max_delivery_delay_ms: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.active, bool):
            raise ValueError(f"active must be a boolean, not {self.active!r}")
        for name, value in (("tickTime", self.tick_time_ms), ("maxDeliveryDelayInMillis", self.max_delivery_delay_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, not {value!r}")

    @classmethod
    def from_json(cls, data: Any) -> DelayedDelivery:
        if not isinstance(data, dict):
            raise ValueError(f"delayed delivery policies must be an object, not {data!r}")
        return cls(active=data.get("active", True), tick_time_ms=data.get("tickTime", 1000),
                   max_delivery_delay_ms=data.get("maxDeliveryDelayInMillis", 0))

    def to_json(self) -> dict[str, Any]:
        return {"active": self.active, "tickTime": self.tick_time_ms,
                "maxDeliveryDelayInMillis": self.max_delivery_delay_ms}


INACTIVE_TOPIC_DELETE_MODES = ("delete_when_no_subscriptions", "delete_when_subscriptions_caught_up")


@dataclass(frozen=True)
class InactiveTopicPolicies:
    """Pulsar's InactiveTopicPolicies: whether a topic left inactive for
    `max_inactive_duration_seconds` is deleted (`delete_while_inactive`), and what inactive
    means besides having no producer and no consumer (`mode`): no subscription at all
    (`delete_when_no_subscriptions`), or none with a backlog (`delete_when_subscriptions_caught_up`,
    which deletes the caught-up subscriptions with the topic). See `pyengine.broker.inactive`."""

    mode: str = "delete_when_no_subscriptions"
    max_inactive_duration_seconds: int = 60
    delete_while_inactive: bool = True

    def __post_init__(self) -> None:
        if self.mode not in INACTIVE_TOPIC_DELETE_MODES:
            raise ValueError(f"inactiveTopicDeleteMode must be one of {', '.join(INACTIVE_TOPIC_DELETE_MODES)}, "
                             f"not {self.mode!r}")
        value = self.max_inactive_duration_seconds
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
            raise ValueError(f"maxInactiveDurationSeconds must be a whole number of seconds in [0, {MAX_INT}], "
                             f"not {value!r}")
        if not isinstance(self.delete_while_inactive, bool):
            raise ValueError(f"deleteWhileInactive must be a boolean, not {self.delete_while_inactive!r}")

    @classmethod
    def from_json(cls, data: Any) -> InactiveTopicPolicies:
        """The admin API's body, `{"inactiveTopicDeleteMode": M, "maxInactiveDurationSeconds": S,
        "deleteWhileInactive": B}` (a field left out takes Pulsar's default)."""
        fields = {"inactiveTopicDeleteMode", "maxInactiveDurationSeconds", "deleteWhileInactive"}
        if not isinstance(data, dict) or set(data) - fields:
            raise ValueError('inactive topic policies are {"inactiveTopicDeleteMode": str, '
                             f'"maxInactiveDurationSeconds": int, "deleteWhileInactive": bool}}, not {data!r}')
        return cls(data.get("inactiveTopicDeleteMode", "delete_when_no_subscriptions"),
                   data.get("maxInactiveDurationSeconds", 60), data.get("deleteWhileInactive", True))

    def to_json(self) -> dict[str, Any]:
        return {"inactiveTopicDeleteMode": self.mode, "maxInactiveDurationSeconds": self.max_inactive_duration_seconds,
                "deleteWhileInactive": self.delete_while_inactive}


TOPIC_TYPES = ("non-partitioned", "partitioned")       # Pulsar's TopicType names


@dataclass(frozen=True)
class AutoTopicCreation:
    """Pulsar's allowAutoTopicCreation, allowAutoTopicCreationType and defaultNumPartitions, or a
    namespace's AutoTopicCreationOverride: whether a producer or consumer (and a lookup of the
    partitioned metadata) creates a topic that does not exist, and as a partitioned topic of
    `default_num_partitions` or a non-partitioned one. Checked as Pulsar's validateOverride:
    the type and partition count only matter, and are only checked, when creation is allowed."""

    allowed: bool = True
    topic_type: str = "non-partitioned"
    default_num_partitions: int | None = None        # set for (and only for) "partitioned"

    def __post_init__(self) -> None:
        if not isinstance(self.allowed, bool):
            raise ValueError(f"allowAutoTopicCreation must be a boolean, not {self.allowed!r}")
        count = self.default_num_partitions
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            raise ValueError(f"defaultNumPartitions must be a whole number, not {count!r}")
        if not self.allowed:
            return
        if self.topic_type not in TOPIC_TYPES:
            raise ValueError(f"Unknown topic type [{self.topic_type}]: {' or '.join(TOPIC_TYPES)}")
        if self.topic_type == "partitioned":
            if count is None:
                raise ValueError("[defaultNumPartitions] cannot be null when the type is partitioned.")
            if count < 1:
                raise ValueError("[defaultNumPartitions] cannot be less than 1 for partition type.")
        elif count is not None:
            raise ValueError("[defaultNumPartitions] is not allowed to be set when the type is non-partition.")

    @property
    def partitions(self) -> int:
        """How many partitions a topic is created with (0: a non-partitioned topic)."""
        if self.allowed and self.topic_type == "partitioned" and self.default_num_partitions is not None:
            return self.default_num_partitions
        return 0

    @classmethod
    def from_json(cls, data: Any) -> AutoTopicCreation:
        """The admin API's body, `{"allowAutoTopicCreation": B, "topicType": T,
        "defaultNumPartitions": N}` (the type and count may be left out when B is false)."""
        fields = {"allowAutoTopicCreation", "topicType", "defaultNumPartitions"}
        if not isinstance(data, dict) or set(data) - fields or "allowAutoTopicCreation" not in data:
            raise ValueError('an auto topic creation override is {"allowAutoTopicCreation": bool, "topicType": '
                             f'"partitioned" | "non-partitioned", "defaultNumPartitions": int}}, not {data!r}')
        return cls(data["allowAutoTopicCreation"], data.get("topicType"), data.get("defaultNumPartitions"))

    def to_json(self) -> dict[str, Any]:
        return {"allowAutoTopicCreation": self.allowed, "topicType": self.topic_type,
                "defaultNumPartitions": self.default_num_partitions}


def auto_subscription_creation_of(data: Any) -> bool:
    """Pulsar's AutoSubscriptionCreationOverride, `{"allowAutoSubscriptionCreation": B}`: whether
    a consumer creates a durable subscription that does not exist (else SubscriptionNotFound)."""
    if not isinstance(data, dict) or set(data) != {"allowAutoSubscriptionCreation"} or not isinstance(
            data["allowAutoSubscriptionCreation"], bool):
        raise ValueError(f'an auto subscription creation override is {{"allowAutoSubscriptionCreation": bool}}, '
                         f'not {data!r}')
    return data["allowAutoSubscriptionCreation"]


MAX_MESSAGE_TTL = 2**31 - 1        # Pulsar keeps a TTL in a Java int


def check_message_ttl(value: Any) -> int:
    """A message TTL in seconds (0: no expiry), as Pulsar accepts it: an int, not negative."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_MESSAGE_TTL:
        raise ValueError(f"a message TTL is a whole number of seconds in [0, {MAX_MESSAGE_TTL}], not {value!r}")
    return value


MAX_INT = 2**31 - 1                # Pulsar keeps these limits in Java ints


@dataclass(frozen=True)
class UnackedLimits:
    """How many messages a Shared or Key_Shared subscription may have delivered and not yet
    acknowledged, per consumer and in all (0: no limit). Pulsar's
    maxUnackedMessagesPerConsumer and maxUnackedMessagesPerSubscription: 50000 and 200000."""

    per_consumer: int = 50_000
    per_subscription: int = 200_000

    def __post_init__(self) -> None:
        check_limit("maxUnackedMessagesPerConsumer", self.per_consumer)
        check_limit("maxUnackedMessagesPerSubscription", self.per_subscription)


@dataclass(frozen=True)
class ConnectionLimits:
    """How many producers a topic, and how many consumers a topic and each of its subscriptions,
    may have (0: no limit, Pulsar's default): maxProducersPerTopic, maxConsumersPerTopic,
    maxConsumersPerSubscription."""

    producers_per_topic: int = 0
    consumers_per_topic: int = 0
    consumers_per_subscription: int = 0

    def __post_init__(self) -> None:
        check_limit("maxProducersPerTopic", self.producers_per_topic)
        check_limit("maxConsumersPerTopic", self.consumers_per_topic)
        check_limit("maxConsumersPerSubscription", self.consumers_per_subscription)


BACKLOG_QUOTA_TYPES = ("destination_storage", "message_age")
BACKLOG_RETENTION_POLICIES = ("producer_request_hold", "producer_exception", "consumer_backlog_eviction")
MAX_LONG = 2**63 - 1


@dataclass(frozen=True)
class BacklogQuota:
    """Pulsar's BacklogQuota: how many bytes (`limitSize`) or how old (`limitTime`, seconds) a
    topic's backlog may be (-1: no limit; a destination_storage quota applies its size, a
    message_age quota its time), and what happens past it (`policy`): new producers are
    refused (producer_request_hold: the Java client retries; producer_exception: it fails), or
    the slowest subscriptions are moved forward (consumer_backlog_eviction)."""

    limit_size: int = -1
    limit_time: int = -1
    policy: str = "producer_request_hold"

    def __post_init__(self) -> None:
        for name, value, top in (("limitSize", self.limit_size, MAX_LONG), ("limitTime", self.limit_time, MAX_INT)):
            if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= top:
                raise ValueError(f"{name} must be a whole number in [-1, {top}] (-1: no limit), not {value!r}")
        if self.policy not in BACKLOG_RETENTION_POLICIES:
            raise ValueError(f"policy must be one of {', '.join(BACKLOG_RETENTION_POLICIES)}, not {self.policy!r}")

    @classmethod
    def from_json(cls, data: Any) -> BacklogQuota:
        """The admin API's body, `{"limitSize": bytes, "limitTime": seconds, "policy": name}`
        (`limit`: the deprecated name of limitSize, as Pulsar still accepts it)."""
        known = {"limit", "limitSize", "limitTime", "policy"}
        if not isinstance(data, dict) or set(data) - known:
            policies = " | ".join(BACKLOG_RETENTION_POLICIES)
            raise ValueError(f'a backlog quota is {{"limitSize": int, "limitTime": int, "policy": {policies}}}, '
                             f"not {data!r}")
        size = data.get("limitSize")
        if size is None:
            size = data.get("limit", -1)
        return cls(size, data.get("limitTime", -1), data.get("policy") or "producer_request_hold")

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit_size, "limitSize": self.limit_size, "limitTime": self.limit_time,
                "policy": self.policy}


def check_limit(name: str, value: Any) -> int:
    """A count limit as Pulsar keeps one: an int in [0, 2^31 - 1], 0 meaning no limit."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise ValueError(f"{name} must be a whole number in [0, {MAX_INT}] (0: no limit), not {value!r}")
    return value


def check_partitioned_topic_name(name: TopicName) -> None:
    """As Pulsar's validatePartitionedTopicName: a partitioned topic's name never contains
    "-partition-", which would make the names of its partitions ambiguous (InvalidTopicNameError)."""
    if PARTITION_SUFFIX in name.local_name:
        raise InvalidTopicNameError(f"{name}: the name of a partitioned topic cannot contain '{PARTITION_SUFFIX}'")


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidTopicNameError(f"invalid {kind} name {name!r}")
    return name


class BrokerPolicies:
    """Admin metadata of one broker's data dir, read-through cached."""

    def __init__(self, env: StorageEnvironment, *, num_coordinators: int, deduplication_default: bool,
                 retention_default: Retention | None = None,
                 delayed_delivery_default: DelayedDelivery | None = None,
                 message_ttl_default: int = 0, unacked_limits_default: UnackedLimits | None = None,
                 connection_limits_default: ConnectionLimits | None = None,
                 backlog_quota_default: BacklogQuota | None = None,
                 inactive_topic_default: InactiveTopicPolicies | None = None,
                 auto_topic_creation_default: AutoTopicCreation | None = None,
                 auto_subscription_creation_default: bool = True) -> None:
        self.env = env
        self._db = env.db("metadata")
        self.deduplication_default = deduplication_default
        self.retention_default = retention_default or Retention()
        self.delayed_delivery_default = delayed_delivery_default or DelayedDelivery()
        self.message_ttl_default = check_message_ttl(message_ttl_default)
        self.unacked_limits_default = unacked_limits_default or UnackedLimits()
        self.connection_limits_default = connection_limits_default or ConnectionLimits()
        self.backlog_quota_default = backlog_quota_default or BacklogQuota()
        self.inactive_topic_default = inactive_topic_default or InactiveTopicPolicies()
        self.auto_topic_creation_default = auto_topic_creation_default or AutoTopicCreation()
        self.auto_subscription_creation_default = auto_subscription_creation_default
        self.num_coordinators = num_coordinators
        self._cache: dict[str, Any] = {}
        self._writing: dict[str, asyncio.Future[Any]] = {}     # key -> its latest write, until durable
        self.version = 0                # counts the changes: lets a topic cache what it derived
        self._policy_listeners: list[Callable[[], None]] = []

    def on_policy_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` after every change of a namespace's or a topic's policies, whoever
        makes it (the admin API, an embedding application): the broker applies them to its
        loaded topics there, once."""
        self._policy_listeners.append(listener)

    def _policies_changed(self) -> None:
        for listener in self._policy_listeners:
            listener()

    # --- raw records ----------------------------------------------------------------------

    def _get(self, key: str) -> Any:
        if key in self._cache:
            return self._cache[key]
        with self.env.read() as txn:
            raw = txn.get(key.encode(), db=self._db)
        if raw is None:
            return None     # not kept: every name ever asked for (a typo, a scan) would stay cached
        value = json.loads(raw)
        self._cache[key] = value
        return value

    async def _put(self, key: str, value: Any, durable: Callable[[], None] | None = None) -> None:
        raw, db = json.dumps(value, sort_keys=True).encode(), self._db
        await self._write(key, value, lambda txn: txn.put(key.encode(), raw, db=db), durable=durable)

    async def _delete(self, key: str, also: WriteFn | None = None, durable: Callable[[], None] | None = None) -> None:
        """Delete `key`'s record; `also`: what goes in the same LMDB write, `durable`: what is
        done once it is (see `_write`)."""
        db = self._db

        def delete(txn: Any) -> None:
            txn.delete(key.encode(), db=db)
        await self._write(key, None, delete if also is None else all_of([delete, also]), alone=also is not None,
                          durable=durable)

    def _deleting(self, key: str) -> bool:
        """`key`'s record is being deleted: the cache says so, the store not yet."""
        return key in self._writing and self._cache.get(key) is None

    async def _write(self, key: str, value: Any, write: Callable[[Any], Any], *, alone: bool = False,
                     durable: Callable[[], None] | None = None) -> None:
        """Store `value` under `key`. The cache holds it from now on, before the write is
        durable: a change made meanwhile (read, change, write, all in one event-loop turn, as
        every setter here does) starts from it instead of overwriting it with the state before
        (two policy changes at once both kept, as Pulsar's versioned read-modify-write). The
        writes of one key coalesce in order; a failed one leaves the cache to the store again.
        `alone`: `write` does more than the key's record, so a later write of the key may not
        replace it in the group commit (it is written after it instead). `durable`: called once
        the write is, from its done-callback (a caller that stops waiting cannot skip it)."""
        self._cache[key] = value
        self.version += 1

        def forget() -> None:
            if key in self._cache and self._cache[key] is value:
                del self._cache[key]          # not written: read what is stored

        def settled(future: asyncio.Future[Any]) -> None:
            if self._writing.get(key) is future:
                del self._writing[key]
            if future.cancelled() or future.exception() is not None:
                forget()
            else:
                if value is None and key not in self._writing:
                    forget()          # deleted for good: a missing record is read, not cached
                if durable is not None:
                    durable()

        try:
            written = self.env.submit(write, key=None if alone else ("policies", key), after=self._writing.get(key))
        except Exception:
            forget()
            raise
        self._writing[key] = written
        written.add_done_callback(settled)
        # Made from the write before it (`after`), not durable yet: written only if that one
        # is, else a change refused with an error was stored with this one, and in force.
        # Shielded: a caller that stops waiting neither refuses the writes made on top of it
        # (a cancelled write counts as failed for them) nor leaves the cache unchecked.
        await asyncio.shield(written)

    def _children(self, prefix: str) -> list[str]:
        names = []
        with self.env.read() as txn:
            cursor = txn.cursor(db=self._db)
            if cursor.set_range(prefix.encode()):
                for key in cursor.iternext(values=False):
                    key = key.decode()
                    if not key.startswith(prefix):
                        break
                    names.append(key[len(prefix):])
        # Also the records being created (in force from the start, as the cache says: a tenant
        # was deleted as empty while a namespace of it was created). One being deleted is
        # kept until that is durable (if it fails, it was there all along).
        created = [key[len(prefix):] for key in self._writing
                   if key.startswith(prefix) and self._cache.get(key) is not None]
        return sorted(set(names).union(created)) if created else names

    # --- tenants and namespaces -----------------------------------------------------------

    async def ensure_defaults(self) -> None:
        for namespace in DEFAULT_NAMESPACES:
            tenant = namespace.split("/")[0]
            if self._get(f"/admin/tenants/{tenant}") is None:
                await self._put(f"/admin/tenants/{tenant}", {"allowedClusters": ["standalone"], "adminRoles": []})
            if self._get(f"/admin/namespaces/{namespace}") is None:
                await self._put(f"/admin/namespaces/{namespace}", NamespacePolicies().to_json())
        if self.partitions(TC_ASSIGN_TOPIC) != self.coordinators_to_run():
            await self._put_partitioned(TopicName.parse(TC_ASSIGN_TOPIC), self.num_coordinators,
                                        self.partitioned_properties(TC_ASSIGN_TOPIC))

    def coordinators_to_run(self) -> int:
        """How many v4 coordinators this data dir needs: the number asked for, or the number it
        ran before if that is more. As Pulsar never shrinks transaction_coordinator_assign: the
        txns of a coordinator left out would never end, and their topics' read horizons would
        stay where their first entries are."""
        stored = self.partitions(TC_ASSIGN_TOPIC)
        if stored > self.num_coordinators:
            log.warning("this data dir ran %d transaction coordinators: keeping %d, not %d", stored, stored,
                        self.num_coordinators)
            self.num_coordinators = stored
        return self.num_coordinators

    def tenants(self) -> list[str]:
        return self._children("/admin/tenants/")

    def tenant(self, tenant: str) -> dict[str, Any]:
        info = self._get(f"/admin/tenants/{check_name('tenant', tenant)}")
        if info is None:
            raise NotFoundError(f"tenant {tenant} does not exist")
        return info

    async def create_tenant(self, tenant: str, info: dict[str, Any] | None = None) -> None:
        key = f"/admin/tenants/{check_name('tenant', tenant)}"
        # One whose deletion is not durable yet still exists, as Pulsar's until its node is
        # gone (as `create_namespace`): if that write fails, the tenant is back as it was.
        if self._get(key) is not None or self._deleting(key):
            raise ConflictError(f"tenant {tenant} already exists")
        await self._put(f"/admin/tenants/{tenant}", info or {"allowedClusters": ["standalone"], "adminRoles": []})

    async def delete_tenant(self, tenant: str) -> None:
        self.tenant(tenant)
        if self.namespaces(tenant):
            raise ConflictError(f"tenant {tenant} still has namespaces")
        await self._delete(f"/admin/tenants/{tenant}")

    def namespaces(self, tenant: str) -> list[str]:
        self.tenant(tenant)
        return [f"{tenant}/{ns}" for ns in self._children(f"/admin/namespaces/{tenant}/")]

    def namespace_exists(self, namespace: str) -> bool:
        return self._get(f"/admin/namespaces/{namespace}") is not None

    def policies(self, namespace: str) -> NamespacePolicies:
        data = self._get(f"/admin/namespaces/{namespace}")
        if data is None:
            raise NotFoundError(f"namespace {namespace} does not exist")
        return NamespacePolicies.from_json(data)

    async def create_namespace(self, namespace: str, policies: NamespacePolicies | None = None) -> None:
        tenant, _, local = namespace.partition("/")
        check_name("namespace", local)
        self.tenant(tenant)
        # One whose deletion is not durable yet still exists, as Pulsar's until its policies
        # node is gone: created again meanwhile, it would get the deleted one's schemas (their
        # deletion is in that write, their cache forgotten once it is durable).
        if self.namespace_exists(namespace) or self._deleting(f"/admin/namespaces/{namespace}"):
            raise ConflictError(f"namespace {namespace} already exists")
        await self._put(f"/admin/namespaces/{namespace}", (policies or NamespacePolicies()).to_json())

    async def set_policies(self, namespace: str, policies: NamespacePolicies) -> None:
        self.policies(namespace)
        # Applied once written, though the caller stops waiting: stored, a change left out of
        # the loaded topics stayed out of them until they were loaded again.
        await self._put(f"/admin/namespaces/{namespace}", policies.to_json(), durable=self._policies_changed)

    async def delete_namespace(self, namespace: str, *, has_topics: bool, also: WriteFn | None = None,
                               durable: Callable[[], None] | None = None) -> None:
        """`also`: what goes with the namespace's policies in their LMDB write (its schemas,
        `SchemaRegistry.namespace_deletion`): a crash leaves both or neither. `durable`: called
        once that write is, before the namespace can be created again (`forget_namespace`)."""
        self.policies(namespace)
        if namespace in DEFAULT_NAMESPACES:
            raise NotAllowedError(f"namespace {namespace} cannot be deleted")
        if has_topics:
            raise ConflictError(f"namespace {namespace} still has topics")
        await self._delete(f"/admin/namespaces/{namespace}", also, durable)

    # --- partitioned topics ---------------------------------------------------------------

    def partitions(self, topic: str) -> int:
        """Number of partitions of `topic` (0: not a partitioned topic)."""
        return self._partitioned_record(topic)[0]

    def partitioned_properties(self, topic: str) -> dict[str, str]:
        """The topic properties of the partitioned topic `topic` (PartitionedTopicMetadata's)."""
        return dict(self._partitioned_record(topic)[1])

    def _partitioned_record(self, topic: str) -> tuple[int, dict[str, str]]:
        stored = self._get(f"/admin/partitioned/{TopicName.parse(topic)}")
        if isinstance(stored, dict):
            return stored["partitions"], stored["properties"]
        return stored or 0, {}

    async def _put_partitioned(self, name: TopicName, partitions: int, properties: dict[str, str]) -> None:
        value = {"partitions": partitions, "properties": properties} if properties else partitions
        await self._put(f"/admin/partitioned/{name}", value)

    def partitioned_topics(self, namespace: str) -> list[str]:
        prefix = "/admin/partitioned/"
        return [name for name in self._children(prefix) if TopicName.parse(name).namespace_name == namespace]

    async def create_partitioned_topic(self, topic: str, partitions: int,
                                       properties: Mapping[str, str] | None = None) -> None:
        name = TopicName.parse(topic)
        check_partitioned_topic_name(name)
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise ValueError(f"the number of partitions must be an int >= 1, not {partitions!r}")
        checked = check_properties(properties or {})
        self.policies(name.namespace_name)
        if self.partitions(str(name)):
            raise ConflictError(f"partitioned topic {name} already exists")
        highest = self.max_partition_index(str(name))
        if highest >= partitions:
            # As Pulsar (AdminResource.getMaxPartitionIndex): its stored partitions (left from
            # before, or created by name) must all be partitions of the new partitioned topic.
            raise ConflictError(f"The topic has a max partition index of {highest}, the number of partitions "
                                f"must be at least {highest + 1}")
        await self._put_partitioned(name, partitions, checked)

    def max_partition_index(self, topic: str) -> int:
        """The highest n of a stored topic `<topic>-partition-<n>`, -1 if there is none."""
        name = TopicName.parse(topic)
        prefix = f"{name}{PARTITION_SUFFIX}"
        highest = -1
        with self.env.read() as txn:
            cursor = txn.cursor(db=self.env.db("topics"))
            if cursor.set_range(prefix.encode()):
                for key in cursor.iternext(values=False):
                    stored = key.decode()
                    if not stored.startswith(prefix):
                        break
                    item = TopicName.parse(stored)
                    if item.partition_index > highest and item.partitioned_topic == name:
                        highest = item.partition_index
        return highest

    async def update_partitions(self, topic: str, partitions: int) -> None:
        current = self.partitions(topic)
        if not current:
            raise NotFoundError(f"partitioned topic {topic} does not exist")
        if not isinstance(partitions, int) or partitions < current:
            raise ValueError(f"partitions can only grow (from {current}), not become {partitions!r}")
        await self._put_partitioned(TopicName.parse(topic), partitions, self.partitioned_properties(topic))

    async def update_partitioned_properties(self, topic: str, changes: Mapping[str, str | None]) -> None:
        """Set (None: delete) topic properties of the partitioned topic `topic`, merged into
        the ones it has (as Pulsar's update of PartitionedTopicMetadata.properties)."""
        checked = check_properties(changes, deletions=True)
        partitions, properties = self._partitioned_record(topic)
        if not partitions:
            raise NotFoundError(f"partitioned topic {topic} does not exist")
        updated = dict(properties)
        for key, value in checked.items():
            if value is None:
                updated.pop(key, None)
            else:
                updated[key] = value
        if updated != properties:
            await self._put_partitioned(TopicName.parse(topic), partitions, updated)

    async def delete_partitioned_topic(self, topic: str, also: Sequence[WriteFn] = ()) -> None:
        """Forget the partitioned topic `topic` and its topic-level policies (its partitions are
        the broker's to delete, before). `also`: writes of the same LMDB transaction (its
        schemas'): a crash leaves all of it, which a retry deletes, or none of it."""
        if not self.partitions(topic):
            raise NotFoundError(f"partitioned topic {topic} does not exist")
        name = TopicName.parse(topic)
        key, db = f"/admin/partitioned/{name}", self._db
        async with self.deleting_topic_policies(str(name)) as policies:
            await self.env.submit(all_of([lambda txn: txn.delete(key.encode(), db=db), policies, *also]))
            self._cache[key] = None
            self.version += 1

    # --- policies that topics read --------------------------------------------------------

    def topic_policies(self, topic: str) -> dict[str, Any]:
        return self._get(f"/admin/topic-policies/{TopicName.parse(topic).partitioned_topic}") or {}

    async def set_topic_policy(self, topic: str, name: str, value: Any) -> None:
        key = f"/admin/topic-policies/{TopicName.parse(topic).partitioned_topic}"
        policies = dict(self._get(key) or {})
        if value is None:
            policies.pop(name, None)
        else:
            policies[name] = value
        await self._put(key, policies, durable=self._policies_changed)      # (as set_policies)

    async def delete_topic_policies(self, topic: str) -> None:
        """Forget the topic-level policies of `topic`, a non-partitioned or partitioned topic
        being deleted, as Pulsar does: a topic created again under its name starts without them.
        A partition has none of its own (it reads its partitioned topic's, which outlive it):
        nothing is removed for one."""
        async with self.deleting_topic_policies(topic) as write:
            await self.env.submit(write)

    @contextlib.asynccontextmanager
    async def deleting_topic_policies(self, topic: str) -> AsyncIterator[WriteFn]:
        """`delete_topic_policies` as a write for the caller to put in the LMDB transaction
        that deletes the topic (in a commit of their own after it, a crash left them to a topic
        created again under its name). Forgotten here once the block ends without an error."""
        name = TopicName.parse(topic)
        key, db = f"/admin/topic-policies/{name}", self._db
        if name.partition_index >= 0:
            yield lambda txn: None
            return
        had = self._get(key) is not None
        yield lambda txn: txn.delete(key.encode(), db=db)
        # Deleted for good: no entry is kept for it (nor the "not partitioned" one its loads
        # cached), or the cache would grow with every topic ever deleted.
        self._cache.pop(key, None)
        partitioned = f"/admin/partitioned/{name}"
        if partitioned in self._cache and self._cache[partitioned] is None:
            del self._cache[partitioned]
        self.version += 1
        if had:
            self._policies_changed()

    def deduplication_enabled(self, topic: str) -> bool:
        """Topic policy, else namespace policy, else the broker's default (Pulsar's order)."""
        topic_value = self.topic_policies(topic).get("deduplicationEnabled")
        if topic_value is not None:
            return bool(topic_value)
        name = TopicName.parse(topic)
        if self.namespace_exists(name.namespace_name):
            namespace_value = self.policies(name.namespace_name).deduplication_enabled
            if namespace_value is not None:
                return namespace_value
        return self.deduplication_default

    def retention(self, topic: str) -> Retention:
        """Topic policy, else namespace policy, else the broker's default (Pulsar's order)."""
        topic_value = self.topic_policies(topic).get("retention")
        if topic_value is not None:
            return Retention.from_json(topic_value)
        name = TopicName.parse(topic)
        if self.namespace_exists(name.namespace_name):
            policies = self.policies(name.namespace_name)
            if policies.retention_time_minutes is not None and policies.retention_size_mb is not None:
                return Retention(policies.retention_time_minutes, policies.retention_size_mb)
        return self.retention_default

    def delayed_delivery(self, topic: str) -> DelayedDelivery:
        """Topic policy (`delayedDeliveryPolicies`), else namespace policy, else the broker's
        default (Pulsar's order)."""
        return self._in_force(topic, "delayedDeliveryPolicies", "delayed_delivery", DelayedDelivery.from_json,
                              self.delayed_delivery_default, "delayed delivery policies")

    def inactive_topic_policies(self, topic: str) -> InactiveTopicPolicies:
        """Topic policy (`inactiveTopicPolicies`), else namespace policy, else the broker's
        default (Pulsar's order)."""
        return self._in_force(topic, "inactiveTopicPolicies", "inactive_topic_policies", InactiveTopicPolicies.from_json,
                              self.inactive_topic_default, "inactive topic policies")

    def auto_topic_creation(self, namespace: str) -> AutoTopicCreation:
        """The namespace's override (autoTopicCreationOverride), else the broker's setting (there
        is no topic policy for it: the topic does not exist yet). A stored override that does not
        parse counts as absent."""
        if self.namespace_exists(namespace):
            stored = self.policies(namespace).auto_topic_creation_override
            if stored is not None:
                try:
                    return AutoTopicCreation.from_json(stored)
                except ValueError:
                    log.warning("%s: ignoring a stored auto topic creation override that does not parse: %r",
                                namespace, stored)
        return self.auto_topic_creation_default

    def auto_subscription_creation(self, topic: str) -> bool:
        """Whether a consumer of `topic` creates a durable subscription that does not exist: the
        topic policy (`autoSubscriptionCreation`), else the namespace's override, else the
        broker's allowAutoSubscriptionCreation (Pulsar's order)."""
        return self._in_force(topic, "autoSubscriptionCreation", "auto_subscription_creation_override",
                              auto_subscription_creation_of, self.auto_subscription_creation_default,
                              "auto subscription creation override")

    def message_ttl(self, topic: str) -> int:
        """Seconds after its publish time a message of `topic` expires (0: never): the topic
        policy (`messageTTLInSeconds`), else the namespace policy (`message_ttl_in_seconds`),
        else the broker's default (ttlDurationDefaultInSeconds), Pulsar's order. An explicit 0
        turns expiry off over a default."""
        return self._in_force(topic, "messageTTLInSeconds", "message_ttl_seconds", check_message_ttl,
                              self.message_ttl_default, "message TTL")

    def _in_force(self, topic: str, topic_key: str, namespace_field: str, parse: Callable[[Any], Any],
                  default: Any, what: str) -> Any:
        """`parse` of the topic policy `topic_key`, else of the namespace's `namespace_field`,
        else `default`. A stored value that does not parse (ValueError) counts as absent."""
        name = TopicName.parse(topic)
        namespace_value = (getattr(self.policies(name.namespace_name), namespace_field)
                           if self.namespace_exists(name.namespace_name) else None)
        for value in (self.topic_policies(topic).get(topic_key), namespace_value):
            if value is not None:
                try:
                    return parse(value)
                except ValueError:
                    log.warning("ignoring malformed %s %r of %s", what, value, topic)
        return default

    def unacked_limits(self, topic: str) -> UnackedLimits:
        """Each limit from the topic policy (`maxUnackedMessagesOnConsumer`,
        `maxUnackedMessagesOnSubscription`), else the namespace policy, else the broker's default
        (Pulsar's order)."""
        default = self.unacked_limits_default
        return UnackedLimits(
            self._limit(topic, "maxUnackedMessagesOnConsumer", "max_unacked_messages_per_consumer",
                        default.per_consumer),
            self._limit(topic, "maxUnackedMessagesOnSubscription", "max_unacked_messages_per_subscription",
                        default.per_subscription))

    def connection_limits(self, topic: str) -> ConnectionLimits:
        """Each limit from the topic policy (`maxProducerPerTopic`, `maxConsumerPerTopic`,
        `maxConsumersPerSubscription`, Pulsar's TopicPolicies names), else the namespace
        policy, else the broker's default (Pulsar's order)."""
        default = self.connection_limits_default
        return ConnectionLimits(
            self._limit(topic, "maxProducerPerTopic", "max_producers_per_topic", default.producers_per_topic),
            self._limit(topic, "maxConsumerPerTopic", "max_consumers_per_topic", default.consumers_per_topic),
            self._limit(topic, "maxConsumersPerSubscription", "max_consumers_per_subscription",
                        default.consumers_per_subscription))

    def _limit(self, topic: str, topic_key: str, namespace_field: str, default: int) -> int:
        """A count limit of `topic`: its topic policy, else its namespace's, else `default`. A
        stored value that does not parse counts as absent."""
        name = TopicName.parse(topic)
        namespace = self.policies(name.namespace_name) if self.namespace_exists(name.namespace_name) else None
        for value in (self.topic_policies(topic).get(topic_key), getattr(namespace, namespace_field, None)):
            if value is not None:
                try:
                    return check_limit(topic_key, value)
                except ValueError:
                    log.warning("ignoring malformed %s %r of %s", topic_key, value, topic)
        return default

    def backlog_quota(self, topic: str, quota_type: str) -> BacklogQuota:
        """The backlog quota of `quota_type` in force on `topic`: the topic policy's map
        (`backLogQuotaMap`, Pulsar's TopicPolicies name), else the namespace's
        (`backlog_quota_map`), else the broker's default (Pulsar's order). A stored quota that
        does not parse counts as absent."""
        name = TopicName.parse(topic)
        namespace = self.policies(name.namespace_name) if self.namespace_exists(name.namespace_name) else None
        namespace_map = getattr(namespace, "backlog_quota_map", None)
        for stored in (self.topic_policies(topic).get("backLogQuotaMap"), namespace_map):
            value = (stored or {}).get(quota_type)
            if value is not None:
                try:
                    return BacklogQuota.from_json(value)
                except ValueError:
                    log.warning("ignoring malformed %s backlog quota %r of %s", quota_type, value, topic)
        return self.backlog_quota_default
