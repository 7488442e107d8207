"""Scalable topics (PIP-468) in the client: a DAG watch, a key-routed producer and a queue consumer.

* `DagWatch` keeps the segment DAG of a `topic://` name current: it opens a DAG watch session
  (SCALABLE_TOPIC_LOOKUP) on a broker of the service URL and applies every update the broker
  pushes; when the connection drops it opens a new session (on the next service address).
* `ScalableProducer` sends each message to the active segment whose hash range holds its key's
  hash (Pulsar's Murmur3, `pyengine.scalable.key_hash`; keyless messages go round robin). A
  segment that was split or merged is terminated before the new layout is published, so a send
  to it fails with TopicTerminated: the producer waits for a newer layout and sends again to
  the child that now owns the key. Each key's messages stay in send order across the parent
  and its children, concurrent sends included (see the class).
* `StreamConsumer` (ordered): registers with the controller leader and consumes the segments
  it is assigned, following each pushed assignment (see the class).
* `CheckpointConsumer`: assigned like a StreamConsumer, reads with readers and keeps its own
  position (`checkpoint()`), for connectors.
* `QueueConsumer` (unordered, individual acks) attaches a Shared consumer to every segment,
  sealed ones included (their backlog is still delivered), and to each new segment the DAG
  brings; a sealed segment is let go once the subscription has no backlog left there (PIP-468:
  "sealed segments keep serving messages until their backlog drains and are then dropped from
  the set"); no controller is involved.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyengine.client.backoff import Backoff
from pyengine.client.consumer import Consumer
from pyengine.client.errors import AlreadyClosedError, ConnectError, SendOutcomeUnknownError
from pyengine.client.handler import FAILED
from pyengine.client.message import Message, MessageId
from pyengine.client.producer import PartitionProducer, Producer, ProducerOptions, _check_message
from pyengine.client.transaction import OPEN, check_same_client
from pyengine.client.url import parse_broker_url
from pyengine.errors import (ConsumerBusyError, NotAllowedError, PulsarError, ServiceNotReadyError,
                             SubscriptionNotFoundError, TooManyRequestsError, TopicNotFoundError,
                             TopicTerminatedError, TransactionConflictError)
from pyengine.naming import TopicName
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command
from pyengine.scalable.layout import HashRange, LayoutError, SegmentInfo, SegmentLayout, key_hash
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


def _drop_queued(queue: asyncio.Queue[Any], dropped: Callable[[Any], bool]) -> None:
    """Remove the items of `queue` that `dropped` selects (markers such as _CLOSED stay)."""
    kept = []
    while True:
        try:
            item = queue.get_nowait()
        except asyncio.QueueEmpty:
            break
        if item is _CLOSED or item is _ENDED or not dropped(item):
            kept.append(item)
    for item in kept:
        queue.put_nowait(item)


def _follow_redeliveries(consumer: Consumer, queue: asyncio.Queue[Any], is_its: Callable[[Any], bool]) -> None:
    """When messages segment consumer `consumer` delivered come again (a reconnect, a
    redeliver-all, a broker's rewind after an abort, a nack), its copies already moved into the
    scalable consumer's `queue` (the items `is_its` selects; a message is an item's last
    element) are dropped with its own, as the pattern consumer's buffer: else those come twice."""
    def drop_queued_too(handler: Any, coming_again: Callable[[MessageId], bool] | None) -> None:
        _drop_queued(queue, lambda item: is_its(item)
                     and (coming_again is None or coming_again(item[-1].message_id)))

    consumer.on_entries_coming_again = drop_queued_too


# Queued by close(): wakes the receive() calls waiting on a scalable consumer's queue, which
# then raise AlreadyClosedError (each puts it back for the next one), as a Consumer's do.
_CLOSED = object()


async def _next_queued(queue: asyncio.Queue[Any], remaining: float | None, timeout: float | None) -> Any:
    """The next item of a scalable consumer's queue, waiting at most `remaining` s (None: no
    limit). One queued already is taken even with no time left, as Consumer.receive does
    (asyncio.wait_for with 0 cancels the get before it runs: receive(timeout=0) got nothing)."""
    with contextlib.suppress(asyncio.QueueEmpty):
        return queue.get_nowait()
    if remaining is not None and remaining <= 0:
        raise TimeoutError(f"no message within {timeout}s")
    return await asyncio.wait_for(queue.get(), remaining)


# A QueueConsumer's checks of a sealed segment's backlog: at once after an ack of one of its
# messages here, else polled, backing off from DRAIN_POLL to DRAIN_POLL_MAX seconds.
DRAIN_POLL = 0.1
DRAIN_POLL_MAX = 5.0


async def _subscription_backlog(consumer: Consumer, timeout: float) -> int | None:
    """The subscription's backlog on the (non-partitioned) topic of `consumer`: msgBacklog of
    a CONSUMER_STATS request — the entries after the mark-delete position not acknowledged yet,
    whichever consumer holds them. None when the broker's answer does not say."""
    (handler,) = consumer._handlers.values()
    connection = await handler._connected()
    cmd = base_command(pb.BaseCommand.CONSUMER_STATS, consumer_id=handler.consumer_id,
                       request_id=connection.new_request_id())
    response = await connection.request(cmd, timeout)
    return response.msgBacklog if response.HasField("msgBacklog") else None


_session_ids = itertools.count(1)
# what opening a DAG watch tries again (another connection) within the operation timeout
_RETRYABLE = (ConnectError, ServiceNotReadyError, TooManyRequestsError)
# A registration refused for good: its topic (or subscription) deleted meanwhile. (NotAllowed
# is not: a controller that is not, or no longer, the leader answers with it.)
_REGISTRATION_ENDED = (SubscriptionNotFoundError, TopicNotFoundError)


async def retry(core: ClientCore, attempt: Callable[[], Awaitable[None]], stopped: Callable[[], bool],
                what: str, final: tuple[type[Exception], ...] = ()) -> None:
    """Run `attempt` until it succeeds or `stopped()`, backing off between failures; the
    errors in `final` end the retrying (raised)."""
    backoff = Backoff(core.config.initial_backoff, core.config.max_backoff)
    while not stopped():
        try:
            await attempt()
            return
        except (asyncio.CancelledError, AlreadyClosedError):
            return
        except final:
            raise
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
        self._reopen: asyncio.Task | None = None
        self._closed = False

    async def start(self) -> DagWatch:
        """Open the session; a connection that drops (or cannot be made) before the first
        update is replaced, within the operation timeout. On failure nothing is left open."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.core.config.operation_timeout
        backoff = Backoff(self.core.config.initial_backoff, self.core.config.max_backoff)
        while True:
            try:
                await self._open(max(deadline - loop.time(), 0.001))
                return self
            except _RETRYABLE as exc:
                delay = backoff.next()
                if loop.time() + delay >= deadline:
                    await self.close()
                    raise TimeoutError(f"opening the DAG watch of {self.topic}: {exc}") from exc
                await asyncio.sleep(delay)
            except BaseException:
                await self.close()
                raise

    async def _open(self, timeout: float | None = None) -> None:
        """One session on one connection: established once its first update is applied (then
        the connection's closing re-opens it); an error, a timeout or the connection closing
        first leaves nothing behind."""
        loop = asyncio.get_running_loop()
        connection = await self.core.pool.get(self.core.lookup.service_address())
        session_id = next(_session_ids)
        first: asyncio.Future[None] = loop.create_future()
        connection.dag_sessions[session_id] = \
            lambda update: self._on_update(connection, session_id, first, update)
        connection.send_command(base_command(pb.BaseCommand.SCALABLE_TOPIC_LOOKUP, session_id=session_id,
                                             topic=self.topic))
        try:
            await asyncio.wait([first, connection.closed], timeout=timeout or self.core.config.operation_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            if first.done():
                first.result()                              # an error update raises here
            if connection.closed.done():
                raise ConnectError(f"the connection closed while opening the DAG watch of {self.topic}")
            if not first.done():
                raise TimeoutError(f"no DAG of {self.topic} from {connection.address.logical}")
            if session_id not in connection.dag_sessions:
                # ended right behind its first update (an error, an invalid DAG), before this
                # resumed, so not re-opened then: kept, it would never bring a change again
                raise ConnectError(f"the DAG watch session of {self.topic} ended as it opened")
        except BaseException:
            answered = first.done() and not first.cancelled() and first.exception() is not None
            if connection.dag_sessions.pop(session_id, None) is not None and not answered and connection.usable:
                connection.send_command(base_command(pb.BaseCommand.SCALABLE_TOPIC_CLOSE, session_id=session_id))
            raise
        if self._closed:                                    # closed while this was opening
            connection.dag_sessions.pop(session_id, None)
            connection.send_command(base_command(pb.BaseCommand.SCALABLE_TOPIC_CLOSE, session_id=session_id))
            raise AlreadyClosedError(f"the DAG watch of {self.topic} is closed")
        self._connection, self._session_id = connection, session_id
        connection.add_close_listener(self._connection_closed)

    def _on_update(self, connection: ClientConnection, session_id: int, first: asyncio.Future[None],
                   update: pb.CommandScalableTopicUpdate) -> None:
        if update.HasField("error"):
            error = PulsarError.from_code(update.error, update.message)
            connection.dag_sessions.pop(session_id, None)
            if not first.done():
                first.set_exception(error)
            elif isinstance(error, TopicNotFoundError):
                log.warning("DAG watch of %s ended: %s", self.topic, update.message)
            else:
                # The broker's session failed (a metadata-store error): a new one is opened, or
                # every later change of the DAG would be missed (PIP-468: every change is pushed).
                self._session_failed(connection, update.message)
            return
        try:
            layout, controller, brokers = dag_to_layout(update.dag)
        except LayoutError as exc:
            # A DAG this client cannot read: routed by, it would send keys to wrong segments;
            # dropped, the layout before it would be kept until the next change (maybe never).
            # The session ends: an opening fails with the error, an open watch opens it again.
            error = LayoutError(f"the DAG of {self.topic} from {connection.address.logical} is invalid: {exc}")
            if connection.dag_sessions.pop(session_id, None) is not None and connection.usable:
                connection.send_command(base_command(pb.BaseCommand.SCALABLE_TOPIC_CLOSE, session_id=session_id))
            if not first.done():
                first.set_exception(error)
            else:
                self._session_failed(connection, str(error))
            return
        if self.layout is None or layout.epoch >= self.layout.epoch:
            self.layout, self.controller_url, self.segment_brokers = layout, controller, brokers
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
            for listener in list(self.listeners):
                try:
                    listener(layout)
                except Exception:
                    log.exception("DAG listener failed")
        if not first.done():
            first.set_result(None)

    def _session_failed(self, connection: ClientConnection, reason: str) -> None:
        """The established session on `connection` ended on the broker's or this side: open another."""
        if self._closed or connection is not self._connection:
            return
        log.warning("DAG watch of %s failed (%s): opening it again", self.topic, reason)
        self._connection = None
        self._reopen = asyncio.get_running_loop().create_task(self._reopen_loop())

    def _connection_closed(self, connection: ClientConnection) -> None:
        if self._closed or connection is not self._connection:
            return
        self._connection = None
        connection.dag_sessions.pop(self._session_id, None)
        self._reopen = asyncio.get_running_loop().create_task(self._reopen_loop())

    async def _reopen_loop(self) -> None:
        try:
            await retry(self.core, self._open, lambda: self._closed, f"re-opening the DAG watch of {self.topic}",
                        final=(TopicNotFoundError,))
        except TopicNotFoundError as exc:               # deleted meanwhile: nothing to follow
            log.warning("DAG watch of %s ended: %s", self.topic, exc)

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
        if connection is not None:
            connection.remove_close_listener(self._connection_closed)
        if connection is not None and connection.dag_sessions.pop(self._session_id, None) is not None \
                and connection.usable:
            connection.send_command(base_command(pb.BaseCommand.SCALABLE_TOPIC_CLOSE, session_id=self._session_id))


REPUMP_S = 0.1      # a waiting send of a ScalableProducer looks again this often


@dataclass(eq=False, slots=True)
class _Turn:
    """A send of a ScalableProducer waiting for its turn (see ScalableProducer)."""

    order: int                          # the send's place in the producer's send order
    key: str | None
    ready: asyncio.Future[None]


def _is_active(segment: SegmentInfo | None) -> bool:
    return segment is not None and segment.is_active


def _queues_at_once(part: PartitionProducer) -> bool:
    """Whether `part` queues a send handed to it now at once, taking its place in the segment's
    send order. A full queue (block_if_queue_full) keeps a send waiting for room, unqueued, and
    any send waits, held unqueued, behind the messages held there (`submit_in_txn`)."""
    if part._held:
        return False
    return not (part.options.block_if_queue_full and part.queue_full)


async def _room_in(part: PartitionProducer) -> None:
    """Wait until `part` queues a send at once (see `_queues_at_once`); a full queue that does
    not block raises ProducerQueueIsFullError, as the send would."""
    while True:
        submitter = part._held_submitter
        if part._held and submitter is not None:
            await asyncio.wait([submitter])     # it submits what is held, then ends
        elif part.queue_full:
            await part.wait_for_space()
        else:
            return


class ScalableProducer:
    """Sends to the active segment owning each key; re-routes after splits and merges.

    A key's messages are stored in send order, across segments too: read parent first, then
    child (as ordered consumers read), they come in the order the sends were made — sends
    made concurrently included. A split or merge terminates the parent before the new layout
    is published, so a send in flight there is stored (before the termination) or refused
    with TopicTerminated (after), and the new layout may reach the producer before or after
    the refusals. Hence a parent that refuses a send, or that a new layout seals while sends
    to it are in flight, *drains*: until every send routed to it has its outcome and the
    layout shows it sealed, the sends of keys in its range wait (`_Turn`s, per key in send
    order, the refused ones back at their place); then they go, one after the other for each
    key, to the segment the layout gives them. Nothing of this runs while nothing drains: a
    send then goes straight to its segment's producer — unless that producer cannot queue it
    at once (its queue full, or, for a transactional send, transactional messages held there
    unqueued): it then holds a turn until queued, so the key's next sends, transactional or
    not, do not overtake it there.

    A send refused for another reason fails; one whose outcome is unknown (its connection
    broke, then the segment was found terminated) fails with SendOutcomeUnknownError rather
    than being stored a second time in the child.
    """

    def __init__(self, client: Client, watch: DagWatch, producer_options: dict[str, Any]) -> None:
        self._client = client
        self.watch = watch
        self._options = producer_options
        # how long a send waits for draining segments: its send timeout, as a Pulsar producer's
        # pending send (None: send_timeout_ms=0, no limit)
        send_timeout_ms = ProducerOptions(**producer_options).send_timeout_ms
        self._send_timeout: float | None = send_timeout_ms / 1000 if send_timeout_ms > 0 else None
        self._producers: dict[int, Producer] = {}
        self._opening: dict[int, asyncio.Future[Producer]] = {}
        self._round_robin = itertools.count()
        self._closed = False
        self._orders = itertools.count()
        # segment id -> the sends routed to it whose outcome is not handled yet
        self._inflight: dict[int, int] = {}
        # segments that refused a send or that the layout sealed with sends in flight, until
        # those are all settled and the layout shows them sealed
        self._draining: set[int] = set()
        # the sends waiting for their turn, per key (None: keyless ones), in send order
        self._waiting: dict[str | None, list[_Turn]] = {}
        self._stale: dict[int, list[Producer]] = {}     # producers of draining segments
        self._tasks: set[asyncio.Task] = set()
        watch.listeners.append(self._layout_changed)

    @property
    def topic(self) -> str:
        return self.watch.topic

    def _segment_for(self, layout: SegmentLayout, key: str | None) -> SegmentInfo:
        if key is not None:
            return layout.segment_for_key(key)
        active = layout.active_segments
        return active[next(self._round_robin) % len(active)]

    async def _producer(self, segment: SegmentInfo) -> Producer:
        """The producer of `segment`, opened once for all its senders. The opening is not any
        sender's: one cancelled meanwhile (the first included) leaves it to finish and be stored
        for the next senders, rather than dropping an open producer that nothing closes."""
        sid = segment.segment_id
        producer = self._producers.get(sid)
        if producer is not None:
            return producer
        opening = self._opening.get(sid)
        if opening is None:
            opening = asyncio.get_running_loop().create_task(self._open_producer(segment))
            self._opening[sid] = opening
            self._tasks.add(opening)                # close() waits for it
            opening.add_done_callback(self._opened)
        return await asyncio.shield(opening)

    async def _open_producer(self, segment: SegmentInfo) -> Producer:
        sid = segment.segment_id
        try:
            producer = await self._client.create_producer(segment.topic_name(self.watch.topic_name), **self._options)
        finally:
            del self._opening[sid]
        if self._closed:                            # closed while it opened: close() did not see it
            await producer.close()
            raise AlreadyClosedError(f"the producer on {self.topic} is closed")
        self._producers[sid] = producer
        return producer

    def _opened(self, opening: asyncio.Task[Producer]) -> None:
        self._tasks.discard(opening)
        if not opening.cancelled():
            opening.exception()                     # retrieved: its senders may all be gone

    async def send(self, data: bytes, *, key: str | None = None, properties: dict[str, str] | None = None,
                   txn: Transaction | None = None) -> tuple[int, MessageId]:
        """Send one message; (segment id, message id in that segment). `txn`: a scalable
        (v5) transaction; a send re-routed after a split stays in it (PIP-473: the decision
        lives above the segments, sealed ones included). The transaction tracks the send as
        one operation settled with its outcome — the attempt that a sealed parent refused was
        not stored and is no failed operation of it; the one sent again to the child is (and
        a send of unknown outcome fails the commit)."""
        # checked before the key is routed: key_hash takes bytes(key) of anything, so an int key
        # was hashed (bytes(10**12) allocates 1 TB) or refused with another error than a Producer's
        data, properties = _check_message(data, key, properties, None, None, txn)
        if txn is None:
            return await self._send(data, key, properties, None)
        check_same_client(txn, self._client._core.coordinator)
        if txn.state != OPEN:
            txn._check_open()
        operation: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        txn._track(operation)                   # from now on a commit waits for this send
        try:
            sent = await self._send(data, key, properties, txn)
        except asyncio.CancelledError:
            operation.cancel()                  # as a cancelled send of a Producer: the commit fails
            raise
        except BaseException as exc:
            operation.set_exception(exc)
            operation.exception()               # raised to the caller here; the commit reads it again
            raise
        operation.set_result(sent[1])
        return sent

    async def _send(self, data: bytes, key: str | None, properties: dict[str, str] | None,
                    txn: Transaction | None) -> tuple[int, MessageId]:
        """`send`, `data`, `key` and `properties` checked; with `txn`, each attempt is sent
        untracked by the transaction (`send` tracks the logical send)."""
        order = next(self._orders)
        turn: _Turn | None = None
        inflight = self._inflight
        try:
            while True:
                if self._closed:
                    raise AlreadyClosedError(f"the producer on {self.topic} is closed")
                if turn is None and (self._waiting or self._draining):
                    # held here from the start: the `finally` below takes it out of the queue
                    # whatever ends the send (a cancel or timeout while it waits included)
                    turn = self._queue(order, key)
                if turn is not None:
                    await self._take_turn(turn, key)
                    if self._closed:
                        raise AlreadyClosedError(f"the producer on {self.topic} is closed")
                layout = self.watch.layout
                assert layout is not None
                segment = self._segment_for(layout, key)
                sid = segment.segment_id
                inflight[sid] = inflight.get(sid, 0) + 1
                submitted: Producer | None = None
                failed_already = False
                try:
                    producer = self._producers.get(sid)
                    if producer is None:
                        producer = await self._producer(segment)    # TopicTerminated here: not sent
                    part = producer._partitions[0]
                    # failed before this send (its reconnect found the segment terminated):
                    # refused unsent, so re-routed like a send the sealed segment refused
                    failed_already = part.state == FAILED
                    if turn is None and not _queues_at_once(part):
                        # it would wait in the segment's producer, unqueued: the key's next sends
                        # wait behind it (a turn, the key's first), rather than overtake it there
                        turn = self._wait(order, key)
                    if turn is None:
                        submitted = producer
                        if txn is None:
                            return sid, await producer.send(data, key=key, properties=properties)
                        return sid, await producer._send_in_txn_untracked(data, key, properties, txn)
                    # its turn: queued in the segment's producer now, then the key's next send may go
                    await _room_in(part)
                    sent = producer.send_async(data, key=key, properties=properties) if txn is None \
                        else producer._send_in_txn_untracked(data, key, properties, txn)
                    submitted = producer
                    self._done_waiting(turn)
                    turn = None
                    return sid, await sent
                except TopicTerminatedError as exc:
                    self._terminated(sid)
                    if submitted is not None and not failed_already and submitted._partitions[0].state == FAILED:
                        # failed on reconnecting, what was pending with it: stored or not, unknown
                        raise SendOutcomeUnknownError(
                            f"a send to {segment.topic_name(self.watch.topic_name)} may or may not be stored: "
                            f"its connection broke, then the segment was found terminated ({exc})") from exc
                    # refused (not stored): it waits at its place in the key's order (before the
                    # drain can end below)
                    if turn is None:
                        turn = self._wait(order, key)
                    else:
                        turn.ready = asyncio.get_running_loop().create_future()
                finally:
                    count = inflight[sid] - 1
                    if count:
                        inflight[sid] = count
                    else:
                        del inflight[sid]
                        if self._draining:
                            self._drained()
        finally:
            if turn is not None:
                self._done_waiting(turn)

    # --- re-routing in order ----------------------------------------------------------------

    def _queue(self, order: int, key: str | None) -> _Turn | None:
        """A turn for send `order` if something holds it back: a draining segment holds its key
        (a keyless send: the layout shows a draining segment active) or an earlier send of its
        key waits. None: it may go at once."""
        if (key is None or key not in self._waiting) and not self._gated(key):
            return None
        turn = self._wait(order, key)
        self._pump(key)
        return turn

    async def _take_turn(self, turn: _Turn, key: str | None) -> None:
        """Wait until the send of `turn` may go: nothing holds its key back and it is the key's
        first waiting send. Its turn stays in the queue (it leaves it once queued in its
        segment's producer, and the key's next send may go)."""
        loop = asyncio.get_running_loop()
        timeout = self._send_timeout
        deadline = loop.time() + timeout if timeout is not None else float("inf")
        while True:
            while not turn.ready.done() and loop.time() < deadline:
                await asyncio.wait([turn.ready], timeout=min(REPUMP_S, max(deadline - loop.time(), 0)))
                if not turn.ready.done():
                    if not self._draining and timeout is not None:
                        # only behind the key's earlier send, waiting for room in its segment's
                        # producer: as a send blocked there, no deadline (the timeout is the drains')
                        deadline = loop.time() + timeout
                    # Ask again: a wake-up this send missed must not hold it (and its key) until
                    # the timeout; the pump lets only the key's first send go, and only if no
                    # draining segment holds the key back.
                    self._pump(key)
            if not turn.ready.done():
                assert timeout is not None                      # (no deadline without it)
                raise TimeoutError(f"a send to {self.topic} waited send_timeout_ms={timeout * 1000:.0f} for segments "
                                   f"{sorted(self._draining)} to be sealed and drained")
            turn.ready.result()                                 # AlreadyClosedError once closed
            if not self._gated(key) and (key is None or self._waiting[key][0] is turn):
                return
            turn.ready = loop.create_future()        # held back again (a segment refused meanwhile)

    def _wait(self, order: int, key: str | None) -> _Turn:
        """A turn for send `order` of `key`, at its place among the key's waiting sends."""
        turn = _Turn(order, key, asyncio.get_running_loop().create_future())
        bisect.insort(self._waiting.setdefault(key, []), turn, key=lambda t: t.order)
        return turn

    def _done_waiting(self, turn: _Turn) -> None:
        turns = self._waiting.get(turn.key)
        if turns is None or not any(t is turn for t in turns):
            return
        turns.remove(turn)
        if turns:
            self._pump(turn.key)
        else:
            del self._waiting[turn.key]

    def _pump(self, key: str | None) -> None:
        """Let the first waiting send of `key` go if nothing holds it back (keyless: all)."""
        turns = self._waiting.get(key)
        if not turns or self._gated(key):
            return
        for turn in (turns if key is None else turns[:1]):
            if not turn.ready.done():
                turn.ready.set_result(None)

    def _gated(self, key: str | None) -> bool:
        """Whether a draining segment holds back the sends of `key`: one whose range holds
        the key's hash (the key's segment, or one it descends from); for keyless sends, one
        the layout still shows active (they may go to any active segment but that)."""
        draining = self._draining
        if not draining:
            return False
        segments = self.watch.layout.all_segments
        if key is None:
            return any(_is_active(segments.get(sid)) for sid in draining)
        hash_value = key_hash(key)
        for sid in draining:
            segment = segments.get(sid)
            if segment is None or segment.hash_range.contains(hash_value):
                return True
        return False

    def _terminated(self, sid: int) -> None:
        """Segment `sid` is terminated: it drains (see the class); its producer (one opened
        meanwhile too) is closed once it has drained."""
        self._draining.add(sid)
        producer = self._producers.pop(sid, None)
        if producer is not None:
            self._stale.setdefault(sid, []).append(producer)

    def _drained(self, pump: bool = False) -> None:
        """End the drain of the segments whose sends are all settled and that the layout shows
        sealed; what waited for them may go."""
        segments = self.watch.layout.all_segments
        done = [sid for sid in self._draining if sid not in self._inflight and not _is_active(segments.get(sid))]
        for sid in done:
            self._draining.discard(sid)
            stale = self._stale.pop(sid, [])
            late = self._producers.pop(sid, None)           # opened as it was sealed
            for producer in (*stale, *([late] if late is not None else [])):
                task = asyncio.get_running_loop().create_task(self._close_stale(producer))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        if done or pump:
            for key in list(self._waiting):
                self._pump(key)

    def _layout_changed(self, layout: SegmentLayout) -> None:
        """A new layout (DAG watch): a segment it seals with sends in flight drains (a later
        send of its keys to a child waits for their outcome); drains may end. The producer of
        a sealed segment with nothing in flight is closed at once (kept, it stayed attached to
        the sealed segment, and reconnected to it after every broker restart, for good)."""
        for sid in {*self._inflight, *self._producers}:
            if sid not in self._draining and not _is_active(layout.all_segments.get(sid)):
                self._terminated(sid)
        if self._draining or self._waiting:
            self._drained(pump=True)

    @staticmethod
    async def _close_stale(producer: Producer) -> None:
        try:
            await producer.close()
        except Exception as exc:
            log.info("closing the producer of a sealed segment: %s", exc)

    async def close(self) -> None:
        self._closed = True
        with contextlib.suppress(ValueError):
            self.watch.listeners.remove(self._layout_changed)
        for turns in self._waiting.values():
            for turn in turns:
                if not turn.ready.done():
                    turn.ready.set_exception(AlreadyClosedError(f"the producer on {self.topic} is closed"))
        producers = [*self._producers.values(), *(p for stale in self._stale.values() for p in stale)]
        self._producers.clear()
        self._stale.clear()
        for producer in producers:
            await producer.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        await self.watch.close()
        self._client._core.forget(self)  # type: ignore[arg-type]


class QueueConsumer:
    """Shared consumers on the segments of the topic; messages in arrival order across them.

    PIP-468 (Consumer Assignment): a queue consumer attaches to every segment, active and
    sealed, and "sealed segments keep serving messages until their backlog drains and are then
    dropped from the set". So a segment the DAG brings is attached in the background (an attach
    that fails is retried, backing off, until it succeeds, the segment leaves the layout or the
    consumer closes; one attach per segment at a time), and an attached segment that is sealed
    is watched until it is drained, then let go: its consumer is closed and `segments` no longer
    lists it; it is not attached again.

    Drained means the subscription has no backlog left on the sealed segment: the broker's
    msgBacklog there (CONSUMER_STATS on the segment's consumer, the figure the controller
    itself uses for StreamConsumers) is 0. A sealed segment takes no new message, so that is
    final: every message of it was acknowledged, by this consumer or another one of the
    subscription (an open transaction's messages count as backlog until it ends). A message
    not acknowledged yet — held by the application here, or by another consumer — keeps the
    segment attached, so it stays ackable here and is redelivered (here too) if its consumer
    goes away. The backlog is asked for when the segment is found sealed, after each
    acknowledgement of one of its messages here, and otherwise polled (the subscription's other
    consumers acknowledge too), backing off from DRAIN_POLL to DRAIN_POLL_MAX seconds.
    Acknowledging a message of a segment let go is a no-op (it is acknowledged already), and a
    message of it still queued here is not handed out (it was acknowledged elsewhere).
    A segment pruned from the layout is let go as well.

    The background tasks kept are the live ones: one forwarding task per attached segment, one
    drain watch per attached sealed segment, and the attaches under way."""

    def __init__(self, client: Client, watch: DagWatch, subscription: str, options: dict[str, Any]) -> None:
        self._client = client
        self.watch = watch
        self.subscription = subscription
        self._options = options
        self._consumers: dict[int, Consumer] = {}
        self._queue: asyncio.Queue[tuple[int, Message]] = asyncio.Queue()
        self._tasks: set[asyncio.Task] = set()             # live background tasks only
        self._attaching: dict[int, asyncio.Task] = {}      # segment id -> its attach under way
        self._forwarding: dict[int, asyncio.Task] = {}     # segment id -> its forwarding task
        self._draining: dict[int, asyncio.Task] = {}       # sealed segment id -> its drain watch
        self._acked: dict[int, asyncio.Event] = {}         # sealed segment id -> set on an ack here
        self._dropped: set[int] = set()                    # segments let go: drained (or pruned)
        self._closed = False

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _start(self) -> None:
        """Attach every segment of the current layout (a failure here is raised: the caller
        closes the consumer); later layouts are followed in the background."""
        self.watch.listeners.append(self._on_layout)
        layout = self.watch.layout
        if layout is None:
            return
        for segment in sorted(layout.all_segments.values(), key=lambda s: s.segment_id):
            sid = segment.segment_id
            if sid in self._consumers or sid in self._attaching or sid in self._dropped:
                continue
            task = self._spawn(self._attach(segment))
            self._attaching[sid] = task
            try:
                await task
            finally:
                if self._attaching.get(sid) is task:
                    del self._attaching[sid]

    def _on_layout(self, layout: SegmentLayout) -> None:
        if self._closed:
            return
        for segment in sorted(layout.all_segments.values(), key=lambda s: s.segment_id):
            sid = segment.segment_id
            if sid not in self._consumers and sid not in self._attaching and sid not in self._dropped:
                self._attaching[sid] = self._spawn(self._attach_retrying(segment))
        for sid in list(self._consumers):
            if sid not in layout.all_segments:
                self._spawn(self._drop(sid))               # pruned: nothing left to read there
            elif not layout.segment(sid).is_active:
                self._watch_drain(sid)

    async def _attach_retrying(self, segment: SegmentInfo) -> None:
        sid = segment.segment_id
        try:
            await retry(self._client._core, lambda: self._attach(segment),
                        lambda: self._closed or sid in self._consumers or sid in self._dropped
                        or not self._in_layout(sid),
                        f"queue consumer of {self.watch.topic} attaching segment {sid}")
        finally:
            if self._attaching.get(sid) is asyncio.current_task():
                del self._attaching[sid]

    def _in_layout(self, sid: int) -> bool:
        layout = self.watch.layout
        return layout is None or sid in layout.all_segments

    def _sealed(self, sid: int) -> bool:
        layout = self.watch.layout
        return layout is not None and sid in layout.all_segments and not layout.segment(sid).is_active

    async def _attach(self, segment: SegmentInfo) -> None:
        sid = segment.segment_id
        consumer = await self._client.subscribe(
            segment.topic_name(self.watch.topic_name), self.subscription, consumer_type="shared",
            initial_position="earliest", **self._options)
        if self._closed or sid in self._consumers or sid in self._dropped:
            await consumer.close()
            return
        self._consumers[sid] = consumer
        _follow_redeliveries(consumer, self._queue, lambda item: item[0] == sid)
        self._forwarding[sid] = self._spawn(_forward(
            consumer, lambda: self._closed, lambda message: self._queue.put_nowait((sid, message)),
            f"queue consumer of {self.watch.topic}, segment {sid}"))
        if self._sealed(sid):                              # sealed already, or since `segment`
            self._watch_drain(sid)

    def _watch_drain(self, sid: int) -> None:
        """Watch attached sealed segment `sid` until it is drained (once)."""
        if self._closed or sid in self._draining or sid not in self._consumers:
            return
        self._acked[sid] = asyncio.Event()
        self._draining[sid] = self._spawn(self._drain_watch(sid, self._consumers[sid], self._acked[sid]))

    async def _drain_watch(self, sid: int, consumer: Consumer, acked: asyncio.Event) -> None:
        core = self._client._core
        delay = DRAIN_POLL
        try:
            while not self._closed and self._consumers.get(sid) is consumer:
                try:
                    backlog = await _subscription_backlog(consumer, core.config.operation_timeout)
                except (asyncio.CancelledError, AlreadyClosedError):
                    return
                except Exception as exc:
                    log.info("queue consumer of %s: no backlog of sealed segment %d yet: %s",
                             self.watch.topic, sid, exc)
                    backlog = None
                if backlog == 0 and not self._closed and self._consumers.get(sid) is consumer:
                    log.info("queue consumer of %s: sealed segment %d is drained, letting it go",
                             self.watch.topic, sid)
                    await self._drop(sid)
                    return
                try:
                    await asyncio.wait_for(acked.wait(), delay)
                    delay = DRAIN_POLL                     # an ack here: ask again at once
                except TimeoutError:
                    delay = min(delay * 2, DRAIN_POLL_MAX)
                acked.clear()
        finally:
            if self._draining.get(sid) is asyncio.current_task():
                del self._draining[sid]
                self._acked.pop(sid, None)

    async def _drop(self, sid: int) -> None:
        """Let segment `sid` go: no longer listed, read, attached again or acknowledged on."""
        consumer = self._consumers.pop(sid, None)
        if consumer is None:
            return
        self._dropped.add(sid)
        self._acked.pop(sid, None)
        forwarding = self._forwarding.pop(sid, None)
        if forwarding is not None:
            forwarding.cancel()
        draining = self._draining.pop(sid, None)
        if draining is not None and draining is not asyncio.current_task():
            draining.cancel()
        await asyncio.shield(consumer.close())             # closed even if this task is cancelled

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message of a segment read here (`message.topic` names its segment)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._closed:
                raise AlreadyClosedError(f"the queue consumer of {self.watch.topic} is closed")
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            queued = await _next_queued(self._queue, remaining, timeout)
            if queued is _CLOSED:
                self._queue.put_nowait(_CLOSED)            # for every other receive waiting
                continue
            sid, message = queued
            if sid not in self._dropped:                   # else acknowledged already (elsewhere)
                return message

    async def acknowledge(self, message: Message, txn: Transaction | None = None) -> None:
        """Acknowledge `message` on its segment (in `txn`, a scalable transaction, if given).
        A message of a sealed segment let go is acknowledged already: nothing to do, but in a
        transaction TransactionConflictError, as the broker answers an ack of a message
        acknowledged before (accepted, the transaction would commit the processing of a
        message another consumer processed too: a batch entry given back by an abort can be
        at two consumers at once)."""
        try:
            segment_id = TopicName.parse(message.topic).segment_id
        except (AttributeError, ValueError):
            raise ValueError("not a message received from a scalable topic's segment") from None
        if txn is not None:
            check_same_client(txn, self._client._core.coordinator)
        consumer = self._consumers.get(segment_id)
        if consumer is None:
            if segment_id in self._dropped:
                if txn is not None:
                    error = TransactionConflictError(
                        f"{message.message_id} of segment {segment_id} was acknowledged already (the sealed segment "
                        f"is drained): {txn.txn_id} cannot acknowledge it")
                    txn._track_failure(error)           # the commit fails with it too
                    raise error
                return
            raise ValueError(f"not a message of this consumer's segments ({message.topic})")
        await consumer.acknowledge(message, txn=txn)
        acked = self._acked.get(segment_id)
        if acked is not None:
            acked.set()

    async def redeliver_unacknowledged_messages(self) -> None:
        """Have every segment send again what it sent here and is not acknowledged (as
        Consumer's: after a transaction's abort released its acks, the only way short of a
        close to get them again). What is queued here is dropped first: it comes again."""
        if self._closed:
            raise AlreadyClosedError(f"the queue consumer of {self.watch.topic} is closed")
        for consumer in list(self._consumers.values()):      # (the queued copies go too)
            await consumer.redeliver_unacknowledged_messages()

    @property
    def segments(self) -> list[int]:
        """The ids of the segments read here: every active segment, and each sealed one until
        it is drained on the subscription (see the class)."""
        return sorted(self._consumers)

    async def close(self) -> None:
        self._closed = True
        self._queue.put_nowait(_CLOSED)                    # the receives waiting end now
        if self._on_layout in self.watch.listeners:
            self.watch.listeners.remove(self._on_layout)
        for task in list(self._tasks):
            task.cancel()
        for consumer in list(self._consumers.values()):
            await consumer.close()
        self._consumers.clear()
        self._forwarding.clear()
        self._draining.clear()
        self._acked.clear()
        await self.watch.close()
        self._client._core.forget(self)  # type: ignore[arg-type]


_ENDED = object()            # queued once the controller ended a StreamConsumer's registration


class StreamConsumer:
    """An ordered consumer of a scalable topic: registers with the controller leader (the DAG
    names it), consumes exactly the segments it is assigned (an Exclusive subscription on each),
    and follows every pushed assignment. The controller hands a split's children out only once
    the parent is drained, so each key's messages arrive in the order they were sent, provided
    messages are acknowledged (a parent's unacknowledged messages hold its children back).
    When the connection to the controller drops, it registers again (with the same name: within
    the grace period it keeps its segments). When its subscription (or topic) is deleted the
    controller unregisters it: it stops reading, and receive() raises SubscriptionNotFoundError
    (TopicNotFoundError) once what it had queued is handed out."""

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
        self._assignment: pb.CommandScalableConsumerAssignment | None = None   # the latest applied
        # The latest assignment to arrive, answers and pushes alike: only it is applied, each
        # being whole (a push of the same layout epoch can arrive right after a registration's
        # answer, and its apply task run before the registering task: the answer is then stale).
        self._arrived: pb.CommandScalableConsumerAssignment | None = None
        self._retrying: asyncio.Task | None = None
        self._closed = False
        self._ended: PulsarError | None = None      # why the controller ended the registration

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _register(self) -> None:
        """Register with the controller leader, within the operation timeout. A connection
        that drops (or cannot be made) before the answer is replaced at once, backing off, as a
        Consumer's subscribe is: the connection becomes `_connection` only once registered, so
        its close starts no second registration beside this one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._core.config.operation_timeout
        backoff = Backoff(self._core.config.initial_backoff, self._core.config.max_backoff)
        while True:
            url = self.watch.controller_url
            # no leader yet (no broker was asked about the topic): any broker stands for election
            address = parse_broker_url(url) if url is not None else self._core.lookup.service_address()
            try:
                connection = await self._core.pool.get(address)
                answer = await self._ask(connection, deadline)
            except ConnectError as exc:
                if self._closed:
                    raise AlreadyClosedError(f"stream consumer {self.consumer_name} is closed") from exc
                delay = backoff.next()
                if loop.time() + delay >= deadline:
                    raise TimeoutError(f"stream consumer {self.consumer_name} not registered within the "
                                       f"operation timeout: {exc}") from exc
                log.info("stream consumer %s: %s; registering again in %.2fs", self.consumer_name, exc, delay)
                await asyncio.sleep(delay)
                continue
            if not answer.HasField("error"):
                self._connection = connection
                await self._apply(answer, strict=True)
                return
            error = PulsarError.from_code(answer.error, answer.message)
            if "not the controller leader" not in answer.message or loop.time() > deadline:
                raise error
            try:                                   # the DAG will name the new leader
                await self.watch.wait_changed(self._core.config.initial_backoff * 5)
            except TimeoutError:
                pass

    async def _ask(self, connection: ClientConnection, deadline: float) -> pb.CommandScalableConsumerAssignment:
        """Send one registration on `connection`; the controller's answer. ConnectError when the
        connection closes first (the answer is not a request the connection fails on closing)."""
        connection.scalable_consumers[self.consumer_id] = self._on_assignment
        connection.add_close_listener(self._connection_closed)
        self._request_id = connection.new_request_id()
        self._answer = answer = asyncio.get_running_loop().create_future()
        connection.send_command(base_command(
            pb.BaseCommand.SCALABLE_CONSUMER_REGISTER, request_id=self._request_id, consumer_id=self.consumer_id,
            topic=self.watch.topic, subscription=self.subscription, consumer_name=self.consumer_name))
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.wait([answer, connection.closed], return_when=asyncio.FIRST_COMPLETED)
            if not connection.usable:              # (answered too: that session is disconnected now)
                raise ConnectError(f"the connection to {connection.address.logical} closed while registering")
            result = answer.result()
            if self._closed and not result.HasField("error"):
                raise AlreadyClosedError(f"stream consumer {self.consumer_name} is closed")
        except BaseException:
            # Given up (or closed meanwhile): the controller may register it still, for nobody
            # (a closed connection's registrations are disconnected by the broker).
            if connection.scalable_consumers.pop(self.consumer_id, None) is not None and connection.usable:
                connection.send_command(base_command(pb.BaseCommand.SCALABLE_CONSUMER_UNREGISTER,
                                                     consumer_id=self.consumer_id))
            if connection is not self._connection:
                connection.remove_close_listener(self._connection_closed)
            raise
        if result.HasField("error"):
            connection.scalable_consumers.pop(self.consumer_id, None)
            if connection is not self._connection:
                connection.remove_close_listener(self._connection_closed)
        return result

    def _on_assignment(self, assignment: pb.CommandScalableConsumerAssignment) -> None:
        if not assignment.HasField("error"):
            self._arrived = assignment
        if assignment.HasField("request_id") and assignment.request_id == self._request_id \
                and self._answer is not None and not self._answer.done():
            self._answer.set_result(assignment)
        elif not assignment.HasField("error"):
            self._spawn(self._apply(assignment))
        elif not assignment.HasField("request_id"):
            # Pushed: that controller no longer serves the registration.
            if self._connection is not None:
                self._connection.scalable_consumers.pop(self.consumer_id, None)
            self._connection = None                     # (its close then starts no second registration)
            error = PulsarError.from_code(assignment.error, assignment.message)
            if isinstance(error, (SubscriptionNotFoundError, TopicNotFoundError)):
                self._spawn(self._unregistered(error))     # the subscription (or topic) was deleted
            elif not self._closed:
                self._spawn(self._reregister())            # leadership moved: the new leader

    async def _unregistered(self, error: PulsarError) -> None:
        """Stop reading at once (a segment consumer left open would subscribe again and read
        the deleted subscription from the start); receive() raises `error` once what was
        queued is handed out."""
        if self._closed:
            return
        self._ended = error
        self._queue.put_nowait(_ENDED)
        self._tasks.discard(asyncio.current_task())     # close() cancels the others, not this one
        await self.close()

    def _outdated(self, assignment: pb.CommandScalableConsumerAssignment) -> bool:
        """Whether `assignment` is not to be applied: of an earlier layout epoch than the one
        applied, or followed by another one since it arrived (that one is applied instead)."""
        return self._closed or assignment.layout_epoch < self.layout_epoch \
            or (self._arrived is not None and assignment is not self._arrived)

    async def _apply(self, assignment: pb.CommandScalableConsumerAssignment, *, strict: bool = False) -> None:
        """Follow `assignment`; `assigned` lists the segments read here. A segment that cannot
        be subscribed is left out of `assigned`: `strict` (registering) raises the failure,
        else it is logged and the latest assignment applied again, backing off, until every
        segment of it is read."""
        async with self._applying:
            if self._outdated(assignment):
                return
            self._assignment = assignment
            self.layout_epoch = assignment.layout_epoch
            if not await self._follow(assignment, strict=strict) and self._retrying is None:
                self._retrying = asyncio.get_running_loop().create_task(self._retry_assignment())
                self._tasks.add(self._retrying)
                self._retrying.add_done_callback(self._tasks.discard)

    async def _follow(self, assignment: pb.CommandScalableConsumerAssignment, *, strict: bool = False) -> bool:
        """Read exactly the segments of `assignment` (under `_applying`); whether all are."""
        wanted = [s.topic for s in assignment.segments]
        for topic in [t for t in self._consumers if t not in wanted]:
            self._pumps.pop(topic).cancel()
            await self._consumers.pop(topic).close()
        complete = True
        try:
            for topic in wanted:
                if topic in self._consumers:
                    continue
                try:
                    consumer = await self._subscribe(topic)
                except (asyncio.CancelledError, AlreadyClosedError):
                    raise
                except Exception as exc:
                    if strict:
                        raise
                    log.warning("stream consumer %s: cannot read its segment %s (retrying): %s",
                                self.consumer_name, topic, exc)
                    complete = False
                    continue
                if self._closed:
                    await consumer.close()
                    return True
                self._consumers[topic] = consumer
                _follow_redeliveries(consumer, self._queue, lambda item, c=consumer: item[0] is c)
                self._pumps[topic] = asyncio.get_running_loop().create_task(_forward(
                    consumer, lambda: self._closed, self._pumped(consumer),
                    f"stream consumer {self.consumer_name} on {consumer.topic}"))
        finally:
            self.assigned = [s.segment_id for s in assignment.segments if s.topic in self._consumers]
        return complete

    def _pumped(self, consumer: Consumer) -> Callable[[Message], None]:
        """What `consumer`'s forwarding task puts in the queue: each message with the consumer
        that read it (see `_hand_out`)."""
        return lambda message: self._queue.put_nowait((consumer, message))

    async def _retry_assignment(self) -> None:
        """Apply the latest assignment again until all its segments are read (or closed)."""
        backoff = Backoff(self._core.config.initial_backoff, self._core.config.max_backoff)
        try:
            while not self._closed:
                await asyncio.sleep(backoff.next())
                async with self._applying:
                    if self._closed or self._assignment is None:
                        return
                    if await self._follow(self._assignment):
                        return
        finally:
            if self._retrying is asyncio.current_task():
                self._retrying = None

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
        # (a registration under way replaces its own connection: not `_connection` yet)
        if self._closed or connection is not self._connection:
            return
        self._connection = None
        connection.scalable_consumers.pop(self.consumer_id, None)
        self._spawn(self._reregister())

    async def _reregister(self) -> None:
        await asyncio.sleep(self._core.config.initial_backoff)
        try:
            # what no retry can mend ends the consumer, as a push of the error would have
            await retry(self._core, self._register, lambda: self._closed,
                        f"stream consumer {self.consumer_name} re-registering", final=_REGISTRATION_ENDED)
        except _REGISTRATION_ENDED as error:
            await self._unregistered(error)

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message of a segment still assigned here: one read before its segment went
        to another consumer is dropped (that consumer reads it too; handed out here as well it
        would come twice, could not be acknowledged, and could break its key's order)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._closed and self._ended is None:     # (ended: what was queued is handed out first)
                raise AlreadyClosedError(f"stream consumer {self.consumer_name} of {self.watch.topic} is closed")
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            queued = await _next_queued(self._queue, remaining, timeout)
            if queued is _CLOSED:
                self._queue.put_nowait(_CLOSED)        # for every other receive waiting
                continue
            if queued is _ENDED:
                self._queue.put_nowait(_ENDED)         # for every later receive too
                assert self._ended is not None
                raise self._ended
            message = self._hand_out(queued)
            if message is not None:
                return message

    def _hand_out(self, queued: Any) -> Message | None:
        """The message of a queue item, or None when the consumer that read it no longer reads
        its segment here: the segment went to another consumer — even if it came back since,
        the new subscription of it delivers again what was not acknowledged (handed out too,
        the other consumer's acknowledged messages would come twice, and the rest out of order)."""
        consumer, message = queued
        return message if self._consumers.get(message.topic) is consumer else None

    async def acknowledge(self, message: Message, txn: Transaction | None = None) -> None:
        """Acknowledge `message` on its segment (in `txn`, a scalable transaction, if given:
        the segment counts as drained for its children only once the txn commits)."""
        consumer = self._consumers.get(getattr(message, "topic", None))
        if consumer is None:
            raise ValueError("not a message of a segment this consumer is assigned")
        await consumer.acknowledge(message, txn=txn)

    async def redeliver_unacknowledged_messages(self) -> None:
        """Have the assigned segments send again what they sent here and is not acknowledged
        (after a transaction's abort released its acks, the only way short of a close to get
        them again). What is queued here is dropped first: it comes again, in order."""
        if self._closed:
            raise AlreadyClosedError(f"stream consumer {self.consumer_name} of {self.watch.topic} is closed")
        for consumer in list(self._consumers.values()):      # (the queued copies go too)
            await consumer.redeliver_unacknowledged_messages()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._ended is None:
            self._queue.put_nowait(_CLOSED)             # the receives waiting end now (else _ENDED does)
        connection = self._connection
        if connection is not None:
            connection.remove_close_listener(self._connection_closed)
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
        self._client._core.forget(self)  # type: ignore[arg-type]


class CheckpointConsumer(StreamConsumer):
    """An unmanaged ordered consumer (for connectors): registered with the controller like a
    StreamConsumer, but it reads its segments with non-durable readers and keeps its position
    itself — `checkpoint()` returns it, and a new consumer started from it resumes after the
    last message handed out. Before its assigned segments it reads their sealed ancestors to
    their end (one reader at a time, oldest first: a parent shared by two assigned children is
    read once, so one position per segment says exactly what was handed out), handing out only
    the messages whose key hash falls in an assigned segment's range (keyless ones: the hash at
    the start of the segment read), so each key's messages come in order across splits and
    merges without acknowledgements. A message is handed out if, when receive() takes it, an
    assigned segment holds its hash and is its segment or descends from it: what was read ahead
    of a split goes on to the consumer of the children, in order, before their own messages.
    A sealed segment assigned in place of its children (the controller holds children back
    until their parents are drained on the subscription) is read to its end and then drained
    on the subscription (its cursor moved to the end), so the children follow. Its position is
    its own: a segment moved to another checkpoint consumer of the subscription (a merge, a
    consumer joining) is read there from the start, so delivery is at-least-once across moves."""

    def __init__(self, client: Client, watch: DagWatch, subscription: str, consumer_name: str,
                 options: dict[str, Any], checkpoint: dict[int, MessageId] | None = None) -> None:
        super().__init__(client, watch, subscription, consumer_name, options)
        # segment id -> (hash ranges read for, last message id read, read to its end)
        self._progress: dict[int, tuple[tuple[HashRange, ...], MessageId | None, bool]] = {}
        for sid, message_id in (checkpoint or {}).items():
            if not isinstance(message_id, MessageId):
                raise TypeError("a checkpoint maps segment ids to MessageIds")
            self._progress[sid] = ((HashRange.full(),), message_id, False)
        self._reading: asyncio.Task | None = None
        self._layout: SegmentLayout | None = None           # the layout `assigned` refers to
        # Read messages wait in the queue as (segment read, key hash, message); per segment
        # read: how many wait, and the last one handed out by receive().
        self._waiting: Counter[int] = Counter()
        # (resumed: where it resumes from, until a message of the segment is handed out here)
        self._handed: dict[int, MessageId] = {sid: progress[1] for sid, progress in self._progress.items()}

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
        sid, hash_value, message = queued
        self._waiting[sid] -= 1
        if not self._owns(sid, hash_value):
            return None
        self._handed[sid] = message.message_id
        return message

    def _owns(self, sid: int, hash_value: int) -> bool:
        """Whether a message of segment `sid` whose key hash is `hash_value` is this consumer's:
        an assigned segment holds the hash and is `sid` or one of its descendants."""
        layout = self._layout
        if layout is None:
            return False
        for target in self.assigned:
            segment = layout.all_segments.get(target)
            if segment is not None and segment.hash_range.contains(hash_value) \
                    and (target == sid or sid in _ancestor_ids(layout, target)):
                return True
        return False

    async def _apply(self, assignment: pb.CommandScalableConsumerAssignment, *, strict: bool = False) -> None:
        async with self._applying:
            if self._outdated(assignment):
                return
            layout = self.watch.layout
            while layout is None or layout.epoch < assignment.layout_epoch:
                # Until the DAG watch brings it, however late (a watch re-opening): given up,
                # the assignment was never applied, and the consumer kept its old segments.
                try:
                    layout = await self.watch.wait_newer_than(assignment.layout_epoch - 1,
                                                              self._core.config.operation_timeout)
                except TimeoutError:
                    if strict:                          # registering: within the operation timeout
                        raise
                    if self._outdated(assignment):      # closed, or a newer one to apply
                        return
                    log.info("checkpoint consumer %s: still waiting for the layout of epoch %d",
                             self.consumer_name, assignment.layout_epoch)
            if self._closed:
                return
            await self._stop_reading()
            self.layout_epoch = assignment.layout_epoch
            self._layout, self.assigned = layout, [s.segment_id for s in assignment.segments]
            assigned = [layout.all_segments[s] for s in self.assigned if s in layout.all_segments]
            self._reading = asyncio.get_running_loop().create_task(retry(
                self._core, lambda: self._read_assigned(layout, assigned), lambda: self._closed,
                f"checkpoint consumer {self.consumer_name} reading {self.assigned}"))

    async def _stop_reading(self) -> None:
        reading, self._reading = self._reading, None
        if reading is not None:
            reading.cancel()
            await asyncio.wait([reading])

    async def _read_assigned(self, layout: SegmentLayout, assigned: list[SegmentInfo]) -> None:
        # the sealed segments to read to their end, each once, ancestors before descendants:
        # every assigned segment's sealed ancestors overlapping its range, and the assigned
        # segments that are sealed themselves (given in place of their children)
        sealed: dict[int, list[HashRange]] = {}
        for target in assigned:
            for segment in layout.lineage(target.segment_id):
                if segment.segment_id == target.segment_id:
                    if not segment.is_active:
                        sealed.setdefault(segment.segment_id, []).append(target.hash_range)
                    break
                if segment.hash_range.start <= target.hash_range.end \
                        and target.hash_range.start <= segment.hash_range.end:
                    sealed.setdefault(segment.segment_id, []).append(target.hash_range)
        for sid in sorted(sealed, key=lambda s: (layout.segment(s).created_at_epoch, s)):
            await self._read(layout.segment(sid), sealed[sid], to_end=True)
        for target in assigned:
            delay = DRAIN_POLL
            while not target.is_active and not await self._drain(target):
                # what follows what was read is undecided (an open transaction's) or was
                # committed since: read on from there once there is more
                covered, last, _ = self._progress[target.segment_id]
                self._progress[target.segment_id] = (covered, last, False)
                await asyncio.sleep(delay)
                delay = min(delay * 2, DRAIN_POLL_MAX)
                await self._read(target, [target.hash_range], to_end=True)
        async with asyncio.TaskGroup() as group:
            for target in assigned:
                if target.is_active:
                    group.create_task(self._read(target, [target.hash_range], to_end=False))

    async def _drain(self, segment: SegmentInfo) -> bool:
        """Move the subscription's cursor on sealed `segment`, read to its end, to its end (this
        consumer reads with readers; the cursor only tells the controller that the children may
        follow); whether it is there. Not while a transaction sent to the segment is open: its
        messages are not readable yet (and the last readable message is not the segment's end),
        but keep the subscription's backlog; nor when a message was committed since the read."""
        consumer = await self._subscribe(segment.topic_name(self.watch.topic_name))
        try:
            last = await consumer.get_last_message_id()
            read = self._last(segment.segment_id)
            if last.entry_id >= 0:
                if read is None or (read.ledger_id, read.entry_id) < (last.ledger_id, last.entry_id):
                    return False                # committed since it was read: read it first
                await consumer.acknowledge_cumulative(last)
            # (aborted entries and markers past it leave the backlog as this consumer's
            # subscription passes them; an open transaction's entries do not)
            return await _subscription_backlog(consumer, self._core.config.operation_timeout) == 0
        finally:
            await consumer.close()

    async def _read(self, segment: SegmentInfo, ranges: list[HashRange], *, to_end: bool) -> None:
        sid = segment.segment_id
        covered, last, done = self._progress.get(sid, ((), None, False))
        new = tuple(r for r in ranges if not _covers(covered, r))
        if not new and done:
            return
        # ranges not read before: from the start, skipping what was read for the others
        start = last if last is not None and not new else MessageId.earliest
        reading = (*covered, *new)
        reader = await self._client.create_reader(segment.topic_name(self.watch.topic_name), start,
                                                  start_message_id_inclusive=start == MessageId.earliest)
        try:
            while True:
                if to_end and not await reader.has_message_available():
                    self._progress[sid] = (reading, self._last(sid), True)
                    return
                message = await reader.read_next()
                hash_value = key_hash(message.partition_key) if message.partition_key is not None \
                    else segment.hash_range.start
                already = last is not None and not last < message.message_id and _covers(covered, hash_value)
                if last is None or last < message.message_id:
                    self._progress[sid] = (reading, message.message_id, False)
                else:
                    self._progress[sid] = (covered, last, False)
                if not already and _covers(reading, hash_value):
                    self._waiting[sid] += 1
                    self._queue.put_nowait((sid, hash_value, message))
        finally:
            await reader.close()

    def _last(self, sid: int) -> MessageId | None:
        progress = self._progress.get(sid)
        return progress[1] if progress is not None else None

    async def acknowledge(self, message: Message) -> None:
        raise NotAllowedError("a CheckpointConsumer acknowledges nothing: its position is checkpoint()")

    async def redeliver_unacknowledged_messages(self) -> None:
        raise NotAllowedError("a CheckpointConsumer acknowledges nothing: it resumes from a checkpoint()")

    async def close(self) -> None:
        if self._closed:
            return
        await super().close()
        await self._stop_reading()


def _covers(ranges: tuple[HashRange, ...], what: HashRange | int) -> bool:
    """Whether one of `ranges` holds `what` (a range, or a hash)."""
    if isinstance(what, int):
        return any(r.contains(what) for r in ranges)
    return any(r.start <= what.start and what.end <= r.end for r in ranges)


def _ancestor_ids(layout: SegmentLayout, sid: int) -> set[int]:
    out: set[int] = set()
    pending = [sid]
    while pending:
        for parent in layout.parents(pending.pop()):
            if parent.segment_id not in out:
                out.add(parent.segment_id)
                pending.append(parent.segment_id)
    return out
