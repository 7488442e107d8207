"""Namespaces: `/admin/v2/namespaces` (Pulsar's Namespaces resource), with the namespace
de-duplication policy the official client's tests switch on and off, the retention policy and the
delayed delivery policy."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

from pyengine.admin.errors import METHOD_NOT_ALLOWED, NOT_ACCEPTABLE, PRECONDITION_FAILED, AdminError
from pyengine.broker.topic_changes import namespace_settled
from pyengine.admin.names import SUBSCRIPTION_SCHEMA, namespace_name, subscription_name, tenant_name, without_system_topics
from pyengine.admin.policy_routes import add_policy_routes
from pyengine.admin.routes_backlog_quota import BACKLOG_QUOTA_MAP, _fits_retention
from pyengine.admin.routing import Call, Param, Reply, RouteTable
from pyengine.admin.schemas import (
    AUTO_SUBSCRIPTION_CREATION_OVERRIDE,
    AUTO_TOPIC_CREATION_OVERRIDE,
    BOOLEAN,
    DELAYED_DELIVERY_POLICIES,
    INACTIVE_TOPIC_POLICIES,
    DONE,
    INCLUDE_SYSTEM_TOPIC,
    MAX_PARTITIONS,
    MESSAGE_TTL,
    NAMESPACE,
    NAMESPACE_POLICIES,
    RETENTION_POLICIES,
    STRING_LIST,
    TENANT,
    error,
    errors,
)
from pyengine.broker.policies import (AutoTopicCreation, BacklogQuota, DelayedDelivery, InactiveTopicPolicies,
                                     NamespacePolicies, Retention, check_message_ttl)
from pyengine.broker.compaction import COMPACTION_SUBSCRIPTION
from pyengine.broker.subscription import Subscription
from pyengine.errors import NotAllowedError, SubscriptionNotFoundError, TopicNotFoundError
from pyengine.scalable.resources import ScalableTopicResources
from pyengine.schema import CompatibilityStrategy

routes = RouteTable("namespaces")
BASE = "/admin/v2/namespaces"
NAMESPACE_PATH = BASE + "/{tenant}/{namespace}"


def _namespace(call: Call) -> str:
    return namespace_name(call["tenant"], call["namespace"])


def _policies_json(policies: NamespacePolicies) -> dict[str, Any]:
    return {"deduplicationEnabled": policies.deduplication_enabled, "retention_policies": _retention(policies),
            "schema_compatibility_strategy": policies.schema_compatibility_strategy or "UNDEFINED",
            "is_allow_auto_update_schema": policies.is_allow_auto_update_schema,
            "schema_validation_enforced": policies.schema_validation_enforced,
            "delayed_delivery_policies": policies.delayed_delivery,
            "inactive_topic_policies": policies.inactive_topic_policies,
            "autoTopicCreationOverride": policies.auto_topic_creation_override,
            "autoSubscriptionCreationOverride": policies.auto_subscription_creation_override,
            "message_ttl_in_seconds": policies.message_ttl_seconds,
            # Pulsar's Policies names; null: the topic's or the broker's applies.
            "max_producers_per_topic": policies.max_producers_per_topic,
            "max_consumers_per_topic": policies.max_consumers_per_topic,
            "max_consumers_per_subscription": policies.max_consumers_per_subscription,
            "max_unacked_messages_per_consumer": policies.max_unacked_messages_per_consumer,
            "max_unacked_messages_per_subscription": policies.max_unacked_messages_per_subscription,
            "backlog_quota_map": policies.backlog_quota_map or {},
            "properties": policies.properties}


_LIMIT = {"type": "integer", "nullable": True, "minimum": 0, "maximum": 2**31 - 1,
          "description": "null: not set; 0: no limit"}
_LIMIT_FIELDS = ("max_producers_per_topic", "max_consumers_per_topic", "max_consumers_per_subscription",
                 "max_unacked_messages_per_consumer", "max_unacked_messages_per_subscription")
# Pulsar's Policies as created and read: NAMESPACE_POLICIES with the namespace's limits and
# backlog quotas (the body GET answers creates a copy of the namespace).
POLICIES_REPLY = {**NAMESPACE_POLICIES, "properties": {
    **NAMESPACE_POLICIES["properties"], **{name: _LIMIT for name in _LIMIT_FIELDS},
    "backlog_quota_map": {**BACKLOG_QUOTA_MAP, "nullable": True}}}


def _delayed_delivery(body: Any) -> dict[str, Any] | None:
    """NamespacePolicies' field for a DelayedDeliveryPolicies body (None: no policy)."""
    return None if body is None else DelayedDelivery.from_json(body).to_json()


def _inactive_topic_policies(body: Any) -> dict[str, Any] | None:
    """NamespacePolicies' field for an InactiveTopicPolicies body (None: no policy)."""
    return None if body is None else InactiveTopicPolicies.from_json(body).to_json()


def _auto_topic_creation(body: Any) -> dict[str, Any] | None:
    """NamespacePolicies' field for an AutoTopicCreationOverride body (None: no override): 412
    with Pulsar's reason when it does not validate, 406 for more partitions than a partitioned
    topic may have (Pulsar's maxNumPartitionsPerPartitionedTopic)."""
    if body is None:
        return None
    try:
        override = AutoTopicCreation.from_json(body)
    except ValueError as exc:
        raise AdminError(PRECONDITION_FAILED, f"Invalid configuration for autoTopicCreationOverride. the detail is "
                                              f"{exc}") from None
    if override.partitions > MAX_PARTITIONS:
        raise AdminError(NOT_ACCEPTABLE, f"Number of partitions should be less than or equal to {MAX_PARTITIONS}")
    return override.to_json()


def _retention(policies: NamespacePolicies) -> dict[str, int] | None:
    if policies.retention_time_minutes is None or policies.retention_size_mb is None:
        return None
    return Retention(policies.retention_time_minutes, policies.retention_size_mb).to_json()


def _retention_fields(body: Any) -> dict[str, int | None]:
    """NamespacePolicies' fields for a RetentionPolicies body (None: no policy)."""
    if body is None:
        return {"retention_time_minutes": None, "retention_size_mb": None}
    retention = Retention.from_json(body)
    return {"retention_time_minutes": retention.time_minutes, "retention_size_mb": retention.size_mb}


def _strategy_field(value: str | None) -> str | None:
    """NamespacePolicies' field for a SchemaCompatibilityStrategy (None: the broker's default)."""
    strategy = CompatibilityStrategy.parse(value) if value is not None else CompatibilityStrategy.UNDEFINED
    return None if strategy == CompatibilityStrategy.UNDEFINED else strategy.value


@routes.add("GET", BASE + "/{tenant}", summary="List the namespaces of a tenant.", params=(TENANT,),
            replies={200: Reply("Namespace names (tenant/namespace)", STRING_LIST), **errors(404, 412)})
async def list_namespaces(call: Call) -> list[str]:
    return call.service.policies.namespaces(tenant_name(call["tenant"]))


@routes.add("PUT", NAMESPACE_PATH, summary="Create a namespace, optionally with policies.",
            params=(TENANT, NAMESPACE), body=POLICIES_REPLY, replies={204: DONE, **errors(400, 404, 409, 412)})
async def create_namespace(call: Call) -> None:
    body = call.body or {}
    strategy = _strategy_field(body.get("schema_compatibility_strategy"))
    retention = _retention_fields(body.get("retention_policies"))
    quotas = {name: BacklogQuota.from_json(quota).to_json()
              for name, quota in (body.get("backlog_quota_map") or {}).items()}
    storage_quota = quotas.get("destination_storage")
    if storage_quota is not None and retention["retention_time_minutes"] is not None and not _fits_retention(
            BacklogQuota.from_json(storage_quota), Retention.from_json(body["retention_policies"])):
        raise AdminError(PRECONDITION_FAILED, _RETENTION_UNDER_QUOTA)     # as the quota's own POST
    policies = NamespacePolicies(deduplication_enabled=body.get("deduplicationEnabled"),
                                 schema_compatibility_strategy=strategy,
                                 is_allow_auto_update_schema=body.get("is_allow_auto_update_schema"),
                                 schema_validation_enforced=body.get("schema_validation_enforced"),
                                 properties=body.get("properties", {}),
                                 delayed_delivery=_delayed_delivery(body.get("delayed_delivery_policies")),
                                 inactive_topic_policies=_inactive_topic_policies(body.get("inactive_topic_policies")),
                                 auto_topic_creation_override=_auto_topic_creation(
                                     body.get("autoTopicCreationOverride")),
                                 auto_subscription_creation_override=body.get("autoSubscriptionCreationOverride"),
                                 message_ttl_seconds=body.get("message_ttl_in_seconds"),
                                 backlog_quota_map=quotas or None,
                                 **{name: body.get(name) for name in _LIMIT_FIELDS}, **retention)
    await call.service.policies.create_namespace(_namespace(call), policies)


@routes.add("GET", NAMESPACE_PATH, summary="Get a namespace's policies.", params=(TENANT, NAMESPACE),
            replies={200: Reply("Policies", POLICIES_REPLY), **errors(404, 412)})
async def get_policies(call: Call) -> dict[str, Any]:
    return _policies_json(call.service.policies.policies(_namespace(call)))


FORCED_DELETION_REFUSED = "Broker doesn't allow forced deletion of namespaces"       # Pulsar's words
FORCE_DELETE = Param("force", BOOLEAN, "also delete its topics: refused (405), as by a Pulsar broker with its "
                     "default forceDeleteNamespaceAllowed=false", default=False)


@routes.add("DELETE", NAMESPACE_PATH, summary="Delete an empty namespace.", params=(TENANT, NAMESPACE, FORCE_DELETE),
            replies={204: DONE, **errors(404, 409, 412), 405: error(
                f"{FORCED_DELETION_REFUSED} (force=true), or the namespace is one the broker needs")})
async def delete_namespace(call: Call) -> None:
    namespace = _namespace(call)
    if call["force"]:                               # checked first, as Pulsar does
        raise AdminError(METHOD_NOT_ALLOWED, FORCED_DELETION_REFUSED)
    service = call.service
    # A topic being created is not stored yet: once it is, the namespace is not empty (one a
    # producer auto-creates counts while it loads). Checked and deleted in one event-loop turn
    # from here: the namespace is gone from the policies before anything else can load.
    # Its schemas go with it, as Pulsar's (a schema may be uploaded before its topic exists), in
    # the same LMDB write: the schema changes under way are done first too.
    registry = service.schemas.registry
    # Its scalable topics too, stored or not on this broker (their segments may be on another,
    # or not created yet): read from the metadata store, so before the settled check below and
    # not with it. A scalable topic created meanwhile (here or from another broker) is missed,
    # as in Pulsar, whose check and deletion are not atomic either. Read whether or not scalable
    # topics are enabled: disabled, their records are kept all the same.
    has_scalable_topics = bool(await ScalableTopicResources(service.metadata).list(namespace))
    while True:
        await namespace_settled(service, namespace)
        uploads = registry.changes_under_way(namespace)
        if not uploads:
            break                   # (no await since the topics were settled either)
        for lock in uploads:
            async with lock:
                pass
    has_topics = bool(has_scalable_topics or service.list_topics(namespace) or service.loading_topics(namespace)
                      or service.policies.partitioned_topics(namespace))
    # Their cache is forgotten from the write's done-callback: not skipped if this handler is
    # cancelled meanwhile, and done before the namespace can be created again.
    await service.policies.delete_namespace(namespace, has_topics=has_topics,
                                            also=registry.namespace_deletion(namespace),
                                            durable=lambda: registry.forget_namespace(namespace))


@routes.add("GET", NAMESPACE_PATH + "/topics", summary="List every topic of a namespace.",
            params=(TENANT, NAMESPACE, INCLUDE_SYSTEM_TOPIC),
            replies={200: Reply("Full topic names", STRING_LIST), **errors(404, 412)})
async def list_namespace_topics(call: Call) -> list[str]:
    namespace = _namespace(call)
    call.service.policies.policies(namespace)          # 404 for an unknown namespace
    return without_system_topics(call.service.list_topics(namespace), call["includeSystemTopic"])


@routes.add("PUT", NAMESPACE_PATH + "/unload",
            summary="Unload every loaded topic of a namespace (Pulsar unloads its bundles): each is closed, its "
                    "clients reconnect, and its next use loads it again from storage.",
            params=(TENANT, NAMESPACE), replies={204: DONE, **errors(404, 412)})
async def unload_namespace(call: Call) -> None:
    namespace = _namespace(call)
    call.service.policies.policies(namespace)          # 404 for an unknown namespace
    await call.service.unload_namespace(namespace)


NAMESPACE_SUBSCRIPTION = Param("subscription", SUBSCRIPTION_SCHEMA, "subscription name (URL-encoded)", "path",
                               required=True)
CLEAR_FORCE = Param("force", BOOLEAN, "accepted for pulsar-admin's sake (its confirmation prompt): no effect",
                    default=False)


async def _subscriptions_of_namespace(call: Call, name: str | None) -> list[Subscription]:
    """The durable subscriptions (all, or those named `name`) of every stored topic of the
    namespace, partitions included, loading the topics (Pulsar's walk the namespace's bundles'
    topics: ours has no bundles, and a topic not loaded is a topic all the same). The topics'
    compaction subscriptions are the broker's own: left alone."""
    namespace = _namespace(call)
    service = call.service
    service.policies.policies(namespace)          # 404 for an unknown namespace
    found = []
    for topic_name in without_system_topics(service.list_topics(namespace), False):     # not the broker's own
        try:
            topic = await service.get_open_topic(topic_name, create=False)
        except TopicNotFoundError:
            continue                              # deleted meanwhile
        found += [subscription for subscription_name, subscription in topic.subscriptions.items()
                  if subscription_name != COMPACTION_SUBSCRIPTION and name in (None, subscription_name)]
    return found


@routes.add("POST", NAMESPACE_PATH + "/clearBacklog",
            summary="Clear the backlog of every subscription of the namespace's topics (up to each topic's read "
                    "horizon: an open transaction's messages are still delivered if it commits).",
            params=(TENANT, NAMESPACE, CLEAR_FORCE), replies={204: DONE, **errors(404, 412)})
async def clear_namespace_backlog(call: Call) -> None:
    for subscription in await _subscriptions_of_namespace(call, None):
        await subscription.clear_backlog()


@routes.add("POST", NAMESPACE_PATH + "/clearBacklog/{subscription}",
            summary="Clear the backlog of one subscription on every topic of the namespace that has it.",
            params=(TENANT, NAMESPACE, NAMESPACE_SUBSCRIPTION, CLEAR_FORCE), replies={204: DONE, **errors(404, 412)})
async def clear_namespace_subscription_backlog(call: Call) -> None:
    for subscription in await _subscriptions_of_namespace(call, subscription_name(call["subscription"])):
        await subscription.clear_backlog()


@routes.add("POST", NAMESPACE_PATH + "/unsubscribe/{subscription}",
            summary="Delete a subscription from every topic of the namespace that has it (412 if one of them has "
                    "connected consumers: the others are deleted).",
            params=(TENANT, NAMESPACE, NAMESPACE_SUBSCRIPTION), replies={204: DONE, **errors(404, 412)})
async def unsubscribe_namespace(call: Call) -> None:
    busy = []
    for subscription in await _subscriptions_of_namespace(call, subscription_name(call["subscription"])):
        try:
            await subscription.topic.unsubscribe(subscription.name)
        except NotAllowedError:
            busy.append(subscription.topic.name)
        except SubscriptionNotFoundError:
            pass                                  # deleted meanwhile
    if busy:
        raise AdminError(PRECONDITION_FAILED, f"Subscription has active connected consumers on {', '.join(busy)}")


async def _change_policies(call: Call, **changes: Any) -> None:
    """Store the namespace's policies with `changes`, and apply them to its loaded topics."""
    namespace = _namespace(call)
    policies = call.service.policies
    await policies.set_policies(namespace, dataclasses.replace(policies.policies(namespace), **changes))


DEFAULT_APPLIES = "Not set: the broker's default applies"


def _namespace_policy(path: str, name: str, schema: dict[str, Any], shown: str, summaries: tuple[str, str, str | None],
                      *, field: str | None = None, read: Callable[[NamespacePolicies], Any] | None = None,
                      fields: Callable[[Any], dict[str, Any]] | None = None,
                      validate: Callable[[Any], Any] | None = None,
                      not_set: str = DEFAULT_APPLIES) -> None:
    """The routes of one namespace policy: its NamespacePolicies `field` (or what `read` makes of
    the policies, and the `fields` a value sets), set to `validate(value)`, None when removed."""
    read = read or operator.attrgetter(field)
    fields = fields or (lambda value: {field: value})
    add_policy_routes(routes, NAMESPACE_PATH + path, name, params=(TENANT, NAMESPACE), schema=schema, shown=shown,
                      not_set=not_set, summaries=summaries, validate=validate,
                      read=lambda call: read(call.service.policies.policies(_namespace(call))),
                      store=lambda call, value: _change_policies(call, **fields(value)))


_namespace_policy("/deduplication", "namespace_deduplication", BOOLEAN, "Enabled or not", (
    "Get the namespace's de-duplication policy.",
    "Enable or disable de-duplication on a namespace.",
    "Remove the namespace's de-duplication policy (the broker's default applies)."), field="deduplication_enabled")


# --- retention of consumed ledgers ----------------------------------------------------------------

_RETENTION_UNDER_QUOTA = "Retention Quota must exceed configured backlog quota for namespace."     # Pulsar's words


async def _store_namespace_retention(call: Call, body: Any) -> None:
    """As Pulsar's checkQuotas: once the namespace has backlog quotas, a retention must keep more
    than its destination_storage quota (else the broker's default) allows: 412 otherwise."""
    fields = _retention_fields(body)
    if body is not None:
        policies = call.service.policies
        quota_map = policies.policies(_namespace(call)).backlog_quota_map or {}
        stored = quota_map.get("destination_storage")
        if quota_map and not _fits_retention(BacklogQuota.from_json(stored) if stored is not None
                                             else policies.backlog_quota_default, Retention.from_json(body)):
            raise AdminError(PRECONDITION_FAILED, _RETENTION_UNDER_QUOTA)
    await _change_policies(call, **fields)


add_policy_routes(routes, NAMESPACE_PATH + "/retention", "namespace_retention", params=(TENANT, NAMESPACE),
                  schema=RETENTION_POLICIES, shown="RetentionPolicies", not_set=DEFAULT_APPLIES, summaries=(
                      "Get the namespace's retention policy.",
                      "Set how long and how much of its topics' consumed ledgers a namespace keeps.",
                      "Remove the namespace's retention policy (the broker's default applies)."),
                  read=lambda call: _retention(call.service.policies.policies(_namespace(call))),
                  store=_store_namespace_retention)


# --- delayed delivery -------------------------------------------------------------------------

_namespace_policy("/delayedDelivery", "namespace_delayed_delivery", DELAYED_DELIVERY_POLICIES,
                  "DelayedDeliveryPolicies", (
    "Get the namespace's delayed delivery policy.",
    "Set whether the namespace's Shared and Key_Shared subscriptions delay messages, the tick of their release "
    "and the longest delay a producer may ask for.",
    "Remove the namespace's delayed delivery policy (the broker's default applies)."),
    field="delayed_delivery", validate=_delayed_delivery)


# --- inactive topics ---------------------------------------------------------------------------

_namespace_policy("/inactiveTopicPolicies", "namespace_inactive_topic_policies", INACTIVE_TOPIC_POLICIES,
                  "InactiveTopicPolicies", (
    "Get the namespace's inactive topic policies.",
    "Set whether the namespace's topics are deleted once inactive, after how long, and what inactive means "
    "(no subscription, or none with a backlog). A topic's retention time is waited for too.",
    "Remove the namespace's inactive topic policies (the broker's default applies)."),
    field="inactive_topic_policies", validate=_inactive_topic_policies)


# --- auto topic creation -----------------------------------------------------------------------

_namespace_policy("/autoTopicCreation", "auto_topic_creation", AUTO_TOPIC_CREATION_OVERRIDE,
                  "AutoTopicCreationOverride", (
    "Get the namespace's override of the broker's auto topic creation.",
    "Override whether producers and consumers create the namespace's topics that do not exist, and whether as "
    "partitioned topics (created by the client's lookup of the partitioned metadata) or non-partitioned ones.",
    "Remove the namespace's override (the broker's allowAutoTopicCreation settings apply)."),
    field="auto_topic_creation_override", validate=_auto_topic_creation)


_namespace_policy("/autoSubscriptionCreation", "auto_subscription_creation", AUTO_SUBSCRIPTION_CREATION_OVERRIDE,
                  "AutoSubscriptionCreationOverride", (
    "Get the namespace's override of the broker's auto subscription creation.",
    "Override whether consumers create the durable subscriptions of the namespace's topics that do not exist (and "
    "producers their initial subscriptions).",
    "Remove the namespace's override (the broker's allowAutoSubscriptionCreation applies)."),
    field="auto_subscription_creation_override")


# --- message TTL ---------------------------------------------------------------------------------

def message_ttl_of(value: Any) -> int:
    """A TTL a request sets (already an integer by its schema): 412 for a negative one, with
    Pulsar's reason."""
    if value < 0:
        raise AdminError(PRECONDITION_FAILED, "Invalid value for message TTL")
    return check_message_ttl(value)


_namespace_policy("/messageTTL", "namespace_message_ttl", MESSAGE_TTL, "Seconds (0: messages do not expire)", (
    "Get the namespace's message TTL (seconds).",
    "Set how many seconds after it was published a message of the namespace's topics expires (0: never): the "
    "broker's expiry task acknowledges it on every subscription.",
    "Remove the namespace's message TTL (the broker's default applies)."),
    field="message_ttl_seconds", validate=message_ttl_of)


# --- the transaction design of a namespace's topics (PIP-473) ----------------------------------

TRANSACTION_VERSION = {"type": "integer", "enum": [4, 5],
                       "description": "4: in-stream markers (persistent:// default), 5: metadata-driven "
                                      "(segment:// default)"}


_namespace_policy("/transactionVersion", "transaction_version", TRANSACTION_VERSION, "4 or 5", (
    "Get the transaction design overriding the topic domain's default in a namespace.",
    "Override the transaction design of a namespace's topics (migration, debugging). It applies to the topics "
    "first loaded after it is set: a topic keeps the design of its first load (each design reads only its own "
    "transaction state; switched, a topic would show its aborted and open transactions' messages).",
    "Remove the override: the topic domain's default applies."),
    field="transaction_version", not_set="Not set: segment:// topics use 5, the others 4")


# --- schema registry policies ---------------------------------------------------------------------

STRATEGY = {"type": "string", "enum": [s.value for s in CompatibilityStrategy],
            "description": "SchemaCompatibilityStrategy (UNDEFINED: the broker's default)"}


@routes.add("GET", NAMESPACE_PATH + "/schemaCompatibilityStrategy",
            summary="Get the namespace's schema compatibility strategy (UNDEFINED: the broker's default).",
            params=(TENANT, NAMESPACE), replies={200: Reply("The strategy", STRATEGY), **errors(404, 412)})
async def get_schema_compatibility_strategy(call: Call) -> str:
    value = call.service.policies.policies(_namespace(call)).schema_compatibility_strategy
    return value or CompatibilityStrategy.UNDEFINED.value


@routes.add("PUT", NAMESPACE_PATH + "/schemaCompatibilityStrategy",
            summary="Set how new schemas of the namespace's topics are checked.",
            params=(TENANT, NAMESPACE), body=STRATEGY, body_required=True,
            replies={204: DONE, **errors(400, 404, 412)})
async def set_schema_compatibility_strategy(call: Call) -> None:
    await _change_policies(call, schema_compatibility_strategy=_strategy_field(call.body))


_namespace_policy("/isAllowAutoUpdateSchema", "allow_auto_update_schema", BOOLEAN, "Allowed or not", (
    "Whether producers and consumers may register new schemas (unset: the broker's default).",
    "Allow or forbid producers and consumers to register new schemas.", None), field="is_allow_auto_update_schema")
_namespace_policy("/schemaValidationEnforced", "schema_validation_enforced", BOOLEAN, "Enforced or not", (
    "Whether producers without a schema are refused on topics with one (unset: the broker's default).",
    "Refuse (or accept) producers without a schema on topics that have one.", None),
    field="schema_validation_enforced")
