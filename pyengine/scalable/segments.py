"""Operations on segment:// topics, as the controller needs them (the spec's Segments admin API).

`SegmentOperations` is what the controller calls; every operation is idempotent, because a
leader that takes over after a crash repeats the steps its predecessor may have done.
`LocalSegments` runs them on this process's BrokerService (the embedded / single-broker case,
and the broker serving `/admin/v2/segments` requests); `RoutedSegments` sends each to the
broker that owns the segment (several brokers on one metadata store).
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn, Protocol
from urllib.parse import quote

from pyengine.errors import (
    NotAllowedError,
    PulsarError,
    ServiceNotReadyError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
)
from pyengine.naming import TopicName
from pyengine.scalable.resources import ScalableTopicResources

if TYPE_CHECKING:
    import aiohttp

    from pyengine.broker.service import BrokerService

# The rates a segment's stats carry (per second, over its broker's last stats interval).
SEGMENT_RATES = ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut")


class SegmentOperations(Protocol):
    async def exists(self, segment: str) -> bool: ...

    async def subscriptions(self, segment: str) -> list[str]:
        """Subscription names of an existing segment topic ([] when it does not exist)."""

    async def create(self, segment: str, subscriptions: list[str], near: str | None = None,
                     incarnation: str | None = None) -> None:
        """Create the segment topic (if absent) and each subscription (if absent) at Earliest;
        on the broker that owns segment `near` when given (children beside their parent).
        `incarnation`: of the layout the sender acts for (refused for any other, layout.py)."""

    async def terminate(self, segment: str) -> None:
        """Seal the segment topic: producers get TopicTerminated."""

    async def is_terminated(self, segment: str) -> bool: ...

    async def delete(self, segment: str) -> None:
        """Delete the segment topic and its ledger (nothing when it does not exist)."""

    async def create_subscription(self, segment: str, subscription: str) -> None: ...

    async def delete_subscription(self, segment: str, subscription: str) -> None: ...

    async def stats(self, segment: str) -> dict: ...

    async def owner_url(self, segment: str) -> str:
        """The service URL of the broker serving the segment."""


def to_pulsar_error_of_status(status: int, reason: str) -> PulsarError:
    """The engine error an owner's admin API answered with (its HTTP status)."""
    if status == 404:
        return TopicNotFoundError(reason)
    if status == 503:
        return ServiceNotReadyError(reason)
    if status in (405, 409, 412):
        return NotAllowedError(reason)
    return PulsarError(reason)


class SegmentFencedError(NotAllowedError):
    """A create or delete of a segment topic that the controller's decision in the metadata
    store contradicts: a deposed leader's request that landed late."""


def _check_segment(segment: str) -> str:
    name = TopicName.parse(segment)
    if not name.is_segment:
        raise TopicNotFoundError(f"{segment} is not a segment:// topic")
    return str(name)


class _FenceLock:
    """A segment's fence lock and how many hold it or wait for it (dropped when none does)."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


# per BrokerService (all the LocalSegments on it), one per segment: a fenced create or delete
# checks the metadata store and acts while holding its segment's lock
_FENCE_LOCKS: weakref.WeakKeyDictionary[Any, dict[str, _FenceLock]] = weakref.WeakKeyDictionary()


@asynccontextmanager
async def _segment_lock(broker: Any, segment: str) -> AsyncIterator[None]:
    locks = _FENCE_LOCKS.get(broker)
    if locks is None:
        locks = _FENCE_LOCKS[broker] = {}
    fence = locks.get(segment)
    if fence is None:
        fence = locks[segment] = _FenceLock()
    fence.users += 1
    try:
        async with fence.lock:
            yield
    finally:
        fence.users -= 1
        if fence.users == 0:
            del locks[segment]


class LocalSegments:
    """Segment topics on this BrokerService.

    Fencing (with `resources`: the metadata store of the scalable topics). A controller leader
    deposed while a create or delete of a child segment was on its way must not undo what the
    new leader decided: leave an empty child of a split it rolled back, or delete the child of
    a split it retried and completed. So the broker acts on the decision recorded in the store,
    not on the sender's word: it creates a segment only while the store keeps it (in the layout,
    or a child of the operation in progress that no leader rolls back) and deletes one only
    while it does not (or the topic is being deleted), and creates none of a topic being (or
    once) deleted — checked and done under the segment's lock on this broker. A leader changes
    the record (claims the operation, begins the next one, marks the topic deleting) before it
    sends its own create or delete of that segment, and those wait for the lock: a late request
    either acted before them or sees the new record and is refused (SegmentFencedError). Only
    requests for the same segment can undo each other (the check reads only what keeps that
    segment), so other segments' creates and deletes do not wait. A refused create forgets the
    owner record its sender claimed for this broker (nothing of it is here). A segment of no
    scalable topic (the Segments API used alone) is not fenced.

    A segment lives on the one broker its owner record names. A create claims the record for this
    broker under the lock before making the topic, and is refused when another broker holds it:
    one sent here before the record was forgotten (a rollback's delete) and another broker claimed
    the segment would otherwise make a second copy. A delete forgets the record only when it
    names this broker (another's names a copy this delete did not reach).

    A topic deleted and created again restarts its segment ids, so the checks above would let a
    late create of the old topic act on the new one's segment of the same id (add the old
    topic's subscriptions to it, or make a child its split rolled back). A controller's create
    therefore carries the incarnation of the layout it acts for, and is refused unless the
    topic's current layout is of that incarnation. A create without one (the Segments API used
    alone, a controller of a layout stored before incarnations) is checked as before. Deletes
    carry none: one of a segment the current layout keeps is refused whoever sent it, and one of
    a segment it does not keep removes a leftover, of whichever incarnation. The deleting marker
    names the incarnation it marks (resources.py): a late delete of the old topic does not make
    the new one's segments deletable, nor refuse their creates.
    """

    def __init__(self, broker: BrokerService, broker_url: str = "",
                 resources: ScalableTopicResources | None = None) -> None:
        self.broker = broker
        self.url = broker_url
        self.resources = resources

    @asynccontextmanager
    async def _fenced(self, segment: str, *, creating: bool, incarnation: str | None = None) -> AsyncIterator[None]:
        """Hold the segment's fence lock while the controller's decision allows the change."""
        if self.resources is None:
            yield
            return
        async with _segment_lock(self.broker, segment):
            name = TopicName.parse(segment)
            if incarnation is not None:
                current = await self.resources.incarnation(name.scalable_topic)
                if current != incarnation:
                    await self._refuse_create(name, f"segment {segment} is of incarnation {incarnation} of its "
                                                    f"topic, not of the current one ({current or 'none'}): not created")
            kept = await self.resources.keeps_segment(name)
            if creating and (kept is False or await self.resources.is_deleting(name.scalable_topic)):
                await self._refuse_create(name, f"segment {segment} is neither in the layout nor a child of the "
                                                "split or merge in progress, or its topic is deleted: not created")
            if not creating and kept is True and not await self.resources.is_deleting(name.scalable_topic):
                raise SegmentFencedError(f"segment {segment} is in the layout or a child of the split or merge in "
                                         "progress: not deleted")
            if creating and self.url:
                # claimed before it is created (again if a late delete of a previous incarnation
                # forgot the record): a create sent here before the record was forgotten and
                # another broker claimed the segment must not make a second copy here
                owner = await self.resources.claim_owner(name, self.url)
                if owner != self.url:
                    raise SegmentFencedError(f"segment {segment} is owned by broker {owner}: not created on {self.url}")
            yield

    async def _refuse_create(self, name: TopicName, reason: str) -> NoReturn:
        assert self.resources is not None
        if self.url and not self.broker.topic_exists(str(name)):
            # the sender claimed this broker before sending: a later create must not reuse it
            await self.resources.forget_own_record(name, self.url)
        raise SegmentFencedError(reason)

    async def exists(self, segment: str) -> bool:
        return self.broker.topic_exists(_check_segment(segment))

    async def subscriptions(self, segment: str) -> list[str]:
        segment = _check_segment(segment)
        if not self.broker.topic_exists(segment):
            return []
        topic = await self.broker.get_topic(segment, create=False)
        return sorted(topic.subscriptions)

    async def create(self, segment: str, subscriptions: list[str], near: str | None = None,
                     incarnation: str | None = None) -> None:
        segment = _check_segment(segment)
        async with self._fenced(segment, creating=True, incarnation=incarnation):
            topic = await self.broker.get_topic(segment)
            for subscription in subscriptions:
                await topic.open_subscription(subscription, "earliest")

    async def terminate(self, segment: str) -> None:
        topic = await self.broker.get_topic(_check_segment(segment), create=False)
        await topic.terminate(disconnect_producers=False)

    async def is_terminated(self, segment: str) -> bool:
        segment = _check_segment(segment)
        if not self.broker.topic_exists(segment):
            return False
        topic = await self.broker.get_topic(segment, create=False)
        return topic.ledger.terminated_at is not None

    async def delete(self, segment: str) -> None:
        segment = _check_segment(segment)
        async with self._fenced(segment, creating=False):
            if self.broker.topic_exists(segment):
                await self.broker.delete_topic(segment)
            if self.resources is not None and self.url:
                # only a record naming this broker: another's names a copy this delete did not reach
                await self.resources.forget_own_record(TopicName.parse(segment), self.url)
            elif self.resources is not None:
                await self.resources.forget_owner(TopicName.parse(segment))

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

    async def owner_url(self, segment: str) -> str:
        return self.url


class RoutedSegments:
    """Segment operations routed to the broker that owns each segment (several brokers).

    A segment topic lives in the data dir of the broker that created it; its owner is recorded
    in the metadata store when it is created (`resources.claim_owner`). An operation on a
    segment this broker owns (or one with no recorded owner) runs locally; any other goes to the
    owner's `/admin/v2/segments` API, at the web URL the owner registered under `/brokers/`.
    An owner that is not running makes the operation fail (ServiceNotReadyError): its data is
    only on its disk, so a split or merge of its segments waits until it is back. A create's
    incarnation (LocalSegments) goes to the owner as the `incarnation` query parameter.
    """

    def __init__(self, local: LocalSegments, resources: ScalableTopicResources, broker_url: str) -> None:
        if local.resources is None:
            local.resources = resources             # creates and deletes fenced (LocalSegments)
        self.local = local
        self.resources = resources
        self.url = broker_url
        # segment -> owner: an owner never changes while its segment exists (one metadata read
        # per segment instead of one per operation); forgotten when the segment is deleted
        self._owners: dict[str, str] = {}
        self._http: aiohttp.ClientSession | None = None

    async def _owner(self, segment: str) -> str:
        segment = _check_segment(segment)
        owner = self._owners.get(segment)
        if owner is None:
            owner = await self.resources.owner(TopicName.parse(segment))
            if owner is None:
                return self.url
            self._owners[segment] = owner
        return owner

    async def _remote(self, owner: str, method: str, segment: str, suffix: str = "", body: Any = None,
                      incarnation: str | None = None) -> Any:
        web = await self.resources.web_service_url(owner)
        if web is None:
            self._owners.pop(segment, None)     # read again next time: the owner may be back elsewhere
            raise ServiceNotReadyError(f"segment {segment} is owned by broker {owner}, which is not running")
        import aiohttp       # only brokers sharing a metadata store need it: embedding stays light

        name = TopicName.parse(segment)
        path = (f"/admin/v2/segments/{quote(name.tenant, safe='')}/{quote(name.namespace, safe='')}/"
                f"{quote(name.scalable_topic.local_name, safe='')}/{name.segment_descriptor}{suffix}")
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        try:
            params = {"incarnation": incarnation} if incarnation is not None else None
            async with self._http.request(method, web + path, json=body, params=params) as reply:
                text = await reply.text()
                status = reply.status
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            self._owners.pop(segment, None)
            raise ServiceNotReadyError(f"segment {segment}: broker {owner} ({web}) is unreachable: {error}") from None
        if status >= 300:
            reason = json.loads(text).get("reason", text) if text.startswith("{") else text
            raise to_pulsar_error_of_status(status, f"{owner}: {reason}")
        return json.loads(text) if text else None

    async def exists(self, segment: str) -> bool:
        owner = await self._owner(segment)
        if owner == self.url:
            return await self.local.exists(segment)
        return bool((await self._remote(owner, "GET", segment)).get("exists"))

    async def subscriptions(self, segment: str) -> list[str]:
        owner = await self._owner(segment)
        if owner == self.url:
            return await self.local.subscriptions(segment)
        return sorted((await self._remote(owner, "GET", segment)).get("subscriptions", {}))

    async def create(self, segment: str, subscriptions: list[str], near: str | None = None,
                     incarnation: str | None = None) -> None:
        preferred = await self._owner(near) if near is not None else self.url
        if preferred != self.url and await self.resources.web_service_url(preferred) is None:
            preferred = self.url                     # the parent's broker is away: create it here
        owner = await self.resources.claim_owner(TopicName.parse(_check_segment(segment)), preferred)
        self._owners[_check_segment(segment)] = owner
        try:
            if owner == self.url:
                await self.local.create(segment, subscriptions, incarnation=incarnation)
            else:
                await self._remote(owner, "PUT", segment, body=list(subscriptions), incarnation=incarnation)
        except BaseException:
            # not made there: it may be another broker's by now (LocalSegments), read it again
            self._owners.pop(_check_segment(segment), None)
            raise

    async def terminate(self, segment: str) -> None:
        owner = await self._owner(segment)
        if owner == self.url:
            await self.local.terminate(segment)
        else:
            await self._remote(owner, "POST", segment, "/terminate")

    async def is_terminated(self, segment: str) -> bool:
        owner = await self._owner(segment)
        if owner == self.url:
            return await self.local.is_terminated(segment)
        return bool((await self._remote(owner, "GET", segment)).get("terminated"))

    async def delete(self, segment: str) -> None:
        owner = await self._owner(segment)
        if owner == self.url:
            await self.local.delete(segment)            # forgets the owner, fenced
        else:
            # the same on the owner, even when the segment is absent there: the owner record is
            # forgotten under the owner's fence lock, after a create of it in flight there
            try:
                await self._remote(owner, "DELETE", segment)
            except TopicNotFoundError:
                pass                                    # it was absent: done all the same
        self._owners.pop(_check_segment(segment), None)

    async def create_subscription(self, segment: str, subscription: str) -> None:
        owner = await self._owner(segment)
        if owner == self.url:
            await self.local.create_subscription(segment, subscription)
        else:
            await self._remote(owner, "PUT", segment, body=[subscription])

    async def delete_subscription(self, segment: str, subscription: str) -> None:
        owner = await self._owner(segment)
        if owner == self.url:
            await self.local.delete_subscription(segment, subscription)
        else:
            await self._remote(owner, "DELETE", segment, f"/subscriptions/{quote(subscription, safe='')}")

    async def stats(self, segment: str) -> dict:
        owner = await self._owner(segment)
        if owner == self.url:
            return await self.local.stats(segment)
        return await self._remote(owner, "GET", segment)

    async def owner_url(self, segment: str) -> str:
        return await self._owner(segment)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
