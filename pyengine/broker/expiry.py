"""Message expiry: the broker task that applies the message TTL (Pulsar's messageExpiryMonitor).

Every `BrokerConfig.message_expiry_check_interval_s` (Pulsar's messageExpiryCheckIntervalInMinutes,
5 minutes by default) each loaded topic whose TTL in force is not 0 — topic policy, else
namespace policy, else the broker's `ttl_duration_default_seconds` (Pulsar's
ttlDurationDefaultInSeconds, 0: off) — has every durable subscription acknowledge the messages
published TTL seconds ago or earlier (`Subscription.expire_messages`: up to the read horizon,
never past an open transaction's entries). As in Pulsar, the topics of the system namespace and
the compaction subscription are left alone, and so are readers (non-durable cursors: a reader's
cursor is its scan position, apache/pulsar#26505).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyengine.broker.compaction import COMPACTION_SUBSCRIPTION
from pyengine.naming import TopicName

if TYPE_CHECKING:
    from pyengine.broker.topic import Topic


SYSTEM_NAMESPACE = "pulsar/system"


def expires(topic: Topic) -> bool:
    """Whether the periodic expiry applies to `topic` at all (not a system topic)."""
    return TopicName.parse(topic.name).namespace_name != SYSTEM_NAMESPACE


async def expire_topic(topic: Topic, now_ms: int) -> int:
    """Apply `topic`'s TTL in force to its subscriptions; returns the TTL (0: none applied)."""
    if not expires(topic) or topic.closed:
        return 0
    ttl = topic.service.policies.message_ttl(topic.name)
    if ttl <= 0:
        return 0
    for subscription in list(topic.subscriptions.values()):
        if subscription.name == COMPACTION_SUBSCRIPTION or topic.closed:
            continue
        await subscription.expire_messages(ttl, now_ms)
    return ttl
