"""Backlog quotas (Pulsar's BacklogQuotaManager): how big or how old a topic's backlog may grow.

A topic's backlog is what its slowest durable subscription has not consumed, up to the read
horizon (an open transaction's entries, and all after them, are not readable yet: they are
neither counted nor evicted). Two quotas apply, each the topic policy, else the namespace
policy, else the broker's default (Pulsar's backlogQuotaDefaultLimitBytes /
backlogQuotaDefaultLimitSecond, -1: none):

- destination_storage: the backlog's estimated size in bytes (the bytes of the entries after the
  slowest subscription's mark-delete position); exceeded when it reaches the limit.
- message_age: the age of the oldest unacknowledged message of the slowest subscription;
  exceeded when it is older than the limit (seconds).

Past a quota, its policy applies. producer_request_hold and producer_exception: a new producer
is refused (ProducerBlockedQuotaExceededError / ProducerBlockedQuotaExceededException on the
wire: the Java client retries the first, and fails on the second), and the periodic check closes
the producers connected (CLOSE_PRODUCER: the clients reconnect, and are refused as new ones until
the backlog is consumed). consumer_backlog_eviction:
every `BrokerConfig.backlog_quota_check_interval_s` (Pulsar's backlogQuotaCheckIntervalInSeconds)
the slowest subscriptions are moved forward until the backlog is down to 90% of the size limit
(as Pulsar's dropBacklogForSizeLimit), or their messages older than 90% of the time limit are
expired (its precise time check). The compaction subscription is neither counted nor moved, and
the topics of the system namespace are left alone.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from pyengine.broker.compaction import COMPACTION_SUBSCRIPTION
from pyengine.broker.expiry import expires
from pyengine.broker.policies import BacklogQuota
from pyengine.errors import ProducerBlockedQuotaExceededError, ProducerBlockedQuotaExceededException
from pyengine_kernels import Position

if TYPE_CHECKING:
    from pyengine.broker.subscription import Subscription
    from pyengine.broker.topic import Topic

log = logging.getLogger(__name__)

DESTINATION_STORAGE = "destination_storage"
MESSAGE_AGE = "message_age"
EVICTION_TARGET = 0.9           # Pulsar's reduction factor: evict down to 90% of the limit
REFUSED = "Cannot create producer on topic with backlog quota exceeded"      # Pulsar's words


def _counted(topic: Topic) -> list[Subscription]:
    """The subscriptions whose backlog the quotas measure (durable, not the compaction's)."""
    return [s for s in topic.subscriptions.values() if s.name != COMPACTION_SUBSCRIPTION]


def _slowest(topic: Topic) -> Subscription | None:
    return min(_counted(topic), key=lambda s: s.cursor.mark_delete, default=None)


def backlog_size(topic: Topic) -> int:
    """Estimated bytes of the slowest subscription's backlog, up to the read horizon (Pulsar's
    getEstimatedBacklogSize): a ledger's entries count at its average entry size."""
    slowest = _slowest(topic)
    if slowest is None:
        return 0
    after, upto = slowest.cursor.mark_delete, topic.buffer.max_read_position()
    size = 0
    for ledger_id, info in topic.ledger.ledgers.items():
        if info.entries <= 0 or ledger_id < after.ledger_id or ledger_id > upto.ledger_id:
            continue
        first = after.entry_id + 1 if ledger_id == after.ledger_id else 0
        last = upto.entry_id if ledger_id == upto.ledger_id else info.last_entry_id
        count = last - first + 1
        if count > 0:
            size += info.size if count >= info.entries else count * info.size // info.entries
    return size


def oldest_unacked_publish_time(subscription: Subscription) -> int | None:
    """The publish time of the first message `subscription` would still be given, up to the
    read horizon (markers, aborted and acknowledged entries passed over); None: none."""
    topic = subscription.topic
    cursor, ledger, buffer = subscription.cursor, topic.ledger, topic.buffer
    horizon = buffer.max_read_position()
    start = ledger.next_position(cursor.mark_delete)
    while start <= horizon:
        entries = ledger.read_entries(start, 256, horizon)
        if not entries:
            return None
        for entry in entries:
            if not (entry.is_marker or cursor.is_acked(entry.position)
                    or (entry.txn_most >= 0 and buffer.hides(entry))):
                return entry.publish_time
        start = ledger.next_position(entries[-1].position)
    return None


def oldest_backlog_publish_time(topic: Topic) -> int | None:
    """The publish time of the oldest unacknowledged message of any counted subscription."""
    times = [t for t in map(oldest_unacked_publish_time, _counted(topic)) if t is not None]
    return min(times, default=None)


def size_exceeded(topic: Topic, quota: BacklogQuota) -> bool:
    # As Pulsar's isSizeBacklogExceeded: reaching the limit is exceeding it.
    return quota.limit_size >= 0 and bool(_counted(topic)) and backlog_size(topic) >= quota.limit_size


def time_exceeded(topic: Topic, quota: BacklogQuota, now_ms: int) -> bool:
    if quota.limit_time < 0:
        return False
    oldest = oldest_backlog_publish_time(topic)
    return oldest is not None and now_ms > oldest + quota.limit_time * 1000


def _quota(topic: Topic, quota_type: str) -> BacklogQuota:
    return topic.service.policies.backlog_quota(topic.name, quota_type)


def exceeded_quotas(topic: Topic, now_ms: int) -> list[tuple[str, BacklogQuota]]:
    """The quotas `topic` is past now, each with its type."""
    if not expires(topic):
        return []
    found = []
    size_quota = _quota(topic, DESTINATION_STORAGE)
    if size_exceeded(topic, size_quota):
        found.append((DESTINATION_STORAGE, size_quota))
    age_quota = _quota(topic, MESSAGE_AGE)
    if time_exceeded(topic, age_quota, now_ms):
        found.append((MESSAGE_AGE, age_quota))
    return found


def check_new_producer(topic: Topic, producer_name: str | None) -> None:
    """Refuse a producer while a producer_request_hold / producer_exception quota is exceeded
    (Pulsar's checkBacklogQuotaExceeded on PRODUCER: the size quota, then the age quota)."""
    for quota_type, quota in exceeded_quotas(topic, topic.service.config.clock()):
        if quota.policy == "producer_request_hold":
            log.info("[%s] %s backlog quota exceeded: producer %s refused", topic.name, quota_type, producer_name)
            raise ProducerBlockedQuotaExceededError(REFUSED)
        if quota.policy == "producer_exception":
            log.info("[%s] %s backlog quota exceeded: producer %s refused", topic.name, quota_type, producer_name)
            raise ProducerBlockedQuotaExceededException(REFUSED)


async def evict_for_size(topic: Topic, quota: BacklogQuota) -> None:
    """Move the slowest subscriptions forward until the backlog is at 90% of the limit (Pulsar's
    dropBacklogForSizeLimit): each round skips, on the slowest subscription, the share of its
    backlog that is over the target (rounded up); it stops when the slowest one does not progress (the
    read horizon, an open transaction, holds it) or nothing is left to skip."""
    target = EVICTION_TARGET * quota.limit_size
    size = backlog_size(topic)
    previous: tuple[Subscription, Position] | None = None
    while size > target and not topic.closed:
        slowest = _slowest(topic)
        if slowest is None:
            return
        if previous is not None and previous == (slowest, slowest.cursor.mark_delete):
            log.info("[%s] backlog eviction: subscription %s does not progress (size %d, target %d)",
                     topic.name, slowest.name, size, target)
            return
        # Rounded up (Pulsar rounds down, and may stop short of the target). Whole stored
        # entries, as Pulsar's skipEntries: the backlog counts markers and aborted entries,
        # so a skip of messages only would take more messages than the share over the target.
        # The share is of the entries the size measured, up to the read horizon: those behind
        # an open transaction would make it a share of far more entries than there are.
        entries = topic.ledger.entries_between(slowest.cursor.mark_delete, topic.buffer.max_read_position())
        to_skip = math.ceil((size - target) / size * entries)
        if to_skip <= 0:
            return
        previous = (slowest, slowest.cursor.mark_delete)
        await slowest.skip_entries(to_skip)
        size = backlog_size(topic)


async def evict_for_age(topic: Topic, quota: BacklogQuota, now_ms: int) -> None:
    """Expire, on every counted subscription, the messages older than 90% of the time limit
    (Pulsar's precise time-based eviction); never past the read horizon."""
    target_s = int(EVICTION_TARGET * quota.limit_time)
    for subscription in _counted(topic):
        if topic.closed:
            return
        await subscription.expire_messages(target_s, now_ms)


async def enforce(topic: Topic, now_ms: int) -> None:
    """Apply the policy of every quota `topic` is past: a consumer_backlog_eviction one evicts;
    producer_request_hold and producer_exception close the producers connected (Pulsar's
    disconnectProducers: they reconnect, and are refused by `check_new_producer` until the
    backlog is back under the quota)."""
    for quota_type, quota in exceeded_quotas(topic, now_ms):
        if quota.policy in ("producer_request_hold", "producer_exception"):
            if topic.producers:
                log.info("[%s] %s backlog quota exceeded (%s): disconnecting %d producers", topic.name,
                         quota_type, quota.policy, len(topic.producers))
                topic.disconnect_producers()
            continue
        log.info("[%s] %s backlog quota exceeded: evicting the slowest subscriptions", topic.name, quota_type)
        if quota_type == DESTINATION_STORAGE:
            await evict_for_size(topic, quota)
        else:
            await evict_for_age(topic, quota, now_ms)
