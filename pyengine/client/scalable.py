"""Scalable topics (PIP-468) in the client: a DAG watch, a key-routed producer and a queue consumer.

* `DagWatch` keeps the segment DAG of a `topic://` name current: it opens a DAG watch session
  (SCALABLE_TOPIC_LOOKUP) on a broker of the service URL and applies every update the broker
  pushes; when the connection drops it opens a new session (on the next service address).
* `ScalableProducer` sends each message to the active segment whose hash range holds its key's
  hash (Pulsar's Murmur3, `pyengine.scalable.key_hash`; keyless messages go round robin). A
  segment that was split or merged is terminated before the new layout is published, so a send
  to it fails with TopicTerminated: the producer waits for a newer layout and sends again to
  the child that now owns the key. Sends awaited one after the other keep each key's order.
* `StreamConsumer` (ordered): registers with the controller leader and consumes the segments
  it is assigned, following each pushed assignment (see the class).
* `CheckpointConsumer`: assigned like a StreamConsumer, reads with readers and keeps its own
  position (`checkpoint()`), for connectors.
* `QueueConsumer` (unordered, individual acks) attaches a Shared consumer to every segment,
  sealed ones included (their backlog is still delivered), and to each new segment the DAG
  brings; no controller is involved.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pyengine.client.backoff import Backoff
from pyengine.client.consumer import Consumer
from pyengine.client.errors import AlreadyClosedError
from pyengine.client.message import Message, MessageId
from pyengine.client.producer import Producer
from pyengine.client.url import parse_broker_url
from pyengine.errors import ConsumerBusyError, NotAllowedError, PulsarError, TopicTerminatedError
from pyengine.naming import TopicName
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command
from pyengine.scalable.layout import SegmentInfo, SegmentLayout, key_hash
from pyengine.scalable.wire import dag_to_layout

if TYPE_CHECKING:
    from pyengine.client.client import Client, ClientCore
    from pyengine.client.transaction import Transaction
    from pyengine.client.connection import ClientConnection

log = logging.getLogger(__name__)


async def _forward(consumer: Consumer, closed: Callable[[], bool], put: Callable[[Message], None], what: str) -> None:
    """Hand what `consumer` receives to `put` until its owner closes (or the consumer does);
    a failure ends the forwarding with a warning naming `what`."""
    while not closed():
        try:
            message = await consumer.receive()
        except (asyncio.CancelledError, AlreadyClosedError):
            return
        except Exception as exc:
            log.warning("%s: %s", what, exc)
            return
        put(message)

_session_ids = itertools.count(1)


async def retry(core: ClientCore, attempt: Callable[[], Awaitable[None]], stopped: Callable[[], bool],
                what: str) -> None:
    """Run `attempt` until it succeeds or `stopped()`, backing off between failures."""
    backoff = Backoff(core.config.initial_backoff, core.config.max_backoff)
    while not stopped():
        try:
            await attempt()
            return
        except (asyncio.CancelledError, AlreadyClosedError):
            return
        except Exception as exc:
            log.info("%s: %s", what, exc)
            await asyncio.sleep(backoff.next())


class DagWatch:
    def __init__(self, core: ClientCore, topic: str) -> None:
        name = TopicName.parse(topic)
        if not name.is_scalable:
            raise ValueError(f"{topic} is not a scalable topic (topic://tenant/namespace/topic)")
        self.core = core
        self.topic = str(name)
        self.topic_name = name
        self.layout: SegmentLayout | None = None
        self.controller_url: str | None = None
        self.segment_brokers: dict[int, str] = {}
        self.listeners: list[Any] = []
        self._changed = asyncio.Event()
        self._connection: ClientConnection | None = None
        self._session_id = 0
        self._first: asyncio.Future[None] | None = None
        self._reopen: asyncio.Task | None = None
        self._closed = False

    async def start(self) -> DagWatch:
        await self._open()
        return self

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        connection = await self.core.pool.get(self.core.lookup._service_address())
        self._session_id = next(_session_ids)
        self._first = loop.create_future()
        self._connection = connection
        connection.dag_sessions[self._session_id] = self._on_update
        connection.add_close_listener(self._connection_closed)
        connection.send_command(base_command(pb.BaseCommand.SCALABLE_TOPIC_LOOKUP, session_id=self._session_id,
                                             topic=self.topic))
        try:
            await asyncio.wait_for(asyncio.shield(self._first), self.core.config.operation_timeout)
        except BaseException:
            connection.dag_sessions.pop(self._session_id, None)
            raise

    def _on_update(self, update: pb.CommandScalableTopicUpdate) -> None:
        first = self._first
        if update.HasField("error"):
            error = PulsarError.from_code(update.error, update.message)
            if self._connection is not None:
                self._connection.dag_sessions.pop(self._session_id, None)
            if first is not None and not first.done():
                first.set_exception(error)
            else:
                log.warning("DAG watch of %s ended: %s", self.topic, update.message)
            return
        layout, controller, brokers = dag_to_layout(update.dag)
        if self.layout is None or layout.epoch >= self.layout.epoch:
            self.layout, self.controller_url, self.segment_brokers = layout, controller, brokers
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
            for listener in list(self.listeners):
                try:
                    listener(layout)
                except Exception:
                    log.exception("DAG listener failed")
        if first is not None and not first.done():
            first.set_result(None)

    def _connection_closed(self, connection: ClientConnection) -> None:
        if self._closed or connection is not self._connection:
            return
        connection.dag_sessions.pop(self._session_id, None)
        self._reopen = asyncio.get_running_loop().create_task(self._reopen_loop())

    async def _reopen_loop(self) -> None:
        await retry(self.core, self._open, lambda: self._closed, f"re-opening the DAG watch of {self.topic}")

    async def wait_changed(self, timeout: float) -> None:
        """Until the next update (TimeoutError after `timeout` s)."""
        await asyncio.wait_for(self._changed.wait(), timeout)

    async def wait_newer_than(self, epoch: int, timeout: float) -> SegmentLayout:
        """The layout once its epoch is above `epoch` (TimeoutError after `timeout` s)."""
        async def wait() -> SegmentLayout:
            while self.layout is None or self.layout.epoch <= epoch:
                await self._changed.wait()
            return self.layout
        return await asyncio.wait_for(wait(), timeout)

    async def close(self) -> None:
        self._closed = True
        if self._reopen is not None:
            self._reopen.cancel()
        connection = self._connection
        if connection is not None and connection.dag_sessions.pop(self._session_id, None) is not None \
                and connection.usable:
            connection.send_command(base_command(pb.BaseCommand.SCALABLE_TOPIC_CLOSE, session_id=self._session_id))


class ScalableProducer:
    """Sends to the active segment owning each key; re-routes after splits and merges."""

    def __init__(self, client: Client, watch: DagWatch, producer_options: dict[str, Any]) -> None:
        self._client = client
        self.watch = watch
        self._options = producer_options
        self._producers: dict[int, Producer] = {}
        self._opening: dict[int, asyncio.Future[Producer]] = {}
        self._round_robin = itertools.count()
        self._closed = False

    @property
    def topic(self) -> str:
        return self.watch.topic

    def _segment_for(self, layout: SegmentLayout, key: str | None) -> SegmentInfo:
        if key is not None:
            return layout.segment_for_key(key)
        active = layout.active_segments
        return active[next(self._round_robin) % len(active)]

    async def _producer(self, segment: SegmentInfo) -> Producer:
        producer = self._producers.get(segment.segment_id)
        if producer is not None:
            return producer
        opening = self._opening.get(segment.segment_id)
        if opening is None:
            opening = asyncio.ensure_future(
                self._client.create_producer(segment.topic_name(self.watch.topic_name), **self._options))
            self._opening[segment.segment_id] = opening
            try:
                producer = await opening
                self._producers[segment.segment_id] = producer
                return producer
            finally:
                del self._opening[segment.segment_id]
        return await asyncio.shield(opening)

    async def send(self, data: bytes, *, key: str | None = None, properties: dict[str, str] | None = None,
                   txn: Transaction | None = None) -> tuple[int, MessageId]:
        """Send one message; (segment id, message id in that segment). `txn`: a scalable
        (v5) transaction; a send re-routed after a split stays in it (PIP-473: the decision
        lives above the segments, sealed ones included)."""
        timeout = self._client._core.config.operation_timeout
        while True:
            if self._closed:
                raise AlreadyClosedError(f"the producer on {self.topic} is closed")
            layout = self.watch.layout
            assert layout is not None
            segment = self._segment_for(layout, key)
            try:
                producer = await self._producer(segment)
                return segment.segment_id, await producer.send(data, key=key, properties=properties, txn=txn)
            except TopicTerminatedError:
                # split or merged: the new layout follows the termination
                stale = self._producers.pop(segment.segment_id, None)
                if stale is not None:
                    await stale.close()
                if self.watch.layout is layout or self.watch.layout.segment(segment.segment_id).is_active:
                    await self.watch.wait_newer_than(layout.epoch, timeout)

    async def close(self) -> None:
        self._closed = True
        for producer in list(self._producers.values()):
            await producer.close()
        self._producers.clear()
        await self.watch.close()


class QueueConsumer:
    """Shared consumers on every segment of the topic; messages in arrival order across them."""

    def __init__(self, client: Client, watch: DagWatch, subscription: str, options: dict[str, Any]) -> None:
        self._client = client
        self.watch = watch
        self.subscription = subscription
        self._options = options
        self._consumers: dict[int, Consumer] = {}
        self._queue: asyncio.Queue[tuple[int, Message]] = asyncio.Queue()
        self._tasks: dict[int, asyncio.Task] = {}
        self._attaching: asyncio.Lock = asyncio.Lock()
        self._closed = False

    async def _start(self) -> None:
        self.watch.listeners.append(self._on_layout)
        await self._attach(self.watch.layout)

    def _on_layout(self, layout: SegmentLayout) -> None:
        if not self._closed:
            task = asyncio.get_running_loop().create_task(self._attach(layout))
            self._tasks[-1 - len(self._tasks)] = task

    async def _attach(self, layout: SegmentLayout | None) -> None:
        if layout is None:
            return
        async with self._attaching:
            for segment in sorted(layout.all_segments.values(), key=lambda s: s.segment_id):
                if segment.segment_id in self._consumers or self._closed:
                    continue
                consumer = await self._client.subscribe(
                    segment.topic_name(self.watch.topic_name), self.subscription, consumer_type="shared",
                    initial_position="earliest", **self._options)
                self._consumers[segment.segment_id] = consumer
                self._tasks[segment.segment_id] = asyncio.get_running_loop().create_task(
                    _forward(consumer, lambda: self._closed,
                             lambda message, segment_id=segment.segment_id: self._queue.put_nowait(
                                 (segment_id, message)),
                             f"queue consumer of {self.watch.topic}, segment {segment.segment_id}"))

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message of any segment (`message.topic` names its segment)."""
        _, message = await asyncio.wait_for(self._queue.get(), timeout)
        return message

    async def acknowledge(self, message: Message, txn: Transaction | None = None) -> None:
        """Acknowledge `message` on its segment (in `txn`, a scalable transaction, if given)."""
        try:
            segment_id = TopicName.parse(message.topic).segment_id
        except (AttributeError, ValueError):
            raise ValueError("not a message received from a scalable topic's segment") from None
        consumer = self._consumers.get(segment_id)
        if consumer is None:
            raise ValueError(f"not a message of this consumer's segments ({message.topic})")
        await consumer.acknowledge(message, txn=txn)

    @property
    def segments(self) -> list[int]:
        return sorted(self._consumers)

    async def close(self) -> None:
        self._closed = True
        if self._on_layout in self.watch.listeners:
            self.watch.listeners.remove(self._on_layout)
        for task in self._tasks.values():
            task.cancel()
        for consumer in list(self._consumers.values()):
            await consumer.close()
        self._consumers.clear()
        await self.watch.close()


class StreamConsumer:
    """An ordered consumer of a scalable topic: registers with the controller leader (the DAG
    names it), consumes exactly the segments it is assigned (an Exclusive subscription on each),
    and follows every pushed assignment. The controller hands a split's children out only once
    the parent is drained, so each key's messages arrive in the order they were sent, provided
    messages are acknowledged (a parent's unacknowledged messages hold its children back).
    When the connection to the controller drops, it registers again (with the same name: within
    the grace period it keeps its segments)."""

    def __init__(self, client: Client, watch: DagWatch, subscription: str, consumer_name: str,
                 options: dict[str, Any]) -> None:
        self._client = client
        self._core = client._core
        self.watch = watch
        self.subscription = subscription
        self.consumer_name = consumer_name
        self._options = options
        self.consumer_id = self._core.new_consumer_id()
        self.layout_epoch = -1
        self.assigned: list[int] = []
        self._consumers: dict[str, Consumer] = {}
        self._pumps: dict[str, asyncio.Task] = {}
        self._queue: asyncio.Queue[Any] = asyncio.Queue()     # what _hand_out turns into a message
        self._applying = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._connection: ClientConnection | None = None
        self._answer: asyncio.Future[pb.CommandScalableConsumerAssignment] | None = None
        self._request_id = -1
        self._closed = False

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _register(self) -> None:
        timeout = self._core.config.operation_timeout
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            url = self.watch.controller_url
            # no leader yet (no broker was asked about the topic): any broker stands for election
            address = parse_broker_url(url) if url is not None else self._core.lookup._service_address()
            connection = await self._core.pool.get(address)
            self._connection = connection
            connection.scalable_consumers[self.consumer_id] = self._on_assignment
            connection.add_close_listener(self._connection_closed)
            self._request_id = connection.new_request_id()
            self._answer = asyncio.get_running_loop().create_future()
            connection.send_command(base_command(
                pb.BaseCommand.SCALABLE_CONSUMER_REGISTER, request_id=self._request_id, consumer_id=self.consumer_id,
                topic=self.watch.topic, subscription=self.subscription, consumer_name=self.consumer_name))
            answer = await asyncio.wait_for(self._answer, timeout)
            if not answer.HasField("error"):
                await self._apply(answer)
                return
            error = PulsarError.from_code(answer.error, answer.message)
            connection.scalable_consumers.pop(self.consumer_id, None)
            if "not the controller leader" not in answer.message or asyncio.get_running_loop().time() > deadline:
                raise error
            try:                                   # the DAG will name the new leader
                await self.watch.wait_changed(self._core.config.initial_backoff * 5)
            except TimeoutError:
                pass

    def _on_assignment(self, assignment: pb.CommandScalableConsumerAssignment) -> None:
        if assignment.HasField("request_id") and assignment.request_id == self._request_id \
                and self._answer is not None and not self._answer.done():
            self._answer.set_result(assignment)
        elif not assignment.HasField("error"):
            self._spawn(self._apply(assignment))

    async def _apply(self, assignment: pb.CommandScalableConsumerAssignment) -> None:
        async with self._applying:
            if self._closed or assignment.layout_epoch < self.layout_epoch:
                return
            self.layout_epoch = assignment.layout_epoch
            self.assigned = [s.segment_id for s in assignment.segments]
            wanted = [s.topic for s in assignment.segments]
            for topic in [t for t in self._consumers if t not in wanted]:
                self._pumps.pop(topic).cancel()
                await self._consumers.pop(topic).close()
            for topic in wanted:
                if topic not in self._consumers:
                    consumer = await self._subscribe(topic)
                    self._consumers[topic] = consumer
                    self._pumps[topic] = asyncio.get_running_loop().create_task(_forward(
                        consumer, lambda: self._closed, self._queue.put_nowait,
                        f"stream consumer {self.consumer_name} on {consumer.topic}"))

    async def _subscribe(self, topic: str) -> Consumer:
        """Exclusive on the segment; its previous owner may still be closing (ConsumerBusy)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._core.config.operation_timeout
        while True:
            try:
                return await self._client.subscribe(topic, self.subscription, consumer_type="exclusive",
                                                    initial_position="earliest",
                                                    consumer_name=self.consumer_name, **self._options)
            except ConsumerBusyError:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.05)


    def _connection_closed(self, connection: ClientConnection) -> None:
        if self._closed or connection is not self._connection:
            return
        connection.scalable_consumers.pop(self.consumer_id, None)
        self._spawn(self._reregister())

    async def _reregister(self) -> None:
        await asyncio.sleep(self._core.config.initial_backoff)
        await retry(self._core, self._register, lambda: self._closed,
                    f"stream consumer {self.consumer_name} re-registering")

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message of a segment still assigned here: one read before its segment went
        to another consumer is dropped (that consumer reads it too; handed out here as well it
        would come twice, could not be acknowledged, and could break its key's order)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            message = self._hand_out(await asyncio.wait_for(self._queue.get(), remaining))
            if message is not None:
                return message

    def _hand_out(self, queued: Any) -> Message | None:
        """The message of a queue item, or None when its segment is no longer assigned here."""
        return queued if queued.topic in self._consumers else None

    async def acknowledge(self, message: Message, txn: Transaction | None = None) -> None:
        """Acknowledge `message` on its segment (in `txn`, a scalable transaction, if given:
        the segment counts as drained for its children only once the txn commits)."""
        consumer = self._consumers.get(getattr(message, "topic", None))
        if consumer is None:
            raise ValueError("not a message of a segment this consumer is assigned")
        await consumer.acknowledge(message, txn=txn)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        connection = self._connection
        if connection is not None and connection.scalable_consumers.pop(self.consumer_id, None) is not None \
                and connection.usable:
            connection.send_command(base_command(pb.BaseCommand.SCALABLE_CONSUMER_UNREGISTER,
                                                 consumer_id=self.consumer_id))
        for task in [*self._pumps.values(), *self._tasks]:
            task.cancel()
        for consumer in list(self._consumers.values()):
            await consumer.close()
        self._consumers.clear()
        await self.watch.close()


class CheckpointConsumer(StreamConsumer):
    """An unmanaged ordered consumer (for connectors): registered with the controller like a
    StreamConsumer, but it reads its segments with non-durable readers and keeps its position
    itself — `checkpoint()` returns it, and a new consumer started from it resumes after the
    last message handed out. Before an assigned segment it reads the segment's sealed ancestors
    to their end, handing out only the messages whose key hash falls in the assigned segment's
    range (keyless ones: in the range holding the ancestor's first hash), so each key's messages
    come in order across splits and merges without acknowledgements."""

    def __init__(self, client: Client, watch: DagWatch, subscription: str, consumer_name: str,
                 options: dict[str, Any], checkpoint: dict[int, MessageId] | None = None) -> None:
        super().__init__(client, watch, subscription, consumer_name, options)
        # segment id -> (hash range read, last message id read, read to its end)
        self._progress: dict[int, tuple[tuple[int, int], MessageId | None, bool]] = {}
        for sid, message_id in (checkpoint or {}).items():
            if not isinstance(message_id, MessageId):
                raise TypeError("a checkpoint maps segment ids to MessageIds")
            self._progress[sid] = ((0, 0xFFFF), message_id, False)
        self._chains: dict[int, asyncio.Task] = {}
        # Read messages wait in the queue as (assigned segment, segment read, message); per
        # segment read: how many wait, and the last one handed out by receive().
        self._waiting: Counter[int] = Counter()
        self._handed: dict[int, MessageId] = {}

    def checkpoint(self) -> dict[int, MessageId]:
        """Where to resume, per segment read: how far it was read when none of its messages
        waits in this consumer's queue, else the last message handed out by receive() (a
        message read but not received yet is not behind the checkpoint)."""
        positions = {}
        for sid, (_, last_read, _) in self._progress.items():
            position = last_read if not self._waiting[sid] else self._handed.get(sid)
            if position is not None:
                positions[sid] = position
        return positions

    def _hand_out(self, queued: Any) -> Message | None:
        target, sid, message = queued
        self._waiting[sid] -= 1
        if target not in self.assigned:
            return None
        self._handed[sid] = message.message_id
        return message

    async def _apply(self, assignment: pb.CommandScalableConsumerAssignment) -> None:
        async with self._applying:
            if self._closed or assignment.layout_epoch < self.layout_epoch:
                return
            self.layout_epoch = assignment.layout_epoch
            self.assigned = [s.segment_id for s in assignment.segments]
            for sid in [s for s in self._chains if s not in self.assigned]:
                self._chains.pop(sid).cancel()
            layout = self.watch.layout
            if layout is None or layout.epoch < assignment.layout_epoch:
                layout = await self.watch.wait_newer_than(assignment.layout_epoch - 1,
                                                          self._core.config.operation_timeout)
            for sid in self.assigned:
                if sid not in self._chains:
                    self._chains[sid] = asyncio.get_running_loop().create_task(self._chain(layout, sid))

    async def _chain(self, layout: SegmentLayout, sid: int) -> None:
        target = layout.segment(sid)
        try:
            for ancestor in layout.lineage(sid):
                if ancestor.segment_id == sid:
                    break
                if ancestor.hash_range.start <= target.hash_range.end and \
                        target.hash_range.start <= ancestor.hash_range.end:
                    await self._read(ancestor, target, to_end=True)
            await self._read(target, target, to_end=False)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("checkpoint consumer %s, segment %d: %s", self.consumer_name, sid, exc)

    async def _read(self, segment: SegmentInfo, target: SegmentInfo, *, to_end: bool) -> None:
        wanted = (target.hash_range.start, target.hash_range.end)
        start: MessageId = MessageId.earliest
        progress = self._progress.get(segment.segment_id)
        if progress is not None:
            (low, high), last, done = progress
            if low <= wanted[0] and wanted[1] <= high:
                if done:
                    return
                start = last if last is not None else MessageId.earliest
        reader = await self._client.create_reader(segment.topic_name(self.watch.topic_name), start,
                                                  start_message_id_inclusive=start == MessageId.earliest)
        try:
            while True:
                if to_end and not await reader.has_message_available():
                    self._progress[segment.segment_id] = (wanted, self._last(segment.segment_id), True)
                    return
                message = await reader.read_next()
                hash_value = key_hash(message.partition_key) if message.partition_key is not None \
                    else segment.hash_range.start
                self._progress[segment.segment_id] = (wanted, message.message_id, False)
                if target.hash_range.contains(hash_value):
                    self._waiting[segment.segment_id] += 1
                    self._queue.put_nowait((target.segment_id, segment.segment_id, message))
        finally:
            await reader.close()

    def _last(self, sid: int) -> MessageId | None:
        progress = self._progress.get(sid)
        return progress[1] if progress is not None else None

    async def acknowledge(self, message: Message) -> None:
        raise NotAllowedError("a CheckpointConsumer acknowledges nothing: its position is checkpoint()")

    async def close(self) -> None:
        for task in self._chains.values():
            task.cancel()
        await super().close()
