"""Multi-topic consumers: `subscribe([topic, ...], ...)` and pattern subscriptions
(`subscribe(re.compile("persistent://public/default/orders-.*"), ...)`), as pulsar-client's.

A `MultiTopicsConsumer` holds one `Consumer` per topic (a partitioned topic's consumer covers
its partitions), all of one subscription with the same options. `receive()` takes the next
message of any of them; acknowledgements (and seek by a message id) go to the consumer of the
message's topic. A pattern subscription is within one namespace (Pulsar asks the broker for a
namespace's topics, GET_TOPICS_OF_NAMESPACE); every `pattern_auto_discovery_period` seconds it
asks again, subscribes the new topics that match and closes the consumers of topics that are gone.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyengine.client.backoff import Backoff
from pyengine.client.consumer import (
    ConsumerBatchReceivePolicy, PartitionConsumer, check_batch_receive_policy, receive_batch, receive_queued, wake_all,
    wake_one,
)
from pyengine.client.errors import AlreadyClosedError
from pyengine.client.message import Message, MessageId
from pyengine.client.transaction import check_same_client
from pyengine.concurrency import RunOnce
from pyengine.client.validation import check_timeout, check_topic
from pyengine.errors import InvalidTopicNameError
from pyengine.naming import TopicName
from pyengine.protocol import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from pyengine.client.client import ClientCore
    from pyengine.client.consumer import Consumer
    from pyengine.client.transaction import Transaction

log = logging.getLogger(__name__)

_MODES = {"persistent": pb.CommandGetTopicsOfNamespace.PERSISTENT,
          "non-persistent": pb.CommandGetTopicsOfNamespace.NON_PERSISTENT}


@dataclass(frozen=True, slots=True)
class TopicsPattern:
    """A topic regex split as Pulsar reads it: the domain and namespace it is within (plain
    names) and the regex the topic part of a name must match in full."""

    domain: str
    namespace: str
    local: re.Pattern[str]

    @property
    def mode(self) -> int:
        return _MODES[self.domain]

    def matches(self, topic: str) -> bool:
        """Whether `topic` (a partition counts as its partitioned topic) is one of the pattern's."""
        name = TopicName.parse(topic).partitioned_topic
        return (name.domain == self.domain and name.namespace_name == self.namespace
                and self.local.fullmatch(name.local_name) is not None)


def parse_topics_pattern(pattern: re.Pattern[str]) -> TopicsPattern:
    """The TopicsPattern of `pattern`: `[domain://][tenant/namespace/]regex`, like a topic name
    (no domain: persistent; no namespace: public/default). The domain, tenant and namespace
    are plain names, not regexes: a pattern subscription is within one namespace, as in Pulsar."""
    if not isinstance(pattern.pattern, str):
        raise TypeError("a topics pattern is a regex of str, not of bytes")
    text = pattern.pattern
    domain, sep, rest = text.partition("://")
    if not sep:
        domain, rest = "persistent", text
    if domain not in _MODES:
        raise ValueError(f"a topics pattern's domain is persistent or non-persistent, not {domain!r} "
                         f"(in {text!r}): a pattern subscription is within one domain and namespace")
    parts = rest.split("/", 2)
    if len(parts) == 1:
        tenant, namespace, local = "public", "default", parts[0]
    elif len(parts) == 3:
        tenant, namespace, local = parts
    else:
        raise ValueError(f"a topics pattern is [domain://][tenant/namespace/]regex, not {text!r}")
    try:
        TopicName.parse(f"{domain}://{tenant}/{namespace}/x")
    except InvalidTopicNameError:
        raise ValueError(f"a topics pattern's tenant and namespace must be names, not regexes ({tenant!r}/"
                         f"{namespace!r} in {text!r}): a pattern subscription is within one namespace") from None
    if not local:
        raise ValueError(f"a topics pattern needs a regex for the topic part, not {text!r}")
    try:
        regex = re.compile(local, pattern.flags)
    except re.error as exc:
        raise ValueError(f"the topic part of {text!r} is not a regex by itself: {exc}") from None
    return TopicsPattern(domain, f"{tenant}/{namespace}", regex)


def check_topic_list(topics: Any) -> list[str]:
    """The normalised, distinct topic names of a list of topics (in the given order). A
    partitioned topic and one of its partitions cannot be in one list: the partition would
    get two consumers of the subscription (the Java client refuses it: "Already subscribed")."""
    if not topics:
        raise ValueError("subscribe to a list of topics needs at least one topic")
    names: list[str] = []
    for topic in topics:
        name = check_topic(topic)
        if TopicName.parse(name).is_scalable:
            raise ValueError(f"scalable topic:// topics cannot be in a list of topics: {name}")
        if name not in names:
            names.append(name)
    for name in names:
        partitioned = str(TopicName.parse(name).partitioned_topic)
        if partitioned != name and partitioned in names:
            raise ValueError(f"a list of topics cannot hold both {partitioned} and its partition {name}: "
                             "the partitioned topic's consumer covers its partitions")
    return names


def check_discovery_period(value: Any) -> float:
    """pulsar-client's pattern_auto_discovery_period: seconds between discoveries, > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"pattern_auto_discovery_period must be a number of seconds, not {type(value).__name__}")
    if not value > 0:
        raise ValueError(f"pattern_auto_discovery_period must be > 0 seconds, not {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class SubscribeTarget:
    """What `subscribe(topic, ...)` was given, checked: one topic's name, a list of topics, or a
    pattern with its discovery period."""

    name: str | None = None
    topics: list[str] | None = None
    pattern: TopicsPattern | None = None
    period: float = 60.0

    @property
    def several(self) -> bool:
        return self.name is None


def subscribe_target(topic: Any, pattern_auto_discovery_period: Any) -> SubscribeTarget:
    """A topic name, a list of them or a compiled regex, as pulsar-client's subscribe takes."""
    if isinstance(topic, re.Pattern):
        return SubscribeTarget(pattern=parse_topics_pattern(topic),
                               period=check_discovery_period(pattern_auto_discovery_period))
    if isinstance(topic, (list, tuple)):
        return SubscribeTarget(topics=check_topic_list(topic))
    return SubscribeTarget(name=check_topic(topic))


class MultiTopicsConsumer:
    """One subscription over several topics: a list of them, or those matching a pattern."""

    def __init__(self, core: ClientCore, subscription_name: str, subscribe_one: Callable[[str], Awaitable[Consumer]],
                 receiver_queue_size: int, pattern: TopicsPattern | None = None,
                 discovery_period: float = 60.0,
                 batch_receive_policy: ConsumerBatchReceivePolicy | None = None) -> None:
        self._core = core
        self._subscription_name = subscription_name
        self._subscribe_one = subscribe_one
        self._pattern = pattern
        self._discovery_period = discovery_period
        self._consumers: dict[str, Consumer] = {}
        self._pumps: dict[str, asyncio.Task[None]] = {}
        # Messages taken from the topics' consumers, for receive(); at most about this many
        # (each topic's consumer keeps its own receiver queue behind).
        self._buffer: deque[tuple[Consumer, PartitionConsumer | None, Message]] = deque()
        self._buffer_size = max(receiver_queue_size, 1)
        self._buffer_bytes = 0                  # payload bytes in the buffer (batch receive)
        self._room = asyncio.Event()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._batch_waiters: list[asyncio.Future[None]] = []
        self._batch_receive_policy = check_batch_receive_policy(batch_receive_policy).within(self._buffer_size)
        self._discovery: asyncio.Task[None] | None = None
        # Topics whose consumer failed for good, being subscribed again in the background.
        self._resubscribing: dict[str, asyncio.Task[None]] = {}
        self._closed = False
        self._closing = RunOnce(self._close)

    def __repr__(self) -> str:
        return f"consumer of {self._subscription_name!r} on {len(self._consumers)} topics"

    @property
    def topics(self) -> list[str]:
        """The topics subscribed now."""
        return sorted(self._consumers)

    @property
    def subscription_name(self) -> str:
        return self._subscription_name

    # --- subscribing ----------------------------------------------------------------------

    async def _start(self, topics: list[str] | None = None) -> None:
        """Subscribe `topics` (a list subscription) or the pattern's topics now, then (pattern)
        look for new and deleted topics every discovery period."""
        try:
            if self._pattern is not None:
                topics = await self._matching_topics()
            assert topics is not None
            await self._add(topics, raise_errors=True)
        except BaseException:
            await self.close()
            raise
        if self._pattern is not None:
            self._discovery = asyncio.ensure_future(self._discover_periodically())

    async def _matching_topics(self) -> list[str]:
        """The namespace's topics matching the pattern (a partitioned topic once, by its name)."""
        assert self._pattern is not None
        listed = await self._core.topics_of_namespace(self._pattern.namespace, self._pattern.mode)
        names = {str(TopicName.parse(topic).partitioned_topic) for topic in listed}
        return sorted(name for name in names if self._pattern.matches(name))

    async def _add(self, topics: list[str], *, raise_errors: bool) -> None:
        new = [topic for topic in topics if topic not in self._consumers and topic not in self._resubscribing]
        subscribing = [asyncio.ensure_future(self._subscribe_one(topic)) for topic in new]
        try:
            outcomes = await asyncio.gather(*subscribing, return_exceptions=True)
        finally:
            # Cancelled too (every one is done by then): the consumers made are kept, for
            # close() to close them; or closed now, if this consumer is closed already.
            made = [(topic, task.result()) for topic, task in zip(new, subscribing)
                    if not task.cancelled() and task.exception() is None]
            if self._closed:
                await asyncio.gather(*(consumer.close() for _, consumer in made))
            else:
                for topic, consumer in made:
                    self._keep(topic, consumer)
        errors = []
        for topic, outcome in zip(new, outcomes):
            if isinstance(outcome, BaseException):
                errors.append(outcome)
                log.warning("%s: subscribing %s failed: %s", self, topic, outcome)
        if errors and raise_errors:
            raise errors[0]

    def _keep(self, topic: str, consumer: Consumer) -> None:
        self._consumers[topic] = consumer
        self._follow_redeliveries(consumer)
        self._pumps[topic] = asyncio.ensure_future(self._pump(topic, consumer))

    def _follow_redeliveries(self, consumer: Consumer) -> None:
        """When messages `consumer` delivered come again (Shared / Key_Shared: entries asked for
        again, by a nack or an ack timeout; Exclusive / Failover: everything unacknowledged,
        after a nack or an ack timeout too; any type: a reconnect, a seek), it drops its queued
        copies of them; the copies it moved into this buffer already are dropped with them, or
        the application would get those messages twice, the stale copy and the one sent again
        (as Java's MultiTopicsConsumerImpl takes them out of its queue,
        removeExpiredMessagesFromQueue, and drops those of an older consumer epoch). Their
        permits went back to the broker when they left the topic's queue
        (`_receive_for_parent`): none to give back."""
        def drop_buffered_too(handler: PartitionConsumer | None,
                              coming_again: Callable[[MessageId], bool] | None) -> None:
            if any(item[0] is consumer for item in self._buffer):
                self._drop_buffered(consumer, lambda owner, at: owner is handler
                                    and (coming_again is None or coming_again(at)))

        consumer.on_entries_coming_again = drop_buffered_too

    async def _remove(self, topic: str) -> None:
        consumer = self._consumers.pop(topic)
        pump = self._pumps.pop(topic)
        if pump is not asyncio.current_task():
            pump.cancel()
        # what it delivered and was not received yet cannot be acknowledged any more
        self._drop_buffered(consumer)
        try:
            await consumer.close()
        except Exception as exc:
            log.info("%s: closing the consumer of %s: %s", self, topic, exc)

    def _drop_buffered(self, consumer: Consumer | None = None,
                       where: Callable[[PartitionConsumer | None, MessageId], bool] | None = None) -> None:
        """Forget the buffered messages of `consumer` (None: of every topic); with `where`, only
        those it selects (by the partition's consumer and the message id)."""
        self._buffer = (deque() if consumer is None else
                        deque(item for item in self._buffer if item[0] is not consumer
                              or (where is not None and not where(item[1], item[2].message_id))))
        self._buffer_bytes = sum(len(message.data) for _, _, message in self._buffer)
        self._room.set()

    async def _discover_periodically(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._discovery_period)
            try:
                await self._rediscover()
            except asyncio.CancelledError:
                raise
            except Exception as exc:         # asked again next period, as Pulsar's clients do
                log.warning("%s: topic discovery failed: %s", self, exc)

    async def _rediscover(self) -> None:
        """Subscribe the matching topics that are new, drop those that are gone."""
        matching = await self._matching_topics()
        if self._closed:
            return
        for topic in [t for t in self._consumers if t not in matching]:
            if topic not in self._consumers:
                continue                        # dropped while an earlier one closed (its consumer failed)
            log.info("%s: %s is gone, unsubscribing it", self, topic)
            await self._remove(topic)
        for topic in [t for t in self._resubscribing if t not in matching]:
            self._resubscribing.pop(topic).cancel()
        await self._add(matching, raise_errors=False)

    # --- receiving ------------------------------------------------------------------------

    async def _pump(self, topic: str, consumer: Consumer) -> None:
        """Move `consumer`'s messages into the shared buffer while it has room."""
        try:
            while True:
                while len(self._buffer) >= self._buffer_size:
                    self._room.clear()
                    await self._room.wait()
                # tracked for its ack timeout once the application receives it (`_take`)
                handler, message = await consumer._receive_for_parent()
                self._buffer.append((consumer, handler, message))
                self._buffer_bytes += len(message.data)
                wake_one(self._waiters)
                wake_all(self._batch_waiters)
        except asyncio.CancelledError:
            raise
        except AlreadyClosedError:
            return                              # closed: by us, or with the client
        except Exception as exc:
            # One topic's consumer failed for good (e.g. ConsumerBusy on a reconnect): as the
            # C++ MultiTopicsConsumerImpl, the other topics go on; this one is subscribed again.
            if self._closed or self._consumers.get(topic) is not consumer:
                return
            log.warning("%s: the consumer of %s failed: %s; subscribing it again", self, topic, exc)
            # Known as being subscribed again before the close below: a rediscovery meanwhile
            # would subscribe it too, and the resubscription replace (and leak) that consumer.
            self._resubscribing[topic] = asyncio.ensure_future(self._resubscribe(topic))
            await self._remove(topic)

    async def _resubscribe(self, topic: str) -> None:
        """Subscribe `topic` again, with back-off, until it works or this consumer closes."""
        config = self._core.config
        backoff = Backoff(config.initial_backoff, config.max_backoff)
        try:
            while not self._closed:
                await asyncio.sleep(backoff.next())
                try:
                    consumer = await self._subscribe_one(topic)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.info("%s: subscribing %s again failed: %s", self, topic, exc)
                    continue
                if self._closed:
                    await consumer.close()
                else:
                    self._keep(topic, consumer)
                return
        finally:
            if self._resubscribing.get(topic) is asyncio.current_task():
                del self._resubscribing[topic]

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosedError(f"the consumer of {self._subscription_name!r} is closed")

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message of any of the topics (TimeoutError after `timeout` seconds)."""
        check_timeout("timeout", timeout)
        self._check_open()
        return await receive_queued(self._take, self._waiters, self._check_open, timeout)

    def _take(self) -> Message | None:
        if not self._buffer:
            return None
        consumer, handler, message = self._buffer.popleft()
        consumer._track(handler, message)
        self._buffer_bytes -= len(message.data)
        self._room.set()
        return message

    async def batch_receive(self) -> list[Message]:
        """Messages of any of the topics, as `Consumer.batch_receive` (by the policy given to
        subscribe): once enough are buffered or at the timeout, maybe none then."""
        self._check_open()
        return await receive_batch(self._peek, self._take, self._enough_for_batch, self._batch_waiters,
                                   self._check_open, self._batch_receive_policy)

    def _peek(self) -> Message | None:
        return self._buffer[0][2] if self._buffer else None

    def _enough_for_batch(self) -> bool:
        # A full buffer gets no more messages: enough too (as Consumer.batch_receive).
        count = len(self._buffer)
        return self._batch_receive_policy.enough(count, self._buffer_bytes) or count >= self._buffer_size

    def _wake_all(self) -> None:
        wake_all(self._waiters)
        wake_all(self._batch_waiters)

    # --- acknowledgements -----------------------------------------------------------------

    def _consumer_of(self, message: Any) -> Consumer:
        """The consumer of the topic `message` came from (a partition's: its partitioned topic's):
        a Message's topic, or the topic a received message's MessageId names (as the C++
        MultiTopicsConsumerImpl goes by getTopicName)."""
        if isinstance(message, Message):
            topic = message.topic
        elif isinstance(message, MessageId):
            topic = message.topic_name
            if not topic:
                raise TypeError(f"message id {message} does not name its topic (not one of a received message): "
                                "a consumer of several topics needs the Message, or its message_id")
        else:
            raise TypeError(f"expected a Message or MessageId, not {type(message).__name__}")
        consumer = self._consumers.get(topic)
        if consumer is None:
            consumer = self._consumers.get(str(TopicName.parse(topic).partitioned_topic))
        if consumer is None:
            raise ValueError(f"{topic} is not one of the topics of this consumer (or was dropped)")
        return consumer

    async def acknowledge(self, message: Message | MessageId, txn: Transaction | None = None) -> None:
        """Acknowledge a message, or a received message's id (with `txn`: as part of the
        transaction) on its topic."""
        self._check_open_for(txn)
        await self._consumer_of(message).acknowledge(message, txn)

    async def acknowledge_cumulative(self, message: Message | MessageId, txn: Transaction | None = None) -> None:
        """Acknowledge every message of the message's topic up to it (Exclusive, Failover)."""
        self._check_open_for(txn)
        await self._consumer_of(message).acknowledge_cumulative(message, txn)

    def _check_open_for(self, txn: Transaction | None) -> None:
        """`_check_open` for an ack: one of a transaction refused here fails its commit too
        (another client's transaction is refused before, left as it was)."""
        if txn is not None:
            check_same_client(txn, self._core.coordinator)
        try:
            self._check_open()
        except AlreadyClosedError as exc:
            refused = getattr(txn, "_refused", None)     # pyengine.client's or the embedded API's
            if refused is not None:
                refused(exc)
            raise

    async def negative_acknowledge(self, message: Message | MessageId) -> None:
        self._check_open()
        await self._consumer_of(message).negative_acknowledge(message)

    async def redeliver_unacknowledged_messages(self) -> None:
        self._check_open()
        for consumer in list(self._consumers.values()):
            await consumer.redeliver_unacknowledged_messages()
            # What sits in the shared buffer comes again from its topic: dropped right after
            # (a pump may have moved more of the old delivery in before the topic's redeliver).
            self._drop_buffered(consumer)

    async def seek(self, target: MessageId | int) -> None:
        """As the C++ MultiTopicsConsumerImpl: a received message's id moves its own topic's
        subscription (the id names its topic); MessageId.earliest / .latest or a publish time
        in ms since the epoch move every topic's. Buffered messages of a moved partition are dropped."""
        self._check_open()
        if isinstance(target, bool) or not isinstance(target, (MessageId, int)):
            raise TypeError(f"seek takes a MessageId or a timestamp in ms, not {type(target).__name__}")
        if isinstance(target, int) and not 0 <= target < 1 << 64:     # before any topic moves
            raise ValueError(f"a seek timestamp is in ms since the epoch, >= 0 and < 2**64, not {target}")
        if isinstance(target, MessageId) and target not in (MessageId.earliest, MessageId.latest):
            await self._seek_one(self._consumer_of(target), target)
        else:
            await asyncio.gather(*(self._seek_one(c, target) for c in list(self._consumers.values())))

    async def _seek_one(self, consumer: Consumer, target: MessageId | int) -> None:
        # Its buffered messages of before the seek are dropped as each partition moves (the
        # listener of `_follow_redeliveries`), not once all have: a partition moved first may
        # have sent messages of its new position by then, and those must stay.
        await consumer.seek(target)

    async def unsubscribe(self) -> None:
        """Delete the subscription on every topic, then close. As the C++ MultiTopicsConsumerImpl:
        every topic is tried; if one fails, its error is raised and this consumer stays open on
        the topics not unsubscribed (those unsubscribed are dropped), so unsubscribe can be retried."""
        self._check_open()
        topics = list(self._consumers)
        results = await asyncio.gather(*(self._consumers[t].unsubscribe() for t in topics), return_exceptions=True)
        errors = []
        for topic, result in zip(topics, results):
            if isinstance(result, BaseException):
                errors.append(result)
                log.warning("%s: unsubscribing %s failed: %s", self, topic, result)
            elif topic in self._consumers:
                await self._remove(topic)
        if errors:
            raise errors[0]
        await self.close()

    async def close(self) -> None:
        """Close every topic's consumer; a cancelled close still finishes (see RunOnce)."""
        await self._closing()

    async def _close(self) -> None:
        self._closed = True
        if self._discovery is not None:
            self._discovery.cancel()
        for task in self._resubscribing.values():
            task.cancel()
        self._resubscribing.clear()
        for pump in self._pumps.values():
            pump.cancel()
        self._pumps.clear()
        consumers, self._consumers = list(self._consumers.values()), {}
        self._buffer.clear()
        self._buffer_bytes = 0
        self._wake_all()
        results = await asyncio.gather(*(c.close() for c in consumers), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                log.info("%s: closing a topic's consumer: %s", self, result)
        self._core.forget(self)  # type: ignore[arg-type]
