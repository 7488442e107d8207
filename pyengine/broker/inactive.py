"""Inactive topic deletion: the broker task that deletes topics nobody uses any more (Pulsar's
brokerDeleteInactiveTopics* settings and InactiveTopicPolicies; its PersistentTopic.checkGC).

Every `BrokerConfig.delete_inactive_topics_frequency_s` (Pulsar: 60 s) each loaded topic whose
policy in force — topic policy, else namespace policy, else the broker's default — has
`deleteWhileInactive` is checked:

* it is active while it has a producer or a consumer (readers' included) and, by the policy's
  mode, while it has a subscription (`delete_when_no_subscriptions`, the default) or a
  subscription with a backlog (`delete_when_subscriptions_caught_up`). Ours also counts a
  transaction that wrote to it and is still open: its end must find the topic (Pulsar leaves
  that to chance), and a subscription being created or deleted. An active topic's
  `last_active_ms` is now, and so is that of a topic whose last producer, consumer or
  subscription just went;
* an inactive one is deleted once it has been inactive for `maxInactiveDurationSeconds`, and
  for its retention time too (Pulsar's shouldTopicBeRetained): a retention time of -1 keeps it
  for good, since its data is to be kept. Our default retention is -1 (a data dir is also what
  the Spark pipeline reads), so with the defaults nothing is deleted until a retention time is
  set for the broker, a namespace or a topic.

The deletion is the admin API's (its schemas and topic policies go with it), refused if the
topic became active meanwhile; in `delete_when_subscriptions_caught_up` mode its caught-up
subscriptions go with it. A partition is deleted as a topic and its partitioned topic stays
(Pulsar's brokerDeleteInactivePartitionedTopicMetadataEnabled is off by default); its next use
creates it again. Left alone, as in Pulsar: the system namespace's topics; and, ours, the
segment:// topics of scalable topics, whose lives the scalable-topic controller decides.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pyengine.broker.expiry import SYSTEM_NAMESPACE

if TYPE_CHECKING:
    from pyengine.broker.topic import Topic

log = logging.getLogger(__name__)


def inactive(topic: Topic, mode: str) -> bool:
    """Whether `topic` is inactive under the delete mode `mode` (see the module's docstring)."""
    if (topic.producers or topic.number_of_consumers() or topic.buffer.ongoing_txns()
            or topic.subscriptions_changing()):
        return False
    if mode == "delete_when_no_subscriptions":
        return not topic.subscriptions
    return not any(subscription.backlog() for subscription in topic.subscriptions.values())


def collectable(topic: Topic) -> bool:
    """Whether the check applies to `topic` at all."""
    name = topic.topic_name
    return name.namespace_name != SYSTEM_NAMESPACE and not name.is_segment


async def delete_if_inactive(topic: Topic, now_ms: int) -> bool:
    """One check of `topic` at `now_ms`; True if it was deleted."""
    if not collectable(topic) or topic.closed:
        return False
    service = topic.service
    policies = service.policies.inactive_topic_policies(topic.name)
    if not policies.delete_while_inactive:
        return False
    if not inactive(topic, policies.mode):
        topic.last_active_ms = now_ms
        return False
    idle_ms = now_ms - topic.last_active_ms
    if idle_ms < policies.max_inactive_duration_seconds * 1000:
        return False
    retention_minutes = service.policies.retention(topic.name).time_minutes
    if retention_minutes < 0 or idle_ms < retention_minutes * 60_000:
        return False                   # its data is still to be kept
    return await service.delete_inactive_topic(topic, policies)
