"""Names in admin paths: tenants, namespaces, topics and subscriptions, checked as Pulsar
checks them (an invalid name is 412 Precondition Failed) and held to the lengths the storage
takes: every name ends up in an LMDB key, and LMDB keys are at most 511 bytes.
"""

from __future__ import annotations

import re

from pyengine.admin.errors import PRECONDITION_FAILED, AdminError
from pyengine.admin.validation import INVALID_STATUS
from pyengine.broker.expiry import SYSTEM_NAMESPACE
from pyengine.broker.policies import check_name
from pyengine.naming import TopicName

# Byte limits of each part. The longest key they make, a topic's policies
# ("/admin/topic-policies/persistent://tenant/namespace/topic", 437 bytes at most), stays
# within LMDB's 511 bytes.
MAX_NAME_BYTES = 100                 # a tenant, or a namespace without its tenant
MAX_LOCAL_NAME_BYTES = 200           # a topic without its domain, tenant and namespace
MAX_SUBSCRIPTION_BYTES = 400

# What the OpenAPI document says of them (in characters: a longer UTF-8 spelling is refused
# too). A name that breaks them is 412, as any invalid name.
_INVALID = {INVALID_STATUS: PRECONDITION_FAILED}
# Pulsar's tenant and namespace names: `[-=:.\w]+` with Java's (ASCII) \w.
NAME_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_NAME_BYTES, "pattern": r"^[-=:.A-Za-z0-9_]+$",
               **_INVALID}
TOPIC_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_LOCAL_NAME_BYTES, **_INVALID}
SUBSCRIPTION_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_SUBSCRIPTION_BYTES, **_INVALID}


def tenant_name(tenant: str) -> str:
    _check_length("tenant", tenant, MAX_NAME_BYTES)
    return check_name("tenant", tenant)


def namespace_name(tenant: str, namespace: str) -> str:
    """`tenant/namespace`, both parts checked."""
    _check_length("namespace", namespace, MAX_NAME_BYTES)
    return f"{tenant_name(tenant)}/{check_name('namespace', namespace)}"


def topic_name(tenant: str, namespace: str, local_name: str, domain: str = "persistent") -> TopicName:
    _check_length("topic", local_name, MAX_LOCAL_NAME_BYTES)
    return TopicName.parse(f"{domain}://{namespace_name(tenant, namespace)}/{local_name}")


def subscription_name(name: str) -> str:
    _check_length("subscription", name, MAX_SUBSCRIPTION_BYTES)
    if not name.strip() or any(ch in name for ch in "\n\r\0"):
        raise AdminError(PRECONDITION_FAILED, f"invalid subscription name {name!r}")
    return name


def _check_length(kind: str, name: str, limit: int) -> None:
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:          # a lone surrogate from a bad percent-escape
        raise AdminError(PRECONDITION_FAILED, f"{kind} name is not valid UTF-8") from None
    if size > limit:
        raise AdminError(PRECONDITION_FAILED, f"{kind} name longer than {limit} bytes")


# Pulsar's system topics (BrokerService.isSystemTopic): every topic of a system service namespace
# (pulsar/system, a broker's heartbeat namespace pulsar/<host>:<port>), the topic policies and
# transaction buffer snapshot topics of any namespace (SystemTopicNames.EVENTS_TOPIC_NAMES) and
# the pending ack stores (`<topic>-<subscription>__transaction_pending_ack`).
_HEARTBEAT_NAMESPACE = re.compile(r"pulsar/[^:]+:\d+")
EVENTS_TOPIC_NAMES = frozenset({"__change_events", "__transaction_buffer_snapshot",
                                "__transaction_buffer_snapshot_segments", "__transaction_buffer_snapshot_indexes"})
PENDING_ACK_STORE_SUFFIX = "__transaction_pending_ack"


def is_system_topic(topic: str) -> bool:
    name = TopicName.parse(topic)
    namespace = name.namespace_name
    partitioned = name.partitioned_topic
    return (namespace == SYSTEM_NAMESPACE or _HEARTBEAT_NAMESPACE.fullmatch(namespace) is not None
            or partitioned.local_name in EVENTS_TOPIC_NAMES or str(partitioned).endswith(PENDING_ACK_STORE_SUFFIX))


def without_system_topics(topics: list[str], include_system_topics: bool) -> list[str]:
    """A topic list as Pulsar's admin answers it (filterSystemTopic): without system topics
    unless the caller asked for them (includeSystemTopic=true)."""
    return topics if include_system_topics else [topic for topic in topics if not is_system_topic(topic)]
