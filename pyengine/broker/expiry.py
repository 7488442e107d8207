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

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from pyengine.broker.compaction import COMPACTION_SUBSCRIPTION
from pyengine.naming import TopicName

if TYPE_CHECKING:
    from pyengine.broker.service import BrokerService
    from pyengine.broker.topic import Topic

log = logging.getLogger(__name__)

SYSTEM_NAMESPACE = "pulsar/system"


def expires(topic: Topic) -> bool:
    """Whether the periodic expiry applies to `topic` at all (not a system topic)."""
    return TopicName.parse(topic.name).namespace_name != SYSTEM_NAMESPACE


async def expire_topic(topic: Topic, now_ms: int) -> int:
    """Apply `topic`'s TTL in force to its subscriptions; returns the TTL (0: none applied)."""
    if not expires(topic) or topic._closed:
        return 0
    ttl = topic.service.policies.message_ttl(topic.name)
    if ttl <= 0:
        return 0
    for subscription in list(topic.subscriptions.values()):
        if subscription.name == COMPACTION_SUBSCRIPTION or topic._closed:
            continue
        await subscription.expire_messages(ttl, now_ms)
    return ttl


class MessageExpiryMonitor:
    """The periodic task; `check_now()` runs one round at once (tests, admin)."""

    def __init__(self, service: BrokerService, interval_s: float) -> None:
        self.service = service
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0                 # completed rounds (tests wait on it)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="message-expiry")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check_now()

    async def check_now(self) -> None:
        now_ms = self.service.config.clock()
        for topic in list(self.service.topics.values()):
            try:
                await expire_topic(topic, now_ms)
            except asyncio.CancelledError:
                raise
            except Exception:            # one topic's failure does not stop the others'
                if not topic._closed:
                    log.exception("message expiry check of %s failed", topic.name)
        self.rounds += 1

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
