"""Dispatch limits of namespaces and topics, at Pulsar's admin paths: how many messages a
Shared or Key_Shared consumer, and its whole subscription, may hold unacknowledged
(`maxUnackedMessagesPerConsumer` / `maxUnackedMessagesPerSubscription` of a namespace,
`maxUnackedMessagesOnConsumer` / `maxUnackedMessagesOnSubscription` of a topic), and how many
producers and consumers a topic and a subscription may have (`maxProducersPerTopic`,
`maxConsumersPerTopic`, `maxConsumersPerSubscription` of a namespace; `maxProducers`,
`maxConsumers`, `maxConsumersPerSubscription` of a topic). Each is read with GET (204 when not
set), set with POST (a JSON integer; 0: no limit; negative: 412 with Pulsar's reason) and
removed with DELETE (the next level applies: topic, namespace, broker)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from pyengine.admin.errors import NOT_FOUND, PRECONDITION_FAILED, AdminError
from pyengine.broker.topic_changes import topic_change
from pyengine.admin.names import namespace_name, topic_name
from pyengine.admin.policy_routes import add_policy_routes
from pyengine.admin.routing import Call, Param, RouteTable
from pyengine.admin.schemas import BOOLEAN, NAMESPACE, TENANT, TOPIC
from pyengine.broker.policies import MAX_INT, ConnectionLimits, UnackedLimits, check_limit
from pyengine.naming import TopicName

routes = RouteTable("dispatch limits")
NAMESPACE_URL = "/admin/v2/namespaces/{tenant}/{namespace}"
TOPIC_URL = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
NAMESPACE_PARAMS = (TENANT, NAMESPACE)
TOPIC_PARAMS = (TENANT, NAMESPACE, TOPIC)
APPLIED = Param("applied", BOOLEAN, "the limit in force (topic, else namespace, else broker default)",
                default=False)
# Operation ids of the topic routes.
_NAMES = {"maxUnackedMessagesOnConsumer": "max_unacked_messages_on_consumer",
          "maxUnackedMessagesOnSubscription": "max_unacked_messages_on_subscription",
          "maxProducers": "max_producers", "maxConsumers": "max_consumers",
          "maxConsumersPerSubscription": "max_consumers_per_subscription"}
# No minimum: a negative value is Pulsar's 412, not a malformed request (400).
LIMIT = {"type": "integer", "maximum": MAX_INT, "description": "a count of messages, producers or consumers (0: no limit)"}


def _limit_of(value: int, reason: str) -> int:
    if value < 0:
        raise AdminError(PRECONDITION_FAILED, reason)
    return check_limit("limit", value)


def _namespace(call: Call) -> str:
    return namespace_name(call["tenant"], call["namespace"])


def _requested_topic(call: Call) -> TopicName:
    return topic_name(call["tenant"], call["namespace"], call["topic"])


def _topic(call: Call) -> TopicName:
    """The requested topic, if it is stored, partitioned or a partition of one (else 404)."""
    name = _requested_topic(call)
    service = call.service
    partitions = service.policies.partitions(str(name.partitioned_topic))
    if not (service.topic_exists(str(name)) or partitions > max(name.partition_index, 0)):
        raise AdminError(NOT_FOUND, f"topic {name} does not exist")
    return name


async def _change_namespace(call: Call, field: str, value: int | None) -> None:
    namespace = _namespace(call)
    policies = call.service.policies
    await policies.set_policies(namespace, dataclasses.replace(policies.policies(namespace), **{field: value}))


async def _change_topic(call: Call, key: str, value: int | None) -> None:
    async with topic_change(call.service, _requested_topic(call)):     # not during its deletion
        await call.service.policies.set_topic_policy(str(_topic(call)), key, value)


def _add(url: str, params: tuple[Param, ...], name: str, what: str, *, read: Callable[[Call], Any],
         store: Callable[[Call, int | None], Awaitable[None]], reason: str, level: str,
         get_params: tuple[Param, ...] = ()) -> None:
    add_policy_routes(routes, url, name, params=params, schema=LIMIT, shown="The limit (0: none)", not_set="Not set",
                      summaries=(f"Get the {level}'s {what}.", f"Set the {level}'s {what} (0: no limit).",
                                 f"Remove the {level}'s {what} (the next level's applies)."),
                      read=read, store=store, validate=lambda value: _limit_of(value, reason),
                      get_params=get_params, get_errors=(400, 404, 412))


_PER_CONSUMER = "limit of unacknowledged messages per Shared or Key_Shared consumer"
_PER_SUBSCRIPTION = "limit of unacknowledged messages per Shared or Key_Shared subscription"
_PRODUCERS = "limit of producers per topic"
_CONSUMERS = "limit of consumers per topic"
_CONSUMERS_PER_SUBSCRIPTION = "limit of consumers per subscription"

for _path, _field, _what in (("maxUnackedMessagesPerConsumer", "max_unacked_messages_per_consumer", _PER_CONSUMER),
                             ("maxUnackedMessagesPerSubscription", "max_unacked_messages_per_subscription",
                              _PER_SUBSCRIPTION),
                             ("maxProducersPerTopic", "max_producers_per_topic", _PRODUCERS),
                             ("maxConsumersPerTopic", "max_consumers_per_topic", _CONSUMERS),
                             ("maxConsumersPerSubscription", "max_consumers_per_subscription",
                              _CONSUMERS_PER_SUBSCRIPTION)):
    _add(NAMESPACE_URL + "/" + _path, NAMESPACE_PARAMS, "namespace_" + _field, _what, level="namespace",
         read=lambda call, field=_field: getattr(call.service.policies.policies(_namespace(call)), field),
         store=lambda call, value, field=_field: _change_namespace(call, field, value),
         reason=f"{_path} must be 0 or more")


def _topic_limit(call: Call, key: str, applied: Callable[[str], int]) -> int | None:
    name = str(_topic(call))
    if call["applied"]:
        return applied(name)
    return call.service.policies.topic_policies(name).get(key)


def _unacked(call: Call, pick: Callable[[UnackedLimits], int]) -> Callable[[str], int]:
    return lambda name: pick(call.service.policies.unacked_limits(name))


def _connections(call: Call, pick: Callable[[ConnectionLimits], int]) -> Callable[[str], int]:
    return lambda name: pick(call.service.policies.connection_limits(name))


# (path, stored key: Pulsar's TopicPolicies field, what, the limit in force, Pulsar's 412 reason)
_TOPIC_LIMITS: tuple[tuple[str, str, str, Callable[[Call], Callable[[str], int]], str], ...] = (
    ("maxUnackedMessagesOnConsumer", "maxUnackedMessagesOnConsumer", _PER_CONSUMER,
     lambda call: _unacked(call, lambda limits: limits.per_consumer), "maxUnackedNum must be 0 or more"),
    ("maxUnackedMessagesOnSubscription", "maxUnackedMessagesOnSubscription", _PER_SUBSCRIPTION,
     lambda call: _unacked(call, lambda limits: limits.per_subscription), "maxUnackedNum must be 0 or more"),
    ("maxProducers", "maxProducerPerTopic", _PRODUCERS,
     lambda call: _connections(call, lambda limits: limits.producers_per_topic), "maxProducers must be 0 or more"),
    ("maxConsumers", "maxConsumerPerTopic", _CONSUMERS,
     lambda call: _connections(call, lambda limits: limits.consumers_per_topic), "maxConsumers must be 0 or more"),
    ("maxConsumersPerSubscription", "maxConsumersPerSubscription", _CONSUMERS_PER_SUBSCRIPTION,
     lambda call: _connections(call, lambda limits: limits.consumers_per_subscription),
     "maxConsumersPerSubscription must be 0 or more"),
)

for _path, _key, _what, _applied, _reason in _TOPIC_LIMITS:
    _add(TOPIC_URL + "/" + _path, TOPIC_PARAMS, "topic_" + _NAMES[_path], _what, level="topic", get_params=(APPLIED,),
         read=lambda call, key=_key, applied=_applied: _topic_limit(call, key, applied(call)),
         store=lambda call, value, key=_key: _change_topic(call, key, value), reason=_reason)
