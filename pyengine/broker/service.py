"""The broker service: one data dir's storage, its topics and its transaction coordinators.

`BrokerService` is what `pyengine serve` puts on the network and what `Broker.embedded()`
gives to an application in-process. It loads topics on demand and is the coordinators' way to
reach the participants of a transaction (the topics' transaction buffers and the
subscriptions' pending acks) — direct calls, since everything lives in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from dataclasses import dataclass, field
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from pyengine.broker.backlog_quota import enforce as enforce_backlog_quotas
from pyengine.broker.expiry import expire_topic
from pyengine.broker.periodic import PeriodicTopicCheck
from pyengine.broker.inactive import delete_if_inactive, inactive
from pyengine.broker.policies import (TOPIC_TYPES, AutoTopicCreation, BacklogQuota, BrokerPolicies, ConnectionLimits,
                                     DelayedDelivery, InactiveTopicPolicies, Retention, UnackedLimits,
                                     check_message_ttl)
from pyengine.broker.schemas import TopicSchemas
from pyengine.broker.subscription import wire_sub_type
from pyengine.broker.topic import Topic
from pyengine.broker.transactions import CoordinatorRouter, V5Transactions, default_transaction_version
from pyengine.errors import NotAllowedError, ServiceNotReadyError, SubscriptionNotFoundError, TopicNotFoundError
from pyengine.naming import TopicName
from pyengine.scalable.resources import ScalableTopicResources
from pyengine.scalable.segments import LocalSegments, RoutedSegments
from pyengine.scalable.service import ScalableTopicService
from pyengine.schema import CompatibilityStrategy, schema_id
from pyengine.schema.registry import LmdbSchemaRegistry
from pyengine.storage import ManagedCursor, ManagedLedger, ManagedLedgerConfig, StorageEnvironment
from pyengine.storage.environment import DEFAULT_MAP_SIZE
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer import TransactionBuffer
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine.transaction.buffer.topic_buffer import TopicTransactionBuffer
from pyengine.transaction.coordinator.clock import Clock, wall_clock_ms
from pyengine.transaction.coordinator.service import TransactionCoordinatorService
from pyengine.transaction.pendingack import PendingAckHandle
from pyengine.transaction.pendingack.handle import PendingAckHandleImpl
from pyengine.transaction.pendingack.log_store import LogPendingAckStore
from pyengine.transaction.pendingack.metadata_store import MetadataPendingAckHandle, MetadataPendingAckStore
from pyengine.transaction.buffer.metadata_buffer import MetadataTransactionBuffer
from pyengine.metadata import MetadataStore, open_metadata_store
from pyengine_kernels import Position, TxnId

log = logging.getLogger(__name__)
TXN_VERSION_PROPERTY = "txnVersion"     # a topic's transaction design (4 or 5), kept from its first load
LOADS_AT_CLOSE_S = 10.0                 # how long a close waits for topic loads under way


@dataclass
class BrokerConfig:
    data_dir: Path
    sync: bool = True                       # fsync every group commit (no acknowledged write lost)
    map_size: int = DEFAULT_MAP_SIZE
    cluster_name: str = "standalone"
    broker_id: str = "0"
    num_coordinators: int = 16              # Pulsar's default transaction_coordinator_assign partitions
    deduplication_enabled: bool = False     # Pulsar's brokerDeduplicationEnabled default
    # A producer name's de-duplication state is forgotten once no producer of that name was
    # attached for this long (Pulsar's brokerDeduplicationProducerInactivityTimeoutMinutes),
    # checked every `deduplication_inactivity_check_interval_s`.
    deduplication_producer_inactivity_timeout_minutes: float = 360
    deduplication_inactivity_check_interval_s: float = 60.0
    max_message_size: int = 5 * 1024 * 1024
    ledger: ManagedLedgerConfig = field(default_factory=ManagedLedgerConfig)
    # The broker's wall clock in milliseconds: the transaction coordinators' timeouts and when a
    # delayed message is due (tests move time with their own).
    clock: Clock = wall_clock_ms
    transaction_buffer: TopicTransactionBufferConfig = field(default_factory=TopicTransactionBufferConfig)
    # The metadata store (v5 transactions, PIP-473): `lmdb` (in the data dir), `memory`,
    # `etcd://HOST:PORT`, or a started MetadataStore the caller owns (several brokers, tests).
    metadata_store: str | MetadataStore = "lmdb"
    txn_v5_retention_ms: int = 60_000        # finalized v5 headers are collected after this
    txn_v5_sweep_interval_ms: int = 1000     # v5 timeout and GC sweeps
    txn_v5_recheck_interval_s: float = 0.5   # re-read of expired OPEN headers (lost notifications)
    # Scalable topics (PIP-468, `scalableTopicEnabled`): when off, topic:// and segment:// names
    # are refused and this broker never runs a controller. A dead controller leader is replaced
    # within the session ttl; a disconnected ordered consumer keeps its segments for the grace
    # period (seconds).
    scalable_topic_enabled: bool = True
    scalable_session_ttl: float = 10.0
    scalable_grace_period: float = 30.0
    # Retention of consumed ledgers where no topic or namespace policy says otherwise (Pulsar's
    # defaultRetentionTimeInMinutes / defaultRetentionSizeInMB). Ours keeps them (-1, -1): a data
    # dir is also what the Spark pipeline reads. Pulsar's own default, 0 / 0, deletes a ledger
    # once every subscription has consumed it. Loaded topics are checked every
    # `retention_check_interval_s` (Pulsar's retentionCheckIntervalInSeconds), besides when a
    # ledger closes and when the slowest subscription moves past one.
    retention: Retention = field(default_factory=Retention)
    retention_check_interval_s: float = 120.0
    # Schema registry defaults where no namespace policy says (Pulsar's schemaCompatibilityStrategy,
    # isAllowAutoUpdateSchemaEnabled and isSchemaValidationEnforced, with their defaults).
    schema_compatibility_strategy: str = "FULL"
    allow_auto_update_schema: bool = True
    schema_validation_enforced: bool = False
    # Delayed delivery where no topic or namespace policy says (Pulsar's delayedDeliveryEnabled,
    # delayedDeliveryTickTimeMillis and delayedDeliveryMaxDelayInMillis, with their defaults;
    # max 0: no limit), and isDelayedDeliveryDeliverAtTimeStrict (Pulsar: false, a message may go
    # up to a tick early; ours: true, never before its deliver_at_time).
    delayed_delivery_enabled: bool = True
    delayed_delivery_tick_time_ms: int = 1000
    delayed_delivery_max_delay_ms: int = 0
    delayed_delivery_deliver_at_time_strict: bool = True
    # Message TTL where no topic or namespace policy says (Pulsar's ttlDurationDefaultInSeconds;
    # 0: messages never expire), and how often loaded topics expire their subscriptions' old
    # messages (Pulsar's messageExpiryCheckIntervalInMinutes, 5 minutes by default).
    ttl_duration_default_seconds: int = 0
    message_expiry_check_interval_s: float = 300.0
    # Shared and Key_Shared subscriptions: how many messages a consumer, and the whole
    # subscription, may hold delivered and unacknowledged where no topic or namespace policy
    # says (Pulsar's maxUnackedMessagesPerConsumer and maxUnackedMessagesPerSubscription, with
    # their defaults; 0: no limit).
    max_unacked_messages_per_consumer: int = 50_000
    max_unacked_messages_per_subscription: int = 200_000
    # Key_Shared: how many entries held back for redelivery (mostly read past a busy key's
    # consumer) stop the reading of new ones, per consumer and for the whole subscription
    # (Pulsar's keySharedLookAheadMsgInReplayThresholdPerConsumer and ...PerSubscription, with
    # their defaults). The cap is the per-consumer one times the consumers, at most the
    # subscription's; 0 leaves one out; both 0: the unacked-messages limits above stand in.
    key_shared_look_ahead_msg_in_replay_threshold_per_consumer: int = 2000
    key_shared_look_ahead_msg_in_replay_threshold_per_subscription: int = 20_000
    # Failover: when another consumer becomes the active one, how long nothing is delivered
    # before it gets what the previous one left unacknowledged, so that the acknowledgements
    # still on their way are not delivered twice (Pulsar's activeConsumerFailoverDelayTimeMillis,
    # with its default; 0: at once).
    active_consumer_failover_delay_time_ms: int = 1000
    # How many producers a topic, and consumers a topic and a subscription, may have where no
    # policy says (Pulsar's maxProducersPerTopic, maxConsumersPerTopic and
    # maxConsumersPerSubscription; 0, their default: no limit).
    max_producers_per_topic: int = 0
    max_consumers_per_topic: int = 0
    max_consumers_per_subscription: int = 0
    # Backlog quotas where no topic or namespace policy says (Pulsar's backlogQuotaDefaultLimitBytes,
    # backlogQuotaDefaultLimitSecond, -1: no quota, and backlogQuotaDefaultRetentionPolicy), and
    # how often loaded topics are checked against theirs (backlogQuotaCheckIntervalInSeconds).
    backlog_quota_default_limit_bytes: int = -1
    backlog_quota_default_limit_seconds: int = -1
    backlog_quota_default_retention_policy: str = "producer_request_hold"
    backlog_quota_check_interval_s: float = 60.0
    # How often the rates of the topic stats are computed, each over the interval since the
    # previous computation (Pulsar's statsUpdateFrequencyInSecs: 60).
    stats_update_interval_s: float = 60.0
    # Inactive topics where no topic or namespace policy says (Pulsar's brokerDeleteInactiveTopics-
    # Enabled, -Mode and -MaxInactiveDurationSeconds, with their defaults; None: the check's
    # frequency), checked every `delete_inactive_topics_frequency_s` (-FrequencySeconds: 60). A
    # topic is deleted only past its retention time too, as in Pulsar: with ours unlimited by
    # default, nothing is deleted unless a retention time is set (see pyengine.broker.inactive).
    delete_inactive_topics_enabled: bool = True
    delete_inactive_topics_mode: str = "delete_when_no_subscriptions"
    delete_inactive_topics_max_inactive_duration_s: int | None = None
    delete_inactive_topics_frequency_s: float = 60.0
    # Whether a producer or consumer creates a topic that does not exist, and as what, where the
    # namespace has no override (Pulsar's allowAutoTopicCreation, allowAutoTopicCreationType and
    # defaultNumPartitions, with their defaults; the count is used for "partitioned" only).
    allow_auto_topic_creation: bool = True
    allow_auto_topic_creation_type: str = "non-partitioned"
    default_num_partitions: int = 1
    # Whether a consumer creates a durable subscription that does not exist where no topic or
    # namespace policy says (Pulsar's allowAutoSubscriptionCreation, with its default).
    allow_auto_subscription_creation: bool = True

    def inactive_topic_policies(self) -> InactiveTopicPolicies:
        """The broker's default InactiveTopicPolicies (what BrokerPolicies falls back on)."""
        duration = self.delete_inactive_topics_max_inactive_duration_s
        if duration is None:
            duration = math.ceil(self.delete_inactive_topics_frequency_s)
        return InactiveTopicPolicies(self.delete_inactive_topics_mode, duration, self.delete_inactive_topics_enabled)

    def auto_topic_creation(self) -> AutoTopicCreation:
        """The broker's auto topic creation setting (what BrokerPolicies falls back on)."""
        partitioned = self.allow_auto_topic_creation_type == "partitioned"
        return AutoTopicCreation(self.allow_auto_topic_creation, self.allow_auto_topic_creation_type,
                                 self.default_num_partitions if partitioned else None)

    def backlog_quota_default(self) -> BacklogQuota:
        """The broker's default backlog quota (what BrokerPolicies falls back on)."""
        return BacklogQuota(self.backlog_quota_default_limit_bytes, self.backlog_quota_default_limit_seconds,
                            self.backlog_quota_default_retention_policy)

    def unacked_limits(self) -> UnackedLimits:
        """The broker's default limits (what BrokerPolicies falls back on)."""
        return UnackedLimits(self.max_unacked_messages_per_consumer, self.max_unacked_messages_per_subscription)

    def connection_limits(self) -> ConnectionLimits:
        """The broker's default producer and consumer limits (what BrokerPolicies falls back on)."""
        return ConnectionLimits(self.max_producers_per_topic, self.max_consumers_per_topic,
                                self.max_consumers_per_subscription)

    def delayed_delivery_policy(self) -> DelayedDelivery:
        """The broker's default DelayedDeliveryPolicies (what BrokerPolicies falls back on)."""
        return DelayedDelivery(active=self.delayed_delivery_enabled, tick_time_ms=self.delayed_delivery_tick_time_ms,
                               max_delivery_delay_ms=self.delayed_delivery_max_delay_ms)

    def __post_init__(self) -> None:
        if not self.ledger.retains_everything:
            raise ValueError("a broker's retention is a policy: set BrokerConfig.retention (namespaces and topics "
                             "override it), not ManagedLedgerConfig's retention_ms / retention_bytes")
        if not isinstance(self.retention, Retention):
            raise TypeError(f"retention must be a Retention, not {type(self.retention).__name__}")
        strategy = CompatibilityStrategy.parse(self.schema_compatibility_strategy)
        if strategy == CompatibilityStrategy.UNDEFINED:
            raise ValueError("the broker's schema compatibility strategy cannot be UNDEFINED (it is the default "
                             "that namespaces fall back on)")
        for flag in ("allow_auto_update_schema", "schema_validation_enforced", "delayed_delivery_enabled",
                     "delayed_delivery_deliver_at_time_strict", "allow_auto_topic_creation",
                     "allow_auto_subscription_creation"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be a bool, not {getattr(self, flag)!r}")
        for name in ("delayed_delivery_tick_time_ms", "delayed_delivery_max_delay_ms",
                     "key_shared_look_ahead_msg_in_replay_threshold_per_consumer",
                     "key_shared_look_ahead_msg_in_replay_threshold_per_subscription",
                     "active_consumer_failover_delay_time_ms", "default_num_partitions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, not {value!r}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, not {value}")
        for name in ("retention_check_interval_s", "message_expiry_check_interval_s", "backlog_quota_check_interval_s",
                     "stats_update_interval_s", "deduplication_inactivity_check_interval_s",
                     "delete_inactive_topics_frequency_s"):
            interval = getattr(self, name)
            if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval <= 86400:
                raise ValueError(f"{name} must be a number of seconds in (0, 86400], not {interval!r}")
        minutes = self.deduplication_producer_inactivity_timeout_minutes
        if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not minutes > 0:
            raise ValueError(f"deduplication_producer_inactivity_timeout_minutes must be a number > 0, not {minutes!r}")
        check_message_ttl(self.ttl_duration_default_seconds)
        self.unacked_limits()
        self.connection_limits()
        self.backlog_quota_default()
        self.inactive_topic_policies()
        if self.allow_auto_topic_creation_type not in TOPIC_TYPES:     # checked even when creation is off
            raise ValueError(f"allow_auto_topic_creation_type must be one of {', '.join(TOPIC_TYPES)}, "
                             f"not {self.allow_auto_topic_creation_type!r}")
        if self.default_num_partitions < 1:
            raise ValueError(f"default_num_partitions must be >= 1, not {self.default_num_partitions}")
        self.auto_topic_creation()


class BrokerService:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.env = StorageEnvironment(config.data_dir, map_size=config.map_size, sync=config.sync)
        self.topics: dict[str, Topic] = {}
        self._loading: dict[str, asyncio.Future[Topic]] = {}
        self._deleting_partitioned: dict[str, int] = {}    # partitioned topic -> its deletions under way
        # Topics closed by their deletion, which forgets them: resolved when it is over.
        self._deleting_topics: dict[str, asyncio.Future[None]] = {}
        self._inactive_deletions: set[asyncio.Future[bool]] = set()
        # Topics closed by their unload: resolved once it is over (see get_open_topic).
        self._unloading: dict[str, asyncio.Future[None]] = {}
        self._loads_abandoned = False       # the close stopped waiting for loads under way
        self.policies = BrokerPolicies(self.env, num_coordinators=config.num_coordinators,
                                       deduplication_default=config.deduplication_enabled,
                                       retention_default=config.retention,
                                       delayed_delivery_default=config.delayed_delivery_policy(),
                                       message_ttl_default=config.ttl_duration_default_seconds,
                                       unacked_limits_default=config.unacked_limits(),
                                       connection_limits_default=config.connection_limits(),
                                       backlog_quota_default=config.backlog_quota_default(),
                                       inactive_topic_default=config.inactive_topic_policies(),
                                       auto_topic_creation_default=config.auto_topic_creation(),
                                       auto_subscription_creation_default=config.allow_auto_subscription_creation)
        self.policies.on_policy_change(self.refresh_policies)
        self.schemas = TopicSchemas(LmdbSchemaRegistry(self.env), self.policies,
                                    strategy=config.schema_compatibility_strategy,
                                    allow_auto_update=config.allow_auto_update_schema,
                                    validation_enforced=config.schema_validation_enforced)
        self.coordinator_v4 = TransactionCoordinatorService(self.env, self,
                                                            num_coordinators=self.policies.coordinators_to_run(),
                                                            clock=config.clock)
        self.metadata: MetadataStore | None = None
        self.v5: V5Transactions | None = None
        self.coordinator = CoordinatorRouter(self.coordinator_v4, None)
        # The URL clients reach this broker at (the controller leader's election value);
        # `pyengine serve` sets it to the protocol server's address.
        self.service_url = f"pulsar://broker-{config.broker_id}"
        self.web_service_url: str | None = None       # the admin API's URL (set by `pyengine serve`)
        self._scalable: ScalableTopicService | None = None
        self._retention_check: asyncio.TimerHandle | None = None
        self.message_expiry = PeriodicTopicCheck(self, config.message_expiry_check_interval_s, "message expiry check",
                                                 expire_topic)
        self.backlog_quotas = PeriodicTopicCheck(self, config.backlog_quota_check_interval_s, "backlog quota check",
                                                 enforce_backlog_quotas)
        self.stats_update = PeriodicTopicCheck(self, config.stats_update_interval_s, "stats rates update",
                                               _update_rates)
        self.dedup_purge = PeriodicTopicCheck(self, config.deduplication_inactivity_check_interval_s,
                                              "inactive producers' de-duplication purge", self._purge_inactive_producers)
        self.inactive_topics = PeriodicTopicCheck(self, config.delete_inactive_topics_frequency_s,
                                                  "inactive topic deletion", delete_if_inactive)
        self._started = False
        self._closed = False
        self._producer_name_instance = 0
        self._generated_producer_names = itertools.count()

    async def start(self) -> None:
        # Generated producer names never repeat, across restarts too (Pulsar's
        # DistributedIdGenerator takes a new instance id at every start): a name handed out
        # again would inherit a de-duplication state (last sequence id) of another producer.
        self._producer_name_instance = self.env.next_id("producer-name-instance")
        await self.env.barrier()
        await self.policies.ensure_defaults()
        await self.coordinator_v4.start()
        await self._start_v5()
        self._started = True
        self._retention_check = asyncio.get_running_loop().call_later(
            self.config.retention_check_interval_s, self._check_retention)
        self.message_expiry.start()
        self.backlog_quotas.start()
        self.stats_update.start()
        self.dedup_purge.start()
        self.inactive_topics.start()

    def generate_producer_name(self) -> str:
        """A name for a producer that gave none: `cluster-broker-instance-n`, unique for this
        data dir's life (the instance is a stored counter taken at every start)."""
        return (f"{self.config.cluster_name}-{self.broker_id}-{self._producer_name_instance}-"
                f"{next(self._generated_producer_names)}")

    # --- topics ---------------------------------------------------------------------------

    async def get_topic(self, name: str, *, create: bool = True) -> Topic:
        """The loaded topic `name` (normalised), loading it (and creating it when `create`)."""
        topic = self.topics.get(name)            # already normalised: the common case
        if topic is not None:
            return topic
        topic_name = TopicName.parse(name)
        key = str(topic_name)
        topic = self.topics.get(key)
        if topic is not None:
            return topic
        if topic_name.is_scalable:
            # topic:// has no ledger: its messages live in its segment:// topics (PIP-468).
            raise NotAllowedError(f"{key} is a scalable topic: produce and consume through its segment:// topics "
                                  "(pyengine.client routes topic:// names), it is not a ledger topic")
        if topic_name.is_segment:
            self.check_scalable_enabled()
        if not create and not self.topic_exists(key):
            raise TopicNotFoundError(f"topic {key} does not exist")
        if not self.policies.namespace_exists(topic_name.namespace_name):
            raise TopicNotFoundError(f"namespace {topic_name.namespace_name} does not exist (create it first, "
                                     "e.g. `pyengine admin namespaces create`)")
        if (topic_name.partition_index >= 0 and str(topic_name.partitioned_topic) in self._deleting_partitioned
                and key not in self._loading and not self.topic_exists(key)):
            # As Pulsar: no partition is created while its partitioned topic is deleted (created
            # after the deletion passed it, it was left without its partitioned topic).
            raise TopicNotFoundError(f"topic {key} does not exist: its partitioned topic is being deleted")
        loading = self._loading.get(key)
        if loading is None:
            if self._closed:
                # Loaded now, it would outlive the close (which closed the loaded topics).
                raise ServiceNotReadyError(f"the broker is closing: topic {key} is not loaded")
            loading = asyncio.ensure_future(Topic.load(self, topic_name))
            self._loading[key] = loading
            # Registered by the load itself, not by its first caller: a caller that stops
            # waiting (cancelled) neither cancels the load for the others waiting for it (they
            # got a CancelledError of their own) nor leaves it unregistered.
            loading.add_done_callback(lambda done: self._loaded(key, done))
        return await asyncio.shield(loading)

    async def get_open_topic(self, name: str, *, create: bool = True) -> Topic:
        """`get_topic`, past an unload under way: a topic closed by its unload is waited for and
        loaded again (what a client does on its TopicFencedError). Closed, it is being deleted
        (or the broker closes)."""
        while True:
            topic = await self.get_topic(name, create=create)
            unloading = self._unloading.get(topic.name)
            if not topic.closed or unloading is None:
                return topic
            await asyncio.wait([unloading])

    def _loaded(self, key: str, loading: asyncio.Future[Topic]) -> None:
        del self._loading[key]
        if not loading.cancelled() and loading.exception() is None:
            if self._loads_abandoned:
                # Ended after the close stopped waiting for it: closed, not kept.
                task = asyncio.ensure_future(loading.result().close())
                task.add_done_callback(lambda done: done.cancelled() or done.exception())
                return
            topic = self.topics[key] = loading.result()
            # A policy changed during the load reached only the topics loaded then: this one
            # took its de-duplication switch when its load began.
            self._apply_policies(topic)

    def auto_creates(self, topic: TopicName) -> bool:
        """Whether a producer or consumer creates `topic` when it does not exist (Pulsar's
        isAllowAutoTopicCreation): the namespace's override, else the broker's setting. A
        partition of an existing partitioned topic is part of a topic created on purpose; a
        segment is created by its controller; the system namespace holds the broker's own."""
        if topic.is_segment or topic.namespace_name == "pulsar/system":
            return True
        if 0 <= topic.partition_index < self.policies.partitions(str(topic.partitioned_topic)):
            return True
        return self.policies.auto_topic_creation(topic.namespace_name).allowed

    def auto_creates_subscriptions(self, topic: Topic) -> bool:
        """Whether a consumer creates a durable subscription of `topic` that does not exist, and
        a producer its initial subscription (Pulsar's allowAutoSubscriptionCreation and its
        namespace and topic overrides; persistent:// only, as Pulsar: a segment's subscriptions
        are made by its scalable topic's consumers as it splits)."""
        persistent = TopicName.parse(topic.name).domain == "persistent"
        return not persistent or self.policies.auto_subscription_creation(topic.name)

    def check_subscription_creation(self, topic: Topic, subscription: str) -> None:
        """SubscriptionNotFoundError, as Pulsar's, where a consumer may not create `subscription`."""
        if subscription not in topic.subscriptions and not self.auto_creates_subscriptions(topic):
            raise SubscriptionNotFoundError(f"Subscription does not exist: {subscription} on {topic.name} (auto "
                                            "subscription creation is not allowed)")

    def check_initial_subscription(self, topic: Topic) -> None:
        """NotAllowedError, with Pulsar's reason, where a producer may not create its initial
        subscription."""
        if not self.auto_creates_subscriptions(topic):
            raise NotAllowedError("Could not create the initial subscription due to the auto subscription creation "
                                  "is not allowed.")

    async def load_settled(self, name: str) -> None:
        """Wait until no load of topic `name` (normalised) is under way (a producer's first
        use creating it: not stored yet, it is a topic all the same). Its outcome is its
        callers'. The caller checks in the same event-loop turn as this returns."""
        while (loading := self._loading.get(name)) is not None:
            await asyncio.wait([loading])

    def topic_exists(self, name: str) -> bool:
        key = str(TopicName.parse(name))
        if key in self.topics:
            return True
        with self.env.read() as txn:
            return txn.get(key.encode(), db=self.env.db("topics")) is not None

    def loading_topics(self, namespace: str) -> list[str]:
        """The topics of `namespace` being loaded now (created on first use, maybe): not
        stored yet, they are the namespace's all the same (a deletion of it must wait)."""
        return [name for name in self._loading if TopicName.parse(name).namespace_name == namespace]

    def list_topics(self, namespace: str | None = None) -> list[str]:
        """Every stored topic (of `tenant/namespace` if given)."""
        names = []
        with self.env.read() as txn:
            for key in txn.cursor(db=self.env.db("topics")).iternext(values=False):
                name = key.decode()
                if namespace is None or TopicName.parse(name).namespace_name == namespace:
                    names.append(name)
        return names

    def refresh_policies(self) -> None:
        """Apply changed namespace/topic policies to the loaded topics."""
        for topic in self.topics.values():
            self._apply_policies(topic)

    def _apply_policies(self, topic: Topic) -> None:
        topic.dedup.enabled = self.policies.deduplication_enabled(topic.name)
        self.apply_retention(topic.ledger)
        for subscription in topic.subscriptions.values():
            subscription.dispatcher.notify()        # a changed unacked-messages limit applies now

    def apply_retention(self, ledger: ManagedLedger) -> None:
        """Give `ledger` the retention its policies say, and trim by it."""
        ledger.set_retention(*self.policies.retention(ledger.name).ms_and_bytes)
        ledger.trim_soon()

    def _check_retention(self) -> None:
        for topic in list(self.topics.values()):
            topic.ledger.trim_soon()
        self._retention_check = asyncio.get_running_loop().call_later(
            self.config.retention_check_interval_s, self._check_retention)

    @contextlib.asynccontextmanager
    async def deleting_partitioned_topic(self, name: str) -> AsyncIterator[None]:
        """For the deletion of the partitioned topic `name` (normalised): no partition of it is
        created (loaded without being stored) until the block ends, and the ones being created
        (a producer's auto-creation) are done before it starts, so that its partitions' deletion
        sees them."""
        self._deleting_partitioned[name] = self._deleting_partitioned.get(name, 0) + 1
        try:
            loads = [future for key, future in self._loading.items()
                     if str(TopicName.parse(key).partitioned_topic) == name]
            if loads:
                await asyncio.wait(loads)          # (their failures are their callers')
            yield
        finally:
            left = self._deleting_partitioned[name] - 1
            if left:
                self._deleting_partitioned[name] = left
            else:
                del self._deleting_partitioned[name]

    async def delete_topic(self, name: str) -> None:
        while True:
            topic = await self.get_topic(name, create=False)
            deletion = self._deleting_topics.get(topic.name)
            if deletion is None:
                break
            # Being deleted already (the inactive-topic check, another caller): once that is
            # over the topic is gone, as asked, or its deletion failed and this one tries.
            await asyncio.shield(deletion)
            if not self.topic_exists(topic.name):
                return
        await self._delete_loaded(topic)

    async def delete_inactive_topic(self, topic: Topic, policies: InactiveTopicPolicies) -> bool:
        """Delete `topic` if it is still loaded and inactive under `policies` (checked in the
        same event-loop turn as its close begins, which refuses every producer and consumer
        from then on: none can attach in between, as Pulsar's delete refuses a busy topic);
        with `delete_when_subscriptions_caught_up`, its caught-up subscriptions go with it.
        False: it was not deleted."""
        # A task of its own, which the broker's close waits for: cancelled with the periodic
        # check, a deletion stopped half-way and the close went on under the closing topic.
        deletion = asyncio.ensure_future(self._delete_if_inactive(topic, policies))
        self._inactive_deletions.add(deletion)
        deletion.add_done_callback(self._inactive_deletion_done)
        return await asyncio.shield(deletion)

    def _inactive_deletion_done(self, deletion: asyncio.Future[bool]) -> None:
        self._inactive_deletions.discard(deletion)
        if not deletion.cancelled() and deletion.exception() is not None:
            # (Its check, if still waiting, logs it too; if cancelled, only this does.)
            log.warning("deleting inactive topic failed: %r", deletion.exception())

    async def _delete_if_inactive(self, topic: Topic, policies: InactiveTopicPolicies) -> bool:
        if (self.topics.get(topic.name) is not topic or topic.closed or topic.name in self._deleting_topics
                or not inactive(topic, policies.mode)):
            return False
        log.info("deleting topic %s: inactive for %d s at least (%s)", topic.name,
                 policies.max_inactive_duration_seconds, policies.mode)
        await self._delete_loaded(topic)        # its close begins in this turn
        return True

    async def _delete_loaded(self, topic: Topic) -> None:
        self._deleting_topics[topic.name] = asyncio.get_running_loop().create_future()
        # Its schemas and topic-level policies go with it, as in Pulsar (which deletes them
        # before the ledger), here in the topic's own LMDB write: kept by name, left by a crash
        # they would be a topic's created again under it. A partition's stay with its
        # partitioned topic (deleted with that), a segment's schemas with its scalable topic.
        parsed = TopicName.parse(topic.name)
        try:
            await topic.close()         # first: the schema's lock is held for the write only
            async with contextlib.AsyncExitStack() as stack:
                also = [await stack.enter_async_context(self.policies.deleting_topic_policies(topic.name))]
                if parsed.partition_index < 0 and not parsed.is_segment:
                    also.append(await stack.enter_async_context(self.schemas.registry.deleting(schema_id(parsed))))
                await topic.delete(also)
        finally:
            # Closed either way: if its deletion failed it is still stored, and its next use
            # loads it again (kept, the closed topic would refuse every send until a restart).
            self._deleting_topics.pop(topic.name).set_result(None)
            if self.topics.get(topic.name) is topic:
                del self.topics[topic.name]

    async def unload_topic(self, name: str) -> bool:
        """Unload the topic `name`, as Pulsar's topic unload: close it and forget
        it. Its producers and consumers are disconnected and attach again, refused while it
        closes (TopicFencedError); its next use loads it again from storage, its transactions'
        buffer and pending acks recovered as after a restart (a coordinator ending one of its
        transactions meanwhile retries until it is loaded). False: it was not loaded, or it
        is being deleted (forgotten only once its deletion is written: forgotten before, it
        was loaded again by its next use while its deletion went on)."""
        name = str(TopicName.parse(name))
        await self.load_settled(name)
        topic = self.topics.get(name)
        if topic is None or name in self._deleting_topics:
            return False
        unloaded = self._unloading.get(name)
        first = unloaded is None
        if first:
            unloaded = self._unloading[name] = asyncio.get_running_loop().create_future()
        try:
            await topic.close()
        finally:
            # Forgotten though its close failed (as a failed deletion): kept, the closed topic
            # would refuse everything until a restart; loaded again, it recovers from storage.
            # Not if a deletion came during the close: that forgets it once written (forgotten
            # now, its next use loaded it again and the deletion removed its storage under it).
            if self.topics.get(name) is topic and name not in self._deleting_topics:
                del self.topics[name]
            if first:
                del self._unloading[name]
                unloaded.set_result(None)
        log.info("unloaded topic %s", name)
        return True

    async def unload_namespace(self, namespace: str) -> int:
        """Unload every loaded topic of `tenant/namespace` (Pulsar's namespace unload, which
        unloads its bundles); returns how many were unloaded. NotFoundError: no such namespace."""
        if not isinstance(namespace, str):
            raise TypeError(f"a namespace is a 'tenant/namespace' string, not {type(namespace).__name__}")
        self.policies.policies(namespace)
        names = [name for name in list(self.topics) if TopicName.parse(name).namespace_name == namespace]
        unloaded = 0
        for name in names:
            unloaded += await self.unload_topic(name)
        return unloaded

    # --- components for topics -------------------------------------------------------------

    async def _start_v5(self) -> None:
        config = self.config
        if isinstance(config.metadata_store, MetadataStore):
            self.metadata = config.metadata_store
        else:
            self.metadata = await open_metadata_store(config.metadata_store, self.env)
        self.v5 = V5Transactions(self.metadata, clock=config.clock, retention_ms=config.txn_v5_retention_ms,
                                 sweep_interval_ms=config.txn_v5_sweep_interval_ms,
                                 recheck_interval_s=config.txn_v5_recheck_interval_s)
        await self.v5.start()
        self.coordinator.v5 = self.v5.coordinator

    def transaction_version(self, topic: str) -> int:
        """4 or 5: the design serving `topic`'s transactions (namespace policy, else by domain)."""
        name = TopicName.parse(topic)
        override = self.policies.policies(name.namespace_name).transaction_version \
            if self.policies.namespace_exists(name.namespace_name) else None
        return override or default_transaction_version(name)

    async def pin_transaction_version(self, ledger: ManagedLedger) -> int:
        """The design of the topic of `ledger`, written to its properties when it is first
        loaded and kept: v4 markers and snapshots and v5 metadata records are each read by their
        own design only, so a topic switched to the other one would show the messages of its
        aborted and still-open transactions. A namespace's transactionVersion applies to the
        topics first loaded after it is set."""
        pinned = _pinned_version(ledger)
        policy = self.transaction_version(ledger.name)
        if pinned is not None:
            if pinned != policy:
                log.info("%s keeps transaction version %d (its namespace now asks for %d: that applies to "
                         "new topics)", ledger.name, pinned, policy)
            return pinned
        try:
            await ledger.set_property(TXN_VERSION_PROPERTY, str(policy))
        except Exception as exc:      # e.g. a full disk: serve it, pin it at the next load
            log.warning("cannot record the transaction version of %s: %s", ledger.name, exc)
        return policy

    def _ledger_transaction_version(self, ledger: ManagedLedger) -> int:
        pinned = _pinned_version(ledger)
        return pinned if pinned is not None else self.transaction_version(ledger.name)

    def new_transaction_buffer(self, ledger: ManagedLedger) -> TransactionBuffer:
        if self.v5 is not None and self._ledger_transaction_version(ledger) == 5:
            return MetadataTransactionBuffer(ledger, self.v5.store, self.v5.headers, metrics=self.v5.metrics)
        return TopicTransactionBuffer(ledger, self.config.transaction_buffer)

    def new_pending_ack_handle(self, cursor: ManagedCursor, sub_type: str | None,
                               on_release: Callable[..., None],
                               on_acked: Callable[..., None] | None = None) -> PendingAckHandle:
        """`on_release(positions, txn=)`: what the handle aborted on its own gives back, with
        that transaction; `on_acked(positions, txn=)` (v5): what a commit it applied on its own
        acknowledged whole."""
        if self.v5 is not None and self._ledger_transaction_version(cursor.ledger) == 5:
            store = MetadataPendingAckStore(self.v5.store, cursor.ledger.name, cursor.name, metrics=self.v5.metrics)
            return MetadataPendingAckHandle(cursor, store, self.v5.headers, subscription_type=wire_sub_type(sub_type),
                                            on_release=on_release, on_acked=on_acked)
        return PendingAckHandleImpl(cursor, LogPendingAckStore.for_cursor(cursor),
                                    subscription_type=wire_sub_type(sub_type), on_release=on_release)

    # --- transaction participants (called by the coordinators) ------------------------------

    async def end_txn_on_partition(self, topic: str, txn: TxnId, action: TxnAction, low_watermark: int, *,
                                   after: asyncio.Future[Any] | None = None) -> None:
        loaded = await self.get_topic(topic, create=False)
        await loaded.end_txn(txn, action == TxnAction.COMMIT, low_watermark, after=after)

    def end_txn_on_partition_now(self, topic: str, txn: TxnId, action: TxnAction, low_watermark: int, *,
                                 after: asyncio.Future[Any] | None = None) -> asyncio.Future[None] | None:
        """`end_txn_on_partition` started before this returns, for a loaded topic whose buffer
        can take the marker at once (the common case: no task, no coroutine chain per
        partition); None: await `end_txn_on_partition`."""
        loaded = self.topics.get(topic)
        if loaded is None:
            return None
        return loaded.end_txn_now(txn, action == TxnAction.COMMIT, low_watermark, after=after)

    async def end_txn_on_subscription(self, topic: str, subscription: str, txn: TxnId, action: TxnAction,
                                      low_watermark: int) -> None:
        loaded = await self.get_topic(topic, create=False)
        sub = loaded.subscriptions.get(subscription)
        if sub is not None:          # a deleted subscription has nothing left to end
            await sub.end_txn(txn, action == TxnAction.COMMIT, low_watermark)

    # --- lifecycle ------------------------------------------------------------------------

    def check_scalable_enabled(self) -> None:
        if not self.config.scalable_topic_enabled:
            # Pulsar's upgrade note: with the switch off the new code paths stay inactive and
            # scalable topics' data is kept but not served.
            raise NotAllowedError("scalable topics are disabled on this broker (scalableTopicEnabled=false: "
                                  "`pyengine serve --no-scalable-topics`)")

    async def scalable_topics(self) -> ScalableTopicService:
        """The broker's scalable-topic service (started on first use, on the metadata store)."""
        self.check_scalable_enabled()
        if self._scalable is None:
            if self.metadata is None or self._closed:
                raise ServiceNotReadyError("the broker is not started (no metadata store)")
            # set before the first await: concurrent first calls share one service (its session
            # is opened under its own lock)
            resources = ScalableTopicResources(self.metadata)
            segments = RoutedSegments(LocalSegments(self, self.service_url), resources, self.service_url)
            self._scalable = ScalableTopicService(
                self.metadata, segments, self.service_url, session_ttl=self.config.scalable_session_ttl,
                grace_period=self.config.scalable_grace_period, web_service_url=self.web_service_url)
        await self._scalable.start()
        return self._scalable

    @property
    def closed(self) -> bool:
        """Closing or closed: no topic is loaded any more."""
        return self._closed

    @property
    def serving(self) -> bool:
        """Started, and not closing."""
        return self._started and not self._closed

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._retention_check is not None:
            self._retention_check.cancel()
        if self._loading:
            # The loads under way end first (no new one starts): their topics are closed below.
            # Bounded: a load hung on an unreachable metadata store must not hang the close
            # (one ending later closes its own topic, see _loaded).
            _, hung = await asyncio.wait(list(self._loading.values()), timeout=LOADS_AT_CLOSE_S)
            if hung:
                self._loads_abandoned = True
                log.warning("closing with %d topic loads still under way", len(hung))
        await self.message_expiry.close()
        await self.backlog_quotas.close()
        await self.stats_update.close()
        await self.dedup_purge.close()
        await self.inactive_topics.close()
        if self._inactive_deletions:
            await asyncio.wait(list(self._inactive_deletions))
        await self.coordinator_v4.close()
        if self.v5 is not None:
            await self.v5.close()
        for topic in list(self.topics.values()):
            try:
                await topic.close()
            except Exception:
                # logged by the topic; the others, and the data dir, are still closed
                log.warning("closing %s failed; closing the broker goes on", topic.name)
        if self._scalable is not None:
            await self._scalable.close()
        if self.metadata is not None and self.metadata is not self.config.metadata_store:
            await self.metadata.close()
        await self.env.drain()
        self.env.close()


    async def _purge_inactive_producers(self, topic: Topic, now_ms: int) -> None:
        timeout_ms = int(self.config.deduplication_producer_inactivity_timeout_minutes * 60_000)
        topic.dedup.purge_inactive(now_ms, timeout_ms, topic.producers)


async def _update_rates(topic: Topic, _now_ms: int) -> None:
    topic.update_rates(time.monotonic())


def _pinned_version(ledger: ManagedLedger) -> int | None:
    pinned = ledger.properties.get(TXN_VERSION_PROPERTY)
    return int(pinned) if pinned in ("4", "5") else None
