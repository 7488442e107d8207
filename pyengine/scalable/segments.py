"""Operations on segment:// topics, as the controller needs them (the spec's Segments admin API).

`SegmentOperations` is what the controller calls; every operation is idempotent, because a
leader that takes over after a crash repeats the steps its predecessor may have done.
`LocalSegments` runs them on this process's BrokerService (the embedded / single-broker case,
and the broker serving `/admin/v2/segments` requests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pyengine.errors import SubscriptionNotFoundError, TopicNotFoundError
from pyengine.naming import TopicName

if TYPE_CHECKING:
    from pyengine.broker.service import BrokerService


class SegmentOperations(Protocol):
    async def exists(self, segment: str) -> bool: ...

    async def subscriptions(self, segment: str) -> list[str]:
        """Subscription names of an existing segment topic ([] when it does not exist)."""

    async def create(self, segment: str, subscriptions: list[str]) -> None:
        """Create the segment topic (if absent) and each subscription (if absent) at Earliest."""

    async def terminate(self, segment: str) -> None:
        """Seal the segment topic: producers get TopicTerminated."""

    async def is_terminated(self, segment: str) -> bool: ...

    async def delete(self, segment: str) -> None:
        """Delete the segment topic and its ledger (nothing when it does not exist)."""

    async def create_subscription(self, segment: str, subscription: str) -> None: ...

    async def delete_subscription(self, segment: str, subscription: str) -> None: ...

    async def stats(self, segment: str) -> dict: ...

    def broker_url(self, segment: str) -> str:
        """The service URL of the broker serving the segment."""


def _check_segment(segment: str) -> str:
    name = TopicName.parse(segment)
    if not name.is_segment:
        raise TopicNotFoundError(f"{segment} is not a segment:// topic")
    return str(name)


class LocalSegments:
    """Segment topics on this BrokerService."""

    def __init__(self, broker: BrokerService, broker_url: str = "") -> None:
        self.broker = broker
        self.url = broker_url

    async def exists(self, segment: str) -> bool:
        return self.broker.topic_exists(_check_segment(segment))

    async def subscriptions(self, segment: str) -> list[str]:
        segment = _check_segment(segment)
        if not self.broker.topic_exists(segment):
            return []
        topic = await self.broker.get_topic(segment, create=False)
        return sorted(topic.subscriptions)

    async def create(self, segment: str, subscriptions: list[str]) -> None:
        topic = await self.broker.get_topic(_check_segment(segment))
        for subscription in subscriptions:
            await topic.open_subscription(subscription, "earliest")

    async def terminate(self, segment: str) -> None:
        topic = await self.broker.get_topic(_check_segment(segment), create=False)
        await topic.terminate()

    async def is_terminated(self, segment: str) -> bool:
        segment = _check_segment(segment)
        if not self.broker.topic_exists(segment):
            return False
        topic = await self.broker.get_topic(segment, create=False)
        return topic.ledger.terminated_at is not None

    async def delete(self, segment: str) -> None:
        segment = _check_segment(segment)
        if self.broker.topic_exists(segment):
            await self.broker.delete_topic(segment)

    async def create_subscription(self, segment: str, subscription: str) -> None:
        topic = await self.broker.get_topic(_check_segment(segment), create=False)
        await topic.open_subscription(subscription, "earliest")

    async def delete_subscription(self, segment: str, subscription: str) -> None:
        segment = _check_segment(segment)
        if not self.broker.topic_exists(segment):
            return
        topic = await self.broker.get_topic(segment, create=False)
        try:
            await topic.unsubscribe(subscription, force=True)
        except SubscriptionNotFoundError:
            pass

    async def stats(self, segment: str) -> dict:
        segment = _check_segment(segment)
        if not self.broker.topic_exists(segment):
            return {}
        topic = await self.broker.get_topic(segment, create=False)
        stats = topic.stats()
        stats["terminated"] = topic.ledger.terminated_at is not None
        return stats

    def broker_url(self, segment: str) -> str:
        return self.url
