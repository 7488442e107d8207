"""Topic discovery: partitioned-topic metadata, lookups, the topics of a namespace.

One broker owns every topic, so a lookup always says "connect" with this broker's URL. Failures
are answered inside the lookup responses themselves: the client never matches an ERROR frame
against a lookup (it would wait for its timeout).
"""

from __future__ import annotations

from pyengine.broker.policies import HEALTH_CHECK_TOPIC, TC_ASSIGN_TOPIC
from pyengine.broker.service import BrokerService
from pyengine.broker.topic_changes import topic_change
from pyengine.errors import NotAllowedError, TopicNotFoundError
from pyengine.naming import TopicName
from pyengine.protocol.pulsar_api_pb2 import CommandGetTopicsOfNamespace

_DOMAINS_BY_MODE = {
    CommandGetTopicsOfNamespace.PERSISTENT: ("persistent",),
    CommandGetTopicsOfNamespace.NON_PERSISTENT: ("non-persistent",),
    CommandGetTopicsOfNamespace.ALL: ("persistent", "non-persistent"),
}
# What Pulsar's GET_TOPICS_OF_NAMESPACE leaves out (SystemTopicNames.isSystemTopic, applied by
# NamespaceService.getListOfUserTopics): listed, a pattern consumer of `ns/.*` subscribed to the
# broker's own topics (the coordinators' assign topic, pending ack stores, topic policies).
_EVENTS_TOPIC_NAMES = frozenset({"__change_events", "__transaction_buffer_snapshot",
                                 "__transaction_buffer_snapshot_segments", "__transaction_buffer_snapshot_indexes"})
_TRANSACTION_INTERNAL_PREFIXES = (TC_ASSIGN_TOPIC, "persistent://pulsar/system/__transaction_log_")
_PENDING_ACK_STORE_SUFFIX = "__transaction_pending_ack"


def resolve_topic(service: BrokerService, name: str) -> TopicName:
    """The normalised name of a topic a client looks up or attaches to. Raises
    InvalidTopicNameError, TopicNotFoundError (no such namespace, or a partition beyond a
    partitioned topic's count) or NotAllowedError (the base name of a partitioned topic:
    clients use its partitions)."""
    topic = TopicName.parse(name)
    if not service.policies.namespace_exists(topic.namespace_name):
        raise TopicNotFoundError(f"namespace {topic.namespace_name} does not exist")
    if topic.partition_index >= 0:
        partitions = service.policies.partitions(str(topic.partitioned_topic))
        if partitions and topic.partition_index >= partitions:
            raise TopicNotFoundError(f"{topic.partitioned_topic} has {partitions} partitions, "
                                     f"there is no partition {topic.partition_index}")
    return topic


def check_attachable(service: BrokerService, topic: TopicName, *, existing_segment: bool = True) -> None:
    """Producers and consumers attach to partitions, never to a partitioned topic's base; and
    on the wire to segments that exist: a segment is created by its scalable topic's controller,
    on the broker that owns it. Created on attach, a client with a stale layout (its topic
    deleted) had its sends stored in a segment no scalable topic has, and a broker that does
    not own the segment held a second, empty copy of it. (`existing_segment=False`: the
    embedding API, in-process with its one broker, creates a segment on first use.)"""
    if topic.partition_index < 0 and service.policies.partitions(str(topic)):
        raise NotAllowedError(f"{topic} is a partitioned topic: attach to its partitions")
    if topic.is_segment:
        service.check_scalable_enabled()            # refused as such first, existing or not
    if existing_segment and topic.is_segment and not service.topic_exists(str(topic)):
        raise TopicNotFoundError(f"segment {topic} does not exist on this broker (segments are created by their "
                                 "scalable topic's controller)")


def partition_count(service: BrokerService, name: str) -> int:
    """PARTITIONED_METADATA: the number of partitions (0: not partitioned). The coordinators'
    assign topic has one partition per transaction coordinator (the Java client's discovery)."""
    topic = TopicName.parse(name)
    if str(topic) == TC_ASSIGN_TOPIC:
        return len(service.coordinator.coordinator_ids)
    if not service.policies.namespace_exists(topic.namespace_name):
        raise TopicNotFoundError(f"namespace {topic.namespace_name} does not exist")
    return service.policies.partitions(str(topic))


def auto_partitions(service: BrokerService, topic: TopicName) -> int:
    """How many partitions a lookup of `topic`'s partitioned metadata creates it with now (0:
    none): where auto topic creation makes partitioned topics and `topic` exists neither as a
    partitioned nor as a plain topic. A partition, a segment, the system namespace's and the
    broker's own topics are never created so."""
    if (topic.partition_index >= 0 or topic.is_segment or topic.is_scalable
            or topic.namespace_name == "pulsar/system" or _is_system_topic(str(topic))):
        return 0
    partitions = service.policies.auto_topic_creation(topic.namespace_name).partitions
    if not partitions or service.policies.partitions(str(topic)) or service.topic_exists(str(topic)):
        return 0
    return partitions


async def create_partitioned_topic(service: BrokerService, topic: TopicName, partitions: int) -> int:
    """Auto topic creation of a partitioned topic (Pulsar's createDefaultPartitionedTopicAsync:
    its metadata; each partition is created as its first producer or consumer attaches). In
    the topic's turn of changes, as the admin API's creation: a producer creating the plain
    topic, or an admin request creating or deleting it, meanwhile wins. Its partition count."""
    name = str(topic)
    async with topic_change(service, topic):
        await service.load_settled(name)
        existing = service.policies.partitions(name)
        if existing or service.topic_exists(name):
            return existing
        await service.policies.create_partitioned_topic(name, partitions)
        return partitions


def topics_of_namespace(service: BrokerService, namespace: str, mode: int) -> list[str]:
    """Stored topics of `namespace` plus every partition of its partitioned topics (created or
    not, as Apache lists them); partitions keep their `-partition-N` names. System topics are
    left out, as Apache leaves them out."""
    tenant, _, local = namespace.partition("/")
    if not tenant or not local or not service.policies.namespace_exists(namespace):
        raise TopicNotFoundError(f"namespace {namespace!r} does not exist")
    domains = _DOMAINS_BY_MODE.get(mode, ("persistent",))
    names = set(service.list_topics(namespace)) | {
        name for name in service.topics if TopicName.parse(name).namespace_name == namespace}
    for partitioned in service.policies.partitioned_topics(namespace):
        base = TopicName.parse(partitioned)
        names.update(str(base.partition(i)) for i in range(service.policies.partitions(partitioned)))
    return sorted(name for name in names if TopicName.parse(name).domain in domains and not _is_system_topic(name))


def _is_system_topic(name: str) -> bool:
    base = TopicName.parse(name).partitioned_topic
    return (base.local_name in _EVENTS_TOPIC_NAMES or is_transaction_internal(base)
            or str(base) == HEALTH_CHECK_TOPIC)         # Pulsar's heartbeat topics are system topics


def is_transaction_internal(topic: TopicName) -> bool:
    """Pulsar's SystemTopicNames.isTransactionInternalName: the coordinators' assign topic and
    logs, and the pending-ack stores' `<topic>-<subscription>__transaction_pending_ack`."""
    full = str(topic.partitioned_topic)
    return full.startswith(_TRANSACTION_INTERNAL_PREFIXES) or full.endswith(_PENDING_ACK_STORE_SUFFIX)
