"""Persistent topics: `/admin/v2/persistent/{tenant}/{namespace}/...` (Pulsar's
PersistentTopics resource): listing, creating and deleting plain and partitioned topics, their
stats, the topic-level de-duplication, retention, delayed delivery and message TTL policies,
unloading and termination.

A partitioned topic is its metadata (its number of partitions) and its partitions, plain
topics named `<topic>-partition-<n>`: as Pulsar's tryCreatePartitionsAsync, they are created
(and loaded) as soon as the metadata is stored or the number grows, so that the topic lists and
the partitioned stats show every one of them before any client used it.

Topic properties (`.../{topic}/properties`, and the body of a creation) are those of
`pyengine.broker.topic_properties`: a partitioned topic's in its metadata, any other's in its
ledger, apart from the broker's own ledger properties.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pyengine.admin import stats
from pyengine.admin.errors import (
    BAD_REQUEST, CONFLICT, METHOD_NOT_ALLOWED, NOT_FOUND, PRECONDITION_FAILED, UNPROCESSABLE, AdminError,
)
from pyengine.broker.topic_changes import topic_change
from pyengine.admin.names import namespace_name, topic_name, without_system_topics
from pyengine.admin.policy_routes import add_policy_routes
from pyengine.admin.routes_backlog_quota import _fits_retention
from pyengine.admin.routes_namespaces import message_ttl_of
from pyengine.admin.routing import Call, Param, Reply, RouteTable
from pyengine.admin.schemas import (
    AUTO_SUBSCRIPTION_CREATION_OVERRIDE,
    BOOLEAN,
    DELAYED_DELIVERY_POLICIES,
    INACTIVE_TOPIC_POLICIES,
    DONE,
    FORCE,
    INCLUDE_SYSTEM_TOPIC,
    INTERNAL_STATS,
    LAST_MESSAGE_ID,
    MAX_PARTITIONS,
    MESSAGE_TTL,
    NAMESPACE,
    NEW_PARTITIONED_TOPIC,
    NEW_PARTITIONS,
    PARTITIONED_INTERNAL_STATS,
    PARTITIONED_METADATA,
    PARTITIONED_TOPIC_STATS,
    RETENTION_POLICIES,
    STRING_LIST,
    TENANT,
    TERMINATED_AT,
    TOPIC_PATH,
    TOPIC_PROPERTIES,
    TOPIC_STATS,
    errors,
)
from pyengine.broker.compaction import COMPACTION_SUBSCRIPTION
from pyengine.broker.policies import (
    TC_ASSIGN_TOPIC, DelayedDelivery, InactiveTopicPolicies, Retention, check_partitioned_topic_name,
)
from pyengine.broker.service import BrokerService
from pyengine.broker.topic import Topic
from pyengine.broker.topic_properties import (
    check_properties, ledger_topic_properties, update_ledger_topic_properties,
)
from pyengine.naming import PARTITION_SUFFIX, TopicName
from pyengine.protocol import lookup
from pyengine.protocol.lookup import is_transaction_internal
from pyengine.schema import CompatibilityStrategy, schema_id

routes = RouteTable("persistent topics")
BASE = "/admin/v2/persistent/{tenant}/{namespace}"
TOPIC_URL = BASE + "/{topic}"
APPLIED = Param("applied", BOOLEAN, "the policy in force (topic, else namespace, else broker default)",
                default=False)


def requested_topic(call: Call) -> TopicName:
    return topic_name(call["tenant"], call["namespace"], call["topic"])


async def existing_topic(service: BrokerService, name: TopicName) -> Topic:
    """The stored topic `name` (404 if it does not exist, also for a partitioned topic's name),
    loaded again if it is being unloaded (closed, it is being deleted)."""
    if service.policies.partitions(str(name)):
        raise AdminError(NOT_FOUND, f"{name} is a partitioned topic: ask for one of its partitions "
                                    "or for the partitioned topic's own resource")
    return await service.get_open_topic(str(name), create=False)


def has_clients(topic: Topic) -> bool:
    """Producers or consumers, readers' included (Pulsar's currentUsageCount)."""
    return bool(topic.producers) or topic.number_of_consumers() > 0


def partition_names(name: TopicName, partitions: int) -> list[str]:
    return [str(name.partition(index)) for index in range(partitions)]


# --- listing --------------------------------------------------------------------------------

@routes.add("GET", BASE, summary="List the persistent topics of a namespace (plain topics and partitions).",
            params=(TENANT, NAMESPACE, INCLUDE_SYSTEM_TOPIC),
            replies={200: Reply("Full topic names", STRING_LIST), **errors(404, 412)})
async def list_topics(call: Call) -> list[str]:
    namespace = namespace_name(call["tenant"], call["namespace"])
    call.service.policies.policies(namespace)
    return without_system_topics([name for name in call.service.list_topics(namespace)
                                  if name.startswith("persistent://")], call["includeSystemTopic"])


@routes.add("GET", BASE + "/partitioned", summary="List the partitioned topics of a namespace.",
            params=(TENANT, NAMESPACE, INCLUDE_SYSTEM_TOPIC),
            replies={200: Reply("Full topic names", STRING_LIST), **errors(404, 412)})
async def list_partitioned_topics(call: Call) -> list[str]:
    namespace = namespace_name(call["tenant"], call["namespace"])
    policies = call.service.policies
    policies.policies(namespace)
    return without_system_topics([name for name in policies.partitioned_topics(namespace)
                                  if name.startswith("persistent://")], call["includeSystemTopic"])


# --- non-partitioned topics ------------------------------------------------------------------

_JAVA_LONG = re.compile(r"([+-]?)0*(\d+)")


def _java_long(text: str) -> int | None:
    """`text` as Java's Long.parseLong reads it (a sign, decimal digits, within 64 bits), else None."""
    match = _JAVA_LONG.fullmatch(text)
    if match is None or len(match[2]) > 19:          # (longer: out of range, and not given to int())
        return None
    value = int(match[1] + match[2])
    return value if -2**63 <= value < 2**63 else None


def check_non_partitioned_topic_name(service: BrokerService, name: TopicName) -> None:
    """As Pulsar's validateNonPartitionTopicName: a topic created by name that reads as
    partition n of `<base>` (n what Java's Long.parseLong reads after the first "-partition-")
    is refused (412) unless `<base>` is a partitioned topic with more than n partitions: a
    topic outside the partitions would outlive its partitioned topic and bound its partitions.
    Anything else after "-partition-" (not a number) names no partition and is allowed."""
    base, sep, suffix = name.local_name.partition(PARTITION_SUFFIX)
    index = _java_long(suffix) if sep else None
    if index is None:
        return
    if not base:
        raise AdminError(PRECONDITION_FAILED, f"{name} is named as a partition of no topic: it cannot be created")
    partitioned = TopicName(name.domain, name.tenant, name.namespace, base)
    partitions = service.policies.partitions(str(partitioned))
    if not partitions:
        raise AdminError(PRECONDITION_FAILED, f"{name} is named as partition {suffix} of {partitioned}, which is "
                                              "not a partitioned topic: it cannot be created")
    if index >= partitions:
        raise AdminError(PRECONDITION_FAILED, f"{name} is named as partition {suffix} of {partitioned}, which has "
                                              f"{partitions} partitions (0 to {partitions - 1}): it cannot be created")


def check_not_transaction_internal(name: TopicName) -> None:
    """As Pulsar's validateCreateTopic: no topic is created by hand under the name of one of the
    transactions' internal topics (it would be taken for one, and hidden as a system topic)."""
    if is_transaction_internal(name):
        raise AdminError(BAD_REQUEST, f"Cannot create topic in system topic format! ({name})")


@routes.add("PUT", TOPIC_URL, summary="Create a non-partitioned topic (or a partition of a partitioned topic), "
                                       "with the topic properties of the body if any.",
            params=TOPIC_PATH, body={**TOPIC_PROPERTIES, "nullable": True},
            replies={204: DONE, **errors(400, 404, 409, 412)})
async def create_topic(call: Call) -> None:
    name = requested_topic(call)
    properties = check_properties(call.body or {})
    check_not_transaction_internal(name)
    async with topic_change(call.service, name):         # checked and created in one turn
        await _create_topic(call.service, name, properties)


async def _create_topic(service: BrokerService, name: TopicName, properties: dict[str, Any]) -> None:
    service.policies.policies(name.namespace_name)           # 404 first, as Pulsar
    check_non_partitioned_topic_name(service, name)
    if service.policies.partitions(str(name)):
        raise AdminError(CONFLICT, f"{name} already exists as a partitioned topic")
    if service.topic_exists(str(name)):
        raise AdminError(CONFLICT, f"topic {name} already exists")
    topic = await service.get_topic(str(name))
    if properties:
        await update_ledger_topic_properties(topic.ledger, properties)


@routes.add("DELETE", TOPIC_URL, summary="Delete a non-partitioned topic (or one partition).",
            params=(*TOPIC_PATH, FORCE), replies={204: DONE, **errors(400, 404, 409, 412)})
async def delete_topic(call: Call) -> None:
    name = requested_topic(call)
    async with topic_change(call.service, name):
        await _delete_topic(call, name)


async def _delete_topic(call: Call, name: TopicName) -> None:
    service = call.service
    if service.policies.partitions(str(name)):
        raise AdminError(CONFLICT, f"{name} is a partitioned topic: DELETE .../{name.local_name}/partitions")
    topic = await service.get_topic(str(name), create=False)
    if has_clients(topic) and not call["force"]:
        raise AdminError(PRECONDITION_FAILED, "Topic has active producers/subscriptions")
    await service.delete_topic(str(name))


# --- partitioned topics ----------------------------------------------------------------------

@routes.add("PUT", TOPIC_URL + "/partitions", summary="Create a partitioned topic (with topic properties when the "
                                                        "body is its metadata).", params=TOPIC_PATH,
            body=NEW_PARTITIONED_TOPIC, body_required=True, replies={204: DONE, **errors(400, 404, 406, 409, 412)})
async def create_partitioned_topic(call: Call) -> None:
    name = requested_topic(call)
    check_partitioned_topic_name(name)                         # 412 first, as Pulsar
    check_not_transaction_internal(name)
    if isinstance(call.body, dict):
        partitions, properties = call.body["partitions"], check_properties(call.body.get("properties") or {})
    else:
        partitions, properties = call.body, {}
    service = call.service
    async with topic_change(service, name):     # a plain topic being created is not stored yet
        await service.load_settled(str(name))     # nor one a producer is creating
        if service.topic_exists(str(name)):
            raise AdminError(CONFLICT, f"a non-partitioned topic {name} already exists")
        await service.policies.create_partitioned_topic(str(name), partitions, properties)
        await _create_missing_partitions(service, name, partitions)


async def _create_missing_partitions(service: BrokerService, name: TopicName, partitions: int) -> None:
    """As Pulsar's tryCreatePartitionsAsync, once the metadata says `partitions`: every partition
    that does not exist yet is created (the existing ones are left as they are, not loaded)."""
    for partition in partition_names(name, partitions):
        if not service.topic_exists(partition):
            await service.get_topic(partition)


UPDATE_FORCE = Param("force", BOOLEAN, "also when topics named as partitions beyond the current count exist "
                     "(they become partitions of the topic)", default=False)


@routes.add("POST", TOPIC_URL + "/partitions", summary="Increase the number of partitions of a partitioned topic.",
            params=(*TOPIC_PATH, UPDATE_FORCE), body=NEW_PARTITIONS, body_required=True,
            replies={204: DONE, **errors(400, 406, 409, 412, 422, 503)})
async def update_partitioned_topic(call: Call) -> None:
    name = requested_topic(call)
    check_partitioned_topic_name(name)                         # 412 first, as Pulsar
    if str(name) == TC_ASSIGN_TOPIC:
        # Its partitions are the coordinators (as in Pulsar): scaled with their checks, and
        # started, as POST /admin/v3/transactions/transactionCoordinator/replicas does
        from pyengine.admin.routes_transactions import scale_coordinators

        if call.body != call.service.policies.partitions(TC_ASSIGN_TOPIC):
            await scale_coordinators(call.service, call.body)
        return
    async with topic_change(call.service, name):    # a deletion meanwhile left the added partitions
        await _update_partitioned_topic(call, name)


async def _update_partitioned_topic(call: Call, name: TopicName) -> None:
    service = call.service
    policies = service.policies
    current = policies.partitions(str(name))
    if not current:
        raise AdminError(CONFLICT, f"Topic {name} is not the partitioned topic.")
    if call.body < current:
        raise AdminError(UNPROCESSABLE, f"Expect partitions {call.body} can't less than current partitions {current}.")
    if call.body > MAX_PARTITIONS:
        raise AdminError(UNPROCESSABLE, f"Expect partitions {call.body} grater than maximum partitions per topic "
                                        f"{MAX_PARTITIONS}")                                   # Pulsar's words
    if not call["force"]:
        # As Pulsar: a stored topic named as a partition past the current count (created by
        # name before, or left from an earlier partitioned topic) would silently become one.
        beyond = [p for p in partition_names(name, policies.max_partition_index(str(name)) + 1)[current:]
                  if service.topic_exists(p)]
        if beyond:
            raise AdminError(CONFLICT, f"Exist unexpected topic partition (partition index greater than current "
                                       f"metadata maximum index {current - 1}): {', '.join(beyond)}; "
                                       f"POST with force=true to take them as partitions")
    if call.body != current:
        await policies.update_partitions(str(name), call.body)
    await _create_missing_partitions(service, name, call.body)       # also when the count is the same, as Pulsar
    await _copy_subscriptions_of_partition_0(service, name, call.body)


async def _copy_subscriptions_of_partition_0(service: BrokerService, name: TopicName, partitions: int) -> None:
    """As Pulsar's update of a partitioned topic: the durable subscriptions of partition 0 are
    created, at the earliest position, on every partition that lacks them, so what is
    published on an added partition before a consumer comes is kept for them."""
    first = str(name.partition(0))
    if not service.topic_exists(first):
        return                              # nothing subscribed yet
    # A partition being unloaded is waited for and loaded again: the closing one refuses.
    subscriptions = [n for n, s in (await service.get_open_topic(first, create=False)).subscriptions.items()
                     if n != COMPACTION_SUBSCRIPTION and s.durable]
    if not subscriptions:
        return
    for index in range(1, partitions):
        partition = await service.get_open_topic(str(name.partition(index)))
        for subscription in subscriptions:
            await partition.open_subscription(subscription, "earliest")


CHECK_ALLOW_AUTO_CREATION = Param(
    "checkAllowAutoCreation", BOOLEAN, "a topic that does not exist is answered as a client's lookup finds it, where "
    "auto topic creation is allowed: created now as a partitioned topic where topics are created so, else 0 "
    "partitions (created as a non-partitioned topic on first use); 404 where creation is not allowed",
    default=False)


@routes.add("GET", TOPIC_URL + "/partitions", summary="Get a topic's partitioned metadata (0 partitions: not partitioned).",
            params=(*TOPIC_PATH, CHECK_ALLOW_AUTO_CREATION),
            replies={200: Reply("PartitionedTopicMetadata", PARTITIONED_METADATA), **errors(404, 412)})
async def get_partitioned_metadata(call: Call) -> dict[str, Any]:
    topic = requested_topic(call)
    call.service.policies.policies(topic.namespace_name)        # 404 first, as Pulsar (and PARTITIONED_METADATA)
    name = str(topic)
    service = call.service
    partitions = service.policies.partitions(name)
    if partitions:
        properties = service.policies.partitioned_properties(name)
        return {"partitions": partitions, **({"properties": properties} if properties else {})}
    if service.topic_exists(name):
        return {"partitions": 0}
    if call["checkAllowAutoCreation"] and service.auto_creates(topic):
        created = lookup.auto_partitions(service, topic)
        return {"partitions": await lookup.create_partitioned_topic(service, topic, created) if created else 0}
    # As Pulsar's admin (apache/pulsar#10601): 0 partitions means a non-partitioned topic
    # only if there is one; a topic that does not exist is 404.
    raise AdminError(NOT_FOUND, f"Topic {name} not found")


@routes.add("DELETE", TOPIC_URL + "/partitions", summary="Delete a partitioned topic and its partitions.",
            params=(*TOPIC_PATH, FORCE), replies={204: DONE, **errors(400, 404, 405, 412)})
async def delete_partitioned_topic(call: Call) -> None:
    name = requested_topic(call)
    if str(name) == TC_ASSIGN_TOPIC:
        raise AdminError(METHOD_NOT_ALLOWED, f"{name} lists the transaction coordinators: it cannot be deleted")
    async with topic_change(call.service, name):    # no partition created or added meanwhile
        await _delete_partitioned_topic(call, name)


async def _delete_partitioned_topic(call: Call, name: TopicName) -> None:
    service = call.service
    partitions = service.policies.partitions(str(name))
    if not partitions:
        raise AdminError(NOT_FOUND, f"partitioned topic {name} does not exist")
    names = partition_names(name, partitions)
    if not call["force"] and any(has_clients(service.topics[p]) for p in names if p in service.topics):
        raise AdminError(PRECONDITION_FAILED, "Topic has active producers/subscriptions")
    # No producer creates a partition meanwhile (one created after the loop passed it was left).
    async with service.deleting_partitioned_topic(str(name)):
        for partition in names:
            if service.topic_exists(partition):
                await service.delete_topic(partition)
        # Its metadata, topic-level policies and schemas in one LMDB write, once every partition
        # is gone (as Pulsar, which deletes the metadata last): a crash leaves it to a retry.
        async with service.schemas.registry.deleting(schema_id(name)) as schemas:
            await service.policies.delete_partitioned_topic(str(name), also=[schemas])


# --- topic properties -----------------------------------------------------------------------

def _is_partitioned(service: BrokerService, name: TopicName) -> bool:
    """Whether `name` is a partitioned topic itself (a partition's properties are its ledger's)."""
    return name.partition_index < 0 and bool(service.policies.partitions(str(name)))


@routes.add("GET", TOPIC_URL + "/properties", summary="Get a topic's properties (a partitioned topic's: those of "
                                                      "its metadata; a partition's: its own).",
            params=TOPIC_PATH, replies={200: Reply("Topic properties", TOPIC_PROPERTIES), **errors(404, 412)})
async def get_topic_properties(call: Call) -> dict[str, str]:
    name = requested_topic(call)
    service = call.service
    service.policies.policies(name.namespace_name)           # 404 for the namespace first
    if _is_partitioned(service, name):
        return service.policies.partitioned_properties(str(name))
    return ledger_topic_properties((await service.get_open_topic(str(name), create=False)).ledger)


async def _change_topic_properties(call: Call, changes: dict[str, str | None]) -> None:
    name = requested_topic(call)
    service = call.service
    async with topic_change(service, name):     # not stored after the topic's deletion
        service.policies.policies(name.namespace_name)
        if _is_partitioned(service, name):
            await service.policies.update_partitioned_properties(str(name), changes)
        else:
            topic = await service.get_open_topic(str(name), create=False)
            await update_ledger_topic_properties(topic.ledger, changes)


@routes.add("PUT", TOPIC_URL + "/properties", summary="Update a topic's properties: the body's are merged into the "
                                                      "ones it has (an empty body changes nothing).",
            params=TOPIC_PATH, body={**TOPIC_PROPERTIES, "nullable": True},
            replies={204: DONE, **errors(400, 404, 412)})
async def update_topic_properties(call: Call) -> None:
    await _change_topic_properties(call, check_properties(call.body or {}))


PROPERTY_KEY = Param("key", {"type": "string", "minLength": 1}, "the property to remove", required=True)


@routes.add("DELETE", TOPIC_URL + "/properties", summary="Remove one property of a topic (one it does not have: "
                                                         "nothing changes).",
            params=(*TOPIC_PATH, PROPERTY_KEY), replies={204: DONE, **errors(400, 404, 412)})
async def remove_topic_property(call: Call) -> None:
    await _change_topic_properties(call, check_properties({call["key"]: None}, deletions=True))


# --- stats ----------------------------------------------------------------------------------

@routes.add("GET", TOPIC_URL + "/stats", summary="Get the stats of a topic (or of one partition).",
            params=TOPIC_PATH, replies={200: Reply("TopicStats", TOPIC_STATS), **errors(404, 412)})
async def get_stats(call: Call) -> dict[str, Any]:
    return stats.topic_stats(await existing_topic(call.service, requested_topic(call)))


PER_PARTITION = Param("perPartition", BOOLEAN, "also each partition's stats, under `partitions`", default=True)


@routes.add("GET", TOPIC_URL + "/partitioned-stats", summary="Get the stats of a partitioned topic, per partition.",
            params=(*TOPIC_PATH, PER_PARTITION), replies={200: Reply("PartitionedTopicStats", PARTITIONED_TOPIC_STATS),
                                        **errors(404, 412)})
async def get_partitioned_stats(call: Call) -> dict[str, Any]:
    partitions, stored = await _stored_partitions(call)
    return stats.partitioned_topic_stats(partitions, stored, call["perPartition"])


async def _not_partitioned(call: Call, refusal: str) -> Topic:
    """The requested stored topic; a partitioned topic's name is 405 with Pulsar's `refusal`."""
    name = requested_topic(call)
    if call.service.policies.partitions(str(name)):
        raise AdminError(METHOD_NOT_ALLOWED, refusal)
    return await existing_topic(call.service, name)


async def _stored_partitions(call: Call) -> tuple[int, dict[str, Topic]]:
    """The requested partitioned topic's partition count, and its partitions stored so far
    (404 if it is not a partitioned topic)."""
    name = requested_topic(call)
    service = call.service
    partitions = service.policies.partitions(str(name))
    if not partitions:
        raise AdminError(NOT_FOUND, f"partitioned topic {name} does not exist")
    return partitions, {p: await service.get_topic(p, create=False)
                        for p in partition_names(name, partitions) if service.topic_exists(p)}


@routes.add("GET", TOPIC_URL + "/internalStats", summary="Get the internal stats of a topic (ledgers and cursors).",
            params=TOPIC_PATH, replies={200: Reply("PersistentTopicInternalStats", INTERNAL_STATS),
                                        **errors(404, 412)})
async def get_internal_stats(call: Call) -> dict[str, Any]:
    return stats.internal_stats(await existing_topic(call.service, requested_topic(call)))


@routes.add("GET", TOPIC_URL + "/partitioned-internalStats",
            summary="Get the internal stats of each partition of a partitioned topic.",
            params=TOPIC_PATH, replies={200: Reply("PartitionedTopicInternalStats", PARTITIONED_INTERNAL_STATS),
                                        **errors(404, 412)})
async def get_partitioned_internal_stats(call: Call) -> dict[str, Any]:
    partitions, stored = await _stored_partitions(call)
    return {"metadata": {"partitions": partitions},
            "partitions": {name: stats.internal_stats(topic) for name, topic in stored.items()}}


@routes.add("GET", TOPIC_URL + "/lastMessageId",
            summary="Get the id of the last message readers can see (the read horizon: never one of an open "
                    "transaction, nor a marker).",
            params=TOPIC_PATH, replies={200: Reply("MessageId", LAST_MESSAGE_ID), **errors(404, 405, 412)})
async def get_last_message_id(call: Call) -> dict[str, Any]:
    topic = await _not_partitioned(call, "GetLastMessageId on a partitioned topic is not allowed")
    position, batch_size = topic.last_message_position()          # what GET_LAST_MESSAGE_ID answers
    last = {"ledgerId": position.ledger_id, "entryId": position.entry_id, "partitionIndex": topic.partition_index}
    if batch_size > 1:
        last.update(batchIndex=batch_size - 1, batchSize=batch_size)
    return last


# --- topic-level de-duplication -------------------------------------------------------------

def known_topic(service: BrokerService, name: TopicName) -> TopicName:
    """`name` if it is a stored topic, a partitioned topic or one of its partitions (else 404)."""
    partitioned = service.policies.partitions(str(name.partitioned_topic))
    if not (service.topic_exists(str(name)) or partitioned > max(name.partition_index, 0)):
        raise AdminError(NOT_FOUND, f"topic {name} does not exist")
    return name


async def _set_topic_policy(call: Call, policy: str, value: Any) -> None:
    """Store (None: remove) one policy of the topic, and apply it if the topic is loaded."""
    # Not while the topic is deleted: stored after its deletion, it outlived the topic.
    async with topic_change(call.service, requested_topic(call)):
        name = known_topic(call.service, requested_topic(call))
        await call.service.policies.set_topic_policy(str(name), policy, value)


def _topic_policy(path: str, name: str, key: str, schema: dict[str, Any], shown: str,
                  summaries: tuple[str, str, str], applied: Callable[[BrokerService, str], Any], **more: Any) -> None:
    """The routes of one topic policy, stored under `key` in the topic's policies; GET with
    ?applied=true answers `applied(service, topic)`, the policy in force."""

    def read(call: Call) -> Any:
        name = str(known_topic(call.service, requested_topic(call)))
        return applied(call.service, name) if call["applied"] else call.service.policies.topic_policies(name).get(key)

    add_policy_routes(routes, TOPIC_URL + path, f"topic_{name}", params=TOPIC_PATH, get_params=(APPLIED,),
                      get_errors=(400, 404, 412), schema=schema, shown=shown, not_set="Not set on the topic",
                      summaries=summaries, read=read, store=lambda call, value: _set_topic_policy(call, key, value),
                      **more)


_topic_policy("/deduplicationEnabled", "deduplication", "deduplicationEnabled", BOOLEAN, "Enabled or not", (
    "Get the topic's de-duplication policy.",
    "Enable or disable de-duplication on a topic.",
    "Remove the topic's de-duplication policy (the namespace's applies)."),
    lambda service, topic: service.policies.deduplication_enabled(topic))


# --- topic-level retention, and trimming on demand ---------------------------------------

_RETENTION_UNDER_QUOTA = ("Retention Quota must exceed configured backlog quota for topic. "
                          "Please increase retention quota and retry")                    # Pulsar's words


async def _store_topic_retention(call: Call, value: dict[str, Any] | None) -> None:
    """As Pulsar: a retention must keep more than the destination_storage quota in force (the
    topic's, else its namespace's, else the broker's default) allows: 412 otherwise."""
    if value is not None:
        name = str(known_topic(call.service, requested_topic(call)))
        quota = call.service.policies.backlog_quota(name, "destination_storage")
        if not _fits_retention(quota, Retention.from_json(value)):
            raise AdminError(PRECONDITION_FAILED, _RETENTION_UNDER_QUOTA)
    await _set_topic_policy(call, "retention", value)


def _read_topic_retention(call: Call) -> Any:
    name = str(known_topic(call.service, requested_topic(call)))
    policies = call.service.policies
    return policies.retention(name).to_json() if call["applied"] else policies.topic_policies(name).get("retention")


add_policy_routes(routes, TOPIC_URL + "/retention", "topic_retention", params=TOPIC_PATH, get_params=(APPLIED,),
                  get_errors=(400, 404, 412), schema=RETENTION_POLICIES, shown="RetentionPolicies",
                  not_set="Not set on the topic", summaries=(
                      "Get the topic's retention policy.",
                      "Set how long and how much of its consumed ledgers a topic keeps.",
                      "Remove the topic's retention policy (the namespace's applies)."),
                  read=_read_topic_retention, store=_store_topic_retention,
                  validate=lambda body: Retention.from_json(body).to_json())


@routes.add("POST", TOPIC_URL + "/trim",
            summary="Delete now the consumed ledgers the topic's retention no longer keeps.",
            params=TOPIC_PATH, replies={204: DONE, **errors(404, 412)})
async def trim_topic(call: Call) -> None:
    name = requested_topic(call)
    partitions = call.service.policies.partitions(str(name))
    names = [name.partition(i) for i in range(partitions)] if partitions else [name]
    for each in names:            # (a partition never written to has nothing to trim)
        if not partitions or call.service.topic_exists(str(each)):
            await (await existing_topic(call.service, each)).ledger.trim()


# --- topic-level delayed delivery -----------------------------------------------------------

_topic_policy("/delayedDelivery", "delayed_delivery", "delayedDeliveryPolicies", DELAYED_DELIVERY_POLICIES,
              "DelayedDeliveryPolicies", (
    "Get the topic's delayed delivery policy.",
    "Set whether the topic's Shared and Key_Shared subscriptions delay messages, the tick of their release and "
    "the longest delay a producer may ask for.",
    "Remove the topic's delayed delivery policy (the namespace's applies)."),
    lambda service, topic: service.policies.delayed_delivery(topic).to_json(),
    validate=lambda body: DelayedDelivery.from_json(body).to_json())


# --- topic-level inactive topic policies ------------------------------------------------------

_topic_policy("/inactiveTopicPolicies", "inactive_topic_policies", "inactiveTopicPolicies", INACTIVE_TOPIC_POLICIES,
              "InactiveTopicPolicies", (
    "Get the topic's inactive topic policies.",
    "Set whether the topic is deleted once inactive, after how long, and what inactive means (no subscription, "
    "or none with a backlog). Its retention time is waited for too.",
    "Remove the topic's inactive topic policies (the namespace's apply)."),
    lambda service, topic: service.policies.inactive_topic_policies(topic).to_json(),
    validate=lambda body: InactiveTopicPolicies.from_json(body).to_json())


# --- topic-level auto subscription creation ----------------------------------------------------

_topic_policy("/autoSubscriptionCreation", "auto_subscription_creation", "autoSubscriptionCreation",
              AUTO_SUBSCRIPTION_CREATION_OVERRIDE, "AutoSubscriptionCreationOverride", (
    "Get the topic's override of auto subscription creation.",
    "Override whether consumers create the topic's durable subscriptions that do not exist (and producers their "
    "initial subscriptions).",
    "Remove the topic's override (the namespace's applies)."),
    lambda service, topic: {"allowAutoSubscriptionCreation": service.policies.auto_subscription_creation(topic)})


# --- topic-level message TTL ------------------------------------------------------------------

MESSAGE_TTL_PARAM = Param("messageTTL", MESSAGE_TTL, "TTL in seconds (0: messages do not expire)", required=True)


_topic_policy("/messageTTL", "message_ttl", "messageTTLInSeconds", MESSAGE_TTL, "Seconds (0: messages do not expire)", (
    "Get the topic's message TTL (seconds).",
    "Set how many seconds after it was published a message of the topic expires (0: never), over the "
    "namespace's TTL. As Pulsar: the TTL is the messageTTL query parameter.",
    "Remove the topic's message TTL (the namespace's applies)."),
    lambda service, topic: service.policies.message_ttl(topic), query=MESSAGE_TTL_PARAM, validate=message_ttl_of)


# --- topic-level schema compatibility strategy ---------------------------------------------

STRATEGY = {"type": "string", "enum": [s.value for s in CompatibilityStrategy],
            "description": "SchemaCompatibilityStrategy (UNDEFINED, as in Pulsar: not set on the topic)"}


def _topic_strategy(body: Any) -> str | None:
    strategy = CompatibilityStrategy.parse(body)
    return None if strategy == CompatibilityStrategy.UNDEFINED else strategy.value


_topic_policy("/schemaCompatibilityStrategy", "schema_compatibility_strategy", "schemaCompatibilityStrategy",
              STRATEGY, "The strategy", (
    "Get the topic's schema compatibility strategy.",
    "Set how new schemas of the topic are checked (over the namespace's strategy; UNDEFINED removes it).",
    "Remove the topic's schema compatibility strategy (the namespace's applies)."),
    lambda service, topic: service.schemas.strategy(topic).value, validate=_topic_strategy, set_method="PUT")


_topic_policy("/schemaValidationEnforced", "schema_validation_enforced", "schemaValidationEnforced", BOOLEAN,
              "Enforced or not", (
    "Get whether producers without a schema are refused on the topic.",
    "Refuse (true) or allow (false) producers without a schema on a topic that has one, over the "
    "namespace's setting (a broker that enforces validation refuses them whatever the topic's).",
    "Remove the topic's setting (the namespace's and the broker's apply)."),
    lambda service, topic: service.schemas.validation_enforced(topic))


# --- unloading ------------------------------------------------------------------------------

@routes.add("PUT", TOPIC_URL + "/unload",
            summary="Unload a topic (each partition of a partitioned topic): it is closed, its producers and "
                    "consumers reconnect, and its next use loads it again from storage (what it held in memory "
                    "is freed meanwhile).",
            params=TOPIC_PATH, replies={204: DONE, **errors(404, 412)})
async def unload_topic(call: Call) -> None:
    name = requested_topic(call)
    service = call.service
    async with topic_change(service, name):
        partitions = service.policies.partitions(str(name))
        if not partitions and not service.topic_exists(str(name)):
            raise AdminError(NOT_FOUND, f"Topic {name} not found")
        # (a partition never used is neither stored nor loaded: nothing to unload)
        for each in partition_names(name, partitions) if partitions else [str(name)]:
            await service.unload_topic(each)


# --- termination ----------------------------------------------------------------------------

@routes.add("POST", TOPIC_URL + "/terminate",
            summary="Terminate a topic: no more messages are accepted; consumers drain what is there.",
            params=TOPIC_PATH, replies={200: Reply("The last message id", TERMINATED_AT), **errors(404, 405, 412)})
async def terminate_topic(call: Call) -> dict[str, Any]:
    topic = await _not_partitioned(call, "Termination of a partitioned topic is not allowed")
    last = await topic.terminate()
    return {"ledgerId": last.ledger_id, "entryId": last.entry_id, "partitionIndex": topic.partition_index}
