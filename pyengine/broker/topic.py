"""Topic: a managed ledger with its transaction buffer, producers and subscriptions.

Loading a topic opens its ledger, recovers its transaction buffer (the topic serves nothing
before the read horizon is known), and opens every durable subscription with its pending acks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyengine.broker.backlog_quota import check_new_producer
from pyengine.broker.compaction import COMPACTION_SUBSCRIPTION, TopicCompaction
from pyengine.broker.consumer import Consumer
from pyengine.broker.delayed import deliver_at_time, wall_clock_ms
from pyengine.broker.dedup import MessageDeduplication
from pyengine.broker.policies import ConnectionLimits
from pyengine.broker.rates import RateCounter
from pyengine.broker.subscription import Subscription, normalize_sub_type
from pyengine.broker.transactions import check_txn_design
from pyengine.concurrency import single_flight
from pyengine.errors import (ConsumerBusyError, InvalidSubscriptionNameError, NotAllowedError, ProducerBusyError,
                             SubscriptionNotFoundError, TopicFencedError, TopicTerminatedError)
from pyengine.concurrency import RunOnce
from pyengine.naming import TopicName, stored_name_problem
from pyengine.storage import ManagedCursor, ManagedLedger, StorageError
from pyengine.storage.entry import Entry
from pyengine.storage.environment import WriteFn, all_of
from pyengine.subscription_properties import check_subscription_properties
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer import TransactionBuffer
from pyengine.transaction.pendingack import PendingAckReplayError
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID
from pyengine_kernels import Position, TxnId

if TYPE_CHECKING:
    from pyengine.broker.service import BrokerService

log = logging.getLogger(__name__)

UNKNOWN = object()          # publish(deliver_at=...) not given: searched for in the entry


class Producer:
    """A producer attached to a topic."""

    def __init__(self, topic: Topic, name: str, producer_id: int) -> None:
        self.topic = topic
        self.name = name
        self.producer_id = producer_id
        self.last_sequence_id = topic.dedup.last_sequence_id(name)
        # Closed from the broker side (a backlog quota, see Topic.disconnect_producers): its
        # connection is told through `on_disconnect`; without one (the embedded client) its next
        # send attaches it again, as a reconnecting client's producer would be.
        self.disconnected = False
        self.on_disconnect: Callable[[], None] | None = None
        self.rate_in = RateCounter()            # what it published (Pulsar's publisher msgRateIn)


def _check_subscription_name(name: object) -> None:
    if not name or not isinstance(name, str):
        raise ValueError("a subscription name must be a non-empty string")
    problem = stored_name_problem("subscription", name)
    if problem is not None:
        raise InvalidSubscriptionNameError(problem)


class Topic:
    def __init__(self, service: BrokerService, name: TopicName, ledger: ManagedLedger,
                 buffer: TransactionBuffer) -> None:
        self.service = service
        self.topic_name = name
        self.name = str(name)
        self.partition_index = name.partition_index
        self.ledger = ledger
        self.buffer = buffer
        self.dedup = MessageDeduplication(ledger, service.policies.deduplication_enabled(self.name))
        self.subscriptions: dict[str, Subscription] = {}
        self._opening_subscriptions: dict[str, asyncio.Future[Subscription]] = {}
        # Subscriptions being deleted (unsubscribe): opened again only once that is over.
        self._deleting_subscriptions: dict[str, asyncio.Future[None]] = {}
        self.producers: dict[str, Producer] = {}
        self._readers: list[Subscription] = []
        self._named_readers: dict[str, Subscription] = {}    # the non-durable subscriptions, by name
        self._closed = False
        self._closing = RunOnce(self._close)
        # Last seen active by the inactive-topic check (Pulsar's lastActive), from its load on.
        self.last_active_ms = service.config.clock()
        # Published since the topic was loaded (Pulsar's msgInCounter / bytesInCounter).
        self.rate_in = RateCounter()
        self.rate_out = RateCounter()          # delivered to its consumers and readers
        ledger.add_listener(self._entries_added)
        buffer.add_listener(self._entries_added)
        self._delay_limit = 0                  # see _delayed_published
        self._delay_limit_version = -1
        # Delayed delivery: whether a message with a deliver_at_time was published since the
        # load, and the last entry stored before the load: a dispatcher searches an entry for a
        # deliver_at_time only when it is at or before that, or once one was published.
        self.delayed_seen = False
        self.delayed_unchecked_up_to = ledger.lac
        # Topic compaction: the compacted view and its horizon (`pyengine.broker.compaction`).
        self.compaction = TopicCompaction(self)

    @classmethod
    async def load(cls, service: BrokerService, name: TopicName) -> Topic:
        ledger = await ManagedLedger.open(service.env, str(name), service.config.ledger)
        await service.pin_transaction_version(ledger)
        buffer = service.new_transaction_buffer(ledger)
        topic = cls(service, name, ledger, buffer)
        try:
            await buffer.recover()
            for cursor_name in topic._stored_cursor_names():
                cursor = await ledger.open_cursor(cursor_name)
                await topic._attach_subscription(cursor, keep_unreplayed=True)
            topic.compaction.load()
            service.apply_retention(ledger)      # once its subscriptions hold back what they need
        except BaseException:
            # Nothing of a failed load may live on (Pulsar #14760: a half-open topic stayed
            # unusable; here its buffer's snapshot timer would also outlive it): the next load
            # starts afresh.
            with contextlib.suppress(Exception):
                await topic.close()
            raise
        return topic

    def _stored_cursor_names(self) -> list[str]:
        prefix = self.ledger._prefix
        names = []
        with self.ledger.env.read() as txn:
            cursor = txn.cursor(db=self.ledger.env.db("cursors"))
            if cursor.set_range(prefix):
                for key in cursor.iternext(values=False):
                    if not key.startswith(prefix):
                        break
                    names.append(key[len(prefix):].decode())
        return names

    async def _attach_subscription(self, cursor: ManagedCursor, sub_type: str | None = None, *,
                                   keep_unreplayed: bool = False) -> Subscription:
        """`keep_unreplayed`: a stored subscription whose pending acks cannot be replayed is
        kept, refusing its consumers (`subscribe` tries the replay again), as Pulsar's
        subscription waits for its pending-ack handle: failing the load over it, the whole
        topic was down, its producers and other subscriptions too."""
        subscription = Subscription(self, cursor.name, cursor, pending_ack=None, sub_type=sub_type)
        if cursor.durable:
            subscription.pending_ack = self.service.new_pending_ack_handle(
                cursor, sub_type, on_release=subscription.released_by_pending_ack,
                on_acked=subscription.committed_by_pending_ack)
            try:
                await subscription.pending_ack.replay()
            except PendingAckReplayError:
                if not keep_unreplayed:
                    raise
        if cursor.durable:
            self.subscriptions[cursor.name] = subscription
        return subscription

    @property
    def msg_in_counter(self) -> int:
        return self.rate_in.msgs

    @property
    def bytes_in_counter(self) -> int:
        return self.rate_in.bytes

    def rates(self) -> dict[str, float]:
        """Its rates over the last stats interval, as Pulsar's TopicStats names them."""
        return {"msgRateIn": self.rate_in.msg_rate, "msgThroughputIn": self.rate_in.byte_rate,
                "msgRateOut": self.rate_out.msg_rate, "msgThroughputOut": self.rate_out.byte_rate}

    def update_rates(self, now: float) -> None:
        """Compute the rates of its stats over the interval since the last call (rates.py)."""
        self.rate_in.update(now)
        self.rate_out.update(now)
        for producer in self.producers.values():
            producer.rate_in.update(now)
        for subscription in [*self.subscriptions.values(), *self._readers]:
            subscription.rate_out.update(now)
            subscription.rate_expired.update(now)
            for consumer in subscription.consumers:
                consumer.rate_out.update(now)
                consumer.rate_redeliver.update(now)

    def _entries_added(self) -> None:
        for subscription in self.subscriptions.values():
            subscription.dispatcher.notify()
        for reader in self._readers:
            reader.dispatcher.notify()

    # --- producing ------------------------------------------------------------------------

    def add_producer(self, name: str | None = None) -> Producer:
        problem = stored_name_problem("producer", name) if name is not None else None
        if problem is not None:
            raise NotAllowedError(problem)
        self._check_producer_allowed(name)
        if name is None:
            name = self.service.generate_producer_name()
            while name in self.producers:
                name = self.service.generate_producer_name()
        elif name in self.producers:
            raise ProducerBusyError(f"producer {name!r} is already connected to {self.name}")
        producer = Producer(self, name, len(self.producers))
        self.producers[name] = producer
        return producer

    def _check_producer_allowed(self, name: str | None) -> None:
        self._check_open()
        if self.ledger.terminated_at is not None:
            raise TopicTerminatedError(f"topic {self.name} is terminated")
        if getattr(self.service, "policies", None) is not None:
            check_new_producer(self, name)     # before the producer limit, as Pulsar's handleProducer
        limit = self.connection_limits().producers_per_topic
        if 0 < limit <= len(self.producers):
            raise ProducerBusyError("Topic reached max producers limit")         # Pulsar's words

    def remove_producer(self, producer: Producer) -> None:
        if self.producers.get(producer.name) is producer:
            del self.producers[producer.name]
            self.touch()

    def subscriptions_changing(self) -> bool:
        """A subscription is being created or deleted."""
        return bool(self._opening_subscriptions or self._deleting_subscriptions)

    def touch(self) -> None:
        """A producer, consumer or subscription went: the topic was active until now (its
        inactive time counts from here, as Pulsar's lastActive once a cursor is deleted)."""
        self.last_active_ms = self.service.config.clock()

    def disconnect_producers(self) -> int:
        """Close every producer from the broker side (Pulsar's Producer.disconnect, as its
        BacklogQuotaManager does past a producer_request_hold / producer_exception quota, and
        its PersistentTopic.close / delete do): a network client gets CLOSE_PRODUCER and
        reconnects that producer alone, refused while the quota is exceeded or the topic is
        closed. Returns how many were closed."""
        producers = list(self.producers.values())
        for producer in producers:
            self.remove_producer(producer)
            producer.disconnected = True
            if producer.on_disconnect is not None:
                producer.on_disconnect()
        return len(producers)

    def _reattach(self, producer: Producer) -> None:
        """A producer closed by the broker sends again without a connection to reconnect (the
        embedded client): it is attached again as a new producer of its name would be."""
        self._check_producer_allowed(producer.name)
        if producer.name in self.producers:
            raise ProducerBusyError(f"producer {producer.name!r} is already connected to {self.name}")
        self.producers[producer.name] = producer
        producer.disconnected = False

    def publish(self, producer: Producer, data: bytes, *, sequence_id: int, num_messages: int = 1,
                publish_time: int = 0, highest_sequence_id: int | None = None,
                txn: TxnId | None = None, after: asyncio.Future[Any] | None = None,
                deduplicate: bool = True, deliver_at: int | None | object = UNKNOWN) -> asyncio.Future[Position | None]:
        """Store one entry (a message or a batch). The future resolves with its position once
        durable, or with None for a duplicate of something stored before; storage errors are
        raised as they are (`pyengine.errors.to_pulsar_error` maps them for the wire).
        `after`: a v4 txn's registration of this partition (TransactionBuffer.append_checked).
        `deduplicate` False: a chunk before its message's last, which shares the message's
        sequence id - neither checked nor recorded (the last chunk is). `deliver_at`: the
        message's deliver_at_time (None: it has none) as the caller read it from the metadata it
        parsed or built; left out, it is searched for in `data`. A message delayed beyond the
        delayed delivery policy's maxDeliveryDelayInMillis is refused (NotAllowedError)."""
        self._check_open()
        if producer.disconnected:
            self._reattach(producer)
        if deliver_at is UNKNOWN:
            deliver_at = deliver_at_time(data)
        if deliver_at is not None:
            self._delayed_published(deliver_at, publish_time)   # type: ignore[arg-type]
        highest = sequence_id if highest_sequence_id is None else highest_sequence_id
        if deduplicate:
            duplicate = self.dedup.duplicate_of(producer.name, sequence_id, highest)
            if duplicate is not None:
                return duplicate
        self.rate_in.add(num_messages, len(data))
        producer.rate_in.add(num_messages, len(data))
        if txn is not None:
            if txn.most_bits == V5_COORDINATOR_ID:
                check_txn_design(self.buffer, txn, self.name)
            stored = self.buffer.append_checked(txn, data, num_messages, publish_time, after)
        else:
            stored = self.ledger.append(data, num_messages=num_messages, publish_time=publish_time)
        if deduplicate:
            self.dedup.record(producer.name, highest, stored)
        return stored

    def _delayed_published(self, deliver_at: int, publish_time: int) -> None:
        """A message with a deliver_at_time is published: from now on the dispatchers look for
        delays in new entries (`delayed_seen`), and Pulsar's isExceedMaximumDeliveryDelay
        (PIP-315) applies: with delayed delivery active and a maxDeliveryDelayInMillis > 0, a
        message whose deliver_at_time is more than that after its publish_time is refused,
        before de-duplication sees it (a SEND_ERROR NotAllowedError for the client; in a
        transaction as well). The policy is derived again only when a policy changed."""
        self.delayed_seen = True
        policies = self.service.policies
        if self._delay_limit_version != policies.version:
            policy = policies.delayed_delivery(self.name)
            self._delay_limit = policy.max_delivery_delay_ms if policy.active else 0
            self._delay_limit_version = policies.version
        limit = self._delay_limit
        if limit > 0 and deliver_at - (publish_time or wall_clock_ms()) > limit:
            raise NotAllowedError(f"Exceeds max allowed delivery delay of {limit} milliseconds")

    # --- subscriptions --------------------------------------------------------------------

    async def subscribe(self, subscription_name: str, consumer: Consumer, *, sub_type: str = "exclusive",
                        initial_position: str = "latest", durable: bool = True,
                        start: Position | None = None, read_compacted: bool = False,
                        subscription_properties: Mapping[str, str] | None = None) -> Subscription:
        """Attach `consumer` to the subscription (created at `initial_position` if new). A
        non-durable subscription (a reader) starts at `start`. `read_compacted`: the consumer
        reads the compacted view up to the compaction horizon, then the topic after it
        (Exclusive and Failover subscriptions and readers only, as in Pulsar).
        `subscription_properties`: those of a subscription this creates (a reader's kept in
        memory); one that exists keeps its own, as Pulsar's."""
        self._check_open()
        _check_subscription_name(subscription_name)
        properties = check_subscription_properties(subscription_properties)
        sub_type = normalize_sub_type(sub_type)
        if read_compacted and sub_type not in ("exclusive", "failover"):
            # Pulsar's PersistentTopic.internalSubscribe, word for word.
            raise NotAllowedError("readCompacted only allowed on failover or exclusive subscriptions")
        consumer.read_compacted = bool(read_compacted)
        if initial_position not in ("earliest", "latest"):
            raise ValueError(f"initial_position must be 'earliest' or 'latest', not {initial_position!r}")
        # Before the subscription is created, as Pulsar's internalSubscribe.
        self._check_consumers_per_topic(self.connection_limits())
        # A name is one subscription, durable or not (Pulsar's getDurableSubscription /
        # getNonDurableSubscription, word for word): consumers of one name share it.
        if durable and subscription_name in self._named_readers:
            raise NotAllowedError("NonDurable subscription with the same name already exists.")
        if not durable and subscription_name in self.subscriptions:
            raise NotAllowedError("Durable subscription with the same name already exists.")
        joined = None if durable else self._named_readers.get(subscription_name)
        if durable:
            new = subscription_name not in self.subscriptions
            subscription = await self.open_subscription(subscription_name, initial_position, properties)
            if subscription.pending_ack is not None and subscription.pending_ack.replay_failed:
                # Refused (ServiceNotReady: its client retries) while its pending acks cannot
                # be rebuilt; the log may have been repaired since.
                await subscription.pending_ack.replay()
            # Closed while the subscription was opened: its consumer would never be told.
            self._check_open()
            from_start = new and initial_position == "earliest"
        elif joined is not None:
            subscription, from_start = joined, False
        else:
            cursor = self.ledger.new_non_durable_cursor(start if start is not None else self.ledger.lac.next())
            cursor.cursor_properties = properties
            subscription = await self._attach_subscription(cursor, sub_type)
            self._readers = [*self._readers, subscription]
            self._named_readers[subscription_name] = subscription
            first = self.ledger.first_position()
            from_start = start is not None and start == first
            if read_compacted and start is not None and start < first:
                # A message id in a ledger trimmed since: the view may still hold it.
                self.compaction.rewind_to_view(subscription.cursor, start)
        if read_compacted and not subscription.consumers:
            if from_start:
                self.compaction.rewind_to_view(subscription.cursor)
            elif durable:
                moved = self.compaction.resume_in_view(subscription.cursor)
                if moved is not None:     # read again from there: not replayed as well
                    subscription.dispatcher.redeliveries.difference_update(
                        [p for p in subscription.dispatcher.redeliveries if p >= moved])
        # Again with no await before the consumer is added: concurrent subscribes waited for
        # their subscriptions above, each having seen the consumers before any was added.
        limits = self.connection_limits()
        try:
            self._check_consumers_per_topic(limits)
            if (0 < limits.consumers_per_subscription <= len(subscription.consumers) and sub_type != "exclusive"
                    and subscription.sub_type == sub_type):
                # Pulsar's dispatchers check this after the subscription's type and Exclusive rules.
                raise ConsumerBusyError("Subscription reached max consumers limit")
            subscription.add_consumer(consumer, sub_type)
        except BaseException:
            if not durable and joined is None and not subscription.consumers:
                self.unsubscribe_reader(subscription)       # a reader's, made for this consumer
            raise
        return subscription

    def connection_limits(self) -> ConnectionLimits:
        """The producer and consumer limits of this topic now (none without a policy store)."""
        policies = getattr(self.service, "policies", None)
        return policies.connection_limits(self.name) if policies is not None else ConnectionLimits()

    def _check_consumers_per_topic(self, limits: ConnectionLimits) -> None:
        if 0 < limits.consumers_per_topic <= self.number_of_consumers():
            raise ConsumerBusyError("Topic reached max consumers limit")      # Pulsar's words

    def number_of_consumers(self) -> int:
        """The consumers of all the topic's subscriptions, readers' included (Pulsar's
        getNumberOfConsumers)."""
        return sum(len(s.consumers) for s in (*self.subscriptions.values(), *self._readers))

    async def open_subscription(self, subscription_name: str, initial_position: str = "latest",
                                subscription_properties: Mapping[str, str] | None = None) -> Subscription:
        """The durable subscription `subscription_name`, created at `initial_position` with
        `subscription_properties` if new, with no consumer (the admin API creates
        subscriptions ahead of their consumers)."""
        self._check_open()
        _check_subscription_name(subscription_name)
        properties = check_subscription_properties(subscription_properties)
        while (deleting := self._deleting_subscriptions.get(subscription_name)) is not None:
            # Opened meanwhile, it would take the cursor being deleted (not stored, not holding
            # back the trimming): it is made afresh after the deletion (kept if that failed).
            await asyncio.wait([deleting])
            self._check_open()
        subscription = self.subscriptions.get(subscription_name)
        if subscription is not None:
            return subscription
        # One Subscription per name: two attached by concurrent opens would each dispatch
        # every message to their own consumers.
        return await single_flight(self._opening_subscriptions, subscription_name,
                                   lambda: self._create_subscription(subscription_name, initial_position, properties))

    async def _create_subscription(self, subscription_name: str, initial_position: str,
                                   properties: dict[str, str]) -> Subscription:
        try:
            cursor = await self.ledger.open_cursor(subscription_name, initial_position, properties)
            subscription = self.subscriptions.get(subscription_name) or await self._attach_subscription(cursor)
        except Exception:
            # The topic closed under it (unloaded, deleted): its clients' TopicFencedError, on
            # which they attach again, rather than the closed ledger's PersistenceError.
            self._check_open()
            raise
        if self._closed:
            # Attached after the topic's close went over its subscriptions: closed here instead
            # (its pending-ack handle would stay open).
            with contextlib.suppress(Exception):
                await subscription.close()
            self._check_open()
        return subscription

    def unsubscribe_reader(self, subscription: Subscription) -> None:
        self.touch()
        self._readers = [r for r in self._readers if r is not subscription]
        for name in [n for n, r in self._named_readers.items() if r is subscription]:
            del self._named_readers[name]

    async def unsubscribe(self, subscription_name: str, *, force: bool = False) -> None:
        subscription = self.subscriptions.get(subscription_name)
        if subscription is None:
            raise SubscriptionNotFoundError(f"no subscription {subscription_name!r} on {self.name}")
        if subscription.consumers and not force:
            raise NotAllowedError(f"subscription {subscription_name} has connected consumers")
        if subscription_name in self._deleting_subscriptions:
            raise SubscriptionNotFoundError(f"subscription {subscription_name!r} on {self.name} is being deleted")
        deleting = self._deleting_subscriptions[subscription_name] = asyncio.get_running_loop().create_future()
        try:
            await self._unsubscribe(subscription_name, subscription)
        finally:
            del self._deleting_subscriptions[subscription_name]
            deleting.set_result(None)
            self.touch()

    async def _unsubscribe(self, subscription_name: str, subscription: Subscription) -> None:
        if subscription_name == COMPACTION_SUBSCRIPTION:
            # A compaction running now would write its view and move the cursor after the
            # deletion: it is stopped first (what it already queued lands, then is deleted).
            await self.compaction.close()
            if self.subscriptions.get(subscription_name) is not subscription:
                raise SubscriptionNotFoundError(f"no subscription {subscription_name!r} on {self.name}")
        del self.subscriptions[subscription_name]
        store = subscription.pending_ack.store if subscription.pending_ack is not None else None
        try:
            await subscription.close()
            # What the subscription keeps in LMDB goes with its cursor, in one write: a crash in
            # between would leave the subscription without its pending acks (a later commit of
            # their txn then loses them) or without its compacted view.
            with_cursor = []
            if subscription_name == COMPACTION_SUBSCRIPTION:
                with_cursor.append(self.compaction.delete_write())     # the horizon goes with its cursor
            if store is not None and store.deletes_with_cursor:
                with_cursor.append(store.delete_write())
            await self.ledger.delete_cursor(subscription_name, also=with_cursor)
        except StorageError:
            # Not deleted: still stored, so a restart brings it back. It goes on here as stored
            # (as Pulsar's subscription resumes after a failed delete), and a retry deletes it,
            # instead of answering SubscriptionNotFound for a subscription that outlives it.
            await self._reopen_subscription(subscription_name)
            raise
        if subscription_name == COMPACTION_SUBSCRIPTION:
            self.compaction.forget()
        if store is not None and not store.deletes_with_cursor:
            await store.delete()                # kept in the metadata store (v5)

    async def _reopen_subscription(self, subscription_name: str) -> None:
        """Attach again, from its stored cursor, a subscription whose deletion failed."""
        if self._closed or subscription_name in self.subscriptions:
            return
        try:
            cursor = await self.ledger.open_cursor(subscription_name)
            await self._attach_subscription(cursor)
        except Exception:           # the next load of the topic attaches it
            log.exception("%s: subscription %s not reopened after its deletion failed", self.name,
                          subscription_name)

    # --- transactions ---------------------------------------------------------------------

    async def end_txn(self, txn: TxnId, commit: bool, low_watermark: int, *,
                      after: asyncio.Future[Any] | None = None) -> None:
        """End `txn` here; `after`: the coordinator's decision still being written (see
        TransactionParticipants)."""
        if commit:
            await self.buffer.commit(txn, low_watermark, after=after)
        else:
            await self.buffer.abort(txn, low_watermark, after=after)

    def end_txn_now(self, txn: TxnId, commit: bool, low_watermark: int, *,
                    after: asyncio.Future[Any] | None = None) -> asyncio.Future[None] | None:
        """`end_txn` without a coroutine when the buffer can take the marker at once (see
        TopicTransactionBuffer.end_now); None: await `end_txn`."""
        return self.buffer.end_now(txn, TxnAction.COMMIT if commit else TxnAction.ABORT, low_watermark, after=after)

    # --- reading --------------------------------------------------------------------------

    def last_message_position(self) -> tuple[Position, int]:
        """The last entry a READ_COMMITTED reader can receive, and its batch size: the read
        horizon, stepping back over markers and aborted entries (Pulsar #21466, #21951).
        When there is none: (ledger, -1) of the horizon, batch size 0."""
        horizon = self.buffer.max_read_position()
        while True:
            chunk = self.ledger.read_entries_reverse(horizon, 256)
            for entry in chunk:
                if self._visible(entry):
                    return entry.position, entry.num_messages
            if len(chunk) < 256:
                return Position(horizon.ledger_id, -1) if horizon.entry_id >= 0 else horizon, 0
            horizon = self.ledger.previous_position(chunk[-1].position)

    def _visible(self, entry: Entry) -> bool:
        return not entry.is_marker and not (entry.txn_most >= 0 and self.buffer.hides(entry))

    # --- lifecycle ------------------------------------------------------------------------

    async def terminate(self, *, disconnect_producers: bool = True) -> Position:
        """Seal the topic. As Pulsar's PersistentTopic.terminate, its producers are
        disconnected (reconnecting, they are refused with TopicTerminated). A scalable topic's
        segment, sealed by a split or a merge, keeps them: their next send is refused
        (TopicTerminated, not stored) and goes to the children, where a disconnect would leave
        the sends in flight of unknown outcome."""
        last = await self.ledger.terminate()
        if disconnect_producers:
            self.disconnect_producers()
        return last

    def stats(self) -> dict:
        return {
            "msgInCounter": self.ledger.number_of_entries,
            "storageSize": self.ledger.total_size,
            **self.rates(),
            "lastAddConfirmed": str(self.ledger.lac),
            "maxReadPosition": str(self.buffer.max_read_position()),
            "publishers": [{"producerName": name} for name in self.producers],
            "subscriptions": {name: sub.stats() for name, sub in self.subscriptions.items()},
            "transactionBuffer": self.buffer.stats(),
        }

    def non_durable_subscriptions(self) -> dict[str, Subscription]:
        """The readers' subscriptions, by name (Pulsar keeps them in the topic's subscriptions
        with the durable ones; here they stay apart, so that nothing stores or restores them)."""
        return dict(self._named_readers)

    def consumers(self) -> list[Consumer]:
        """Every consumer attached to the topic, of its subscriptions and its readers."""
        return [c for subscription in [*self.subscriptions.values(), *self._readers] for c in subscription.consumers]

    async def close(self) -> None:
        """Close the topic (unloaded, or before its deletion): once, and to its end though a
        caller is cancelled meanwhile (left half-closed, it refused everything yet kept its
        ledger open and its subscriptions dispatching, and a later close returned at once);
        every part is closed though one before it failed (the first failure is raised).

        As Pulsar's PersistentTopic.close / delete, its clients are told at once: its producers
        are disconnected here, before anything is awaited (CLOSE_PRODUCER), its consumers as
        their subscriptions close (CLOSE_CONSUMER). Each reconnects alone, refused while the
        topic is closed (TopicFencedError: ServiceNotReady, retried). Left attached, a network
        producer's next send was refused with ServiceNotReady, on which the official client
        drops its whole connection, every other producer and consumer on it included."""
        self._closed = True
        self.disconnect_producers()
        await self._closing()

    async def _close(self) -> None:
        parts = [self.compaction.close, *(s.close for s in [*self.subscriptions.values(), *self._readers])]
        failure: Exception | None = None
        for close in [*parts, self.buffer.close, self.ledger.close]:
            try:
                await close()
            except Exception as exc:
                log.exception("%s: closing %s failed", self.name, getattr(close, "__self__", close))
                failure = failure or exc
        if failure is not None:
            raise failure

    async def delete(self, also: Sequence[WriteFn] = ()) -> None:
        """`also`: writes of the same LMDB transaction (what is kept by the topic's name: its
        schemas, its topic-level policies)."""
        await self.close()
        # Everything the topic keeps in LMDB goes in one write: a crash during the deletion
        # leaves the whole topic or none of it (a subscription left without its pending acks
        # would let a later commit of their txn lose them).
        stores = [s.pending_ack.store for s in self.subscriptions.values() if s.pending_ack is not None]
        writes = [*also, *(store.delete_write() for store in stores if store.deletes_with_cursor)]
        writes += [self.compaction.delete_write(), self.ledger.delete_write()]
        await self.ledger.env.submit(all_of(writes))
        self.compaction.forget()
        for store in stores:
            if not store.deletes_with_cursor:
                await store.delete()            # kept in the metadata store (v5)
        await self.buffer.delete()

    @property
    def closed(self) -> bool:
        """Closed (unloaded, or being deleted): it takes nothing more (TopicFencedError)."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise TopicFencedError(f"topic {self.name} is closed")

