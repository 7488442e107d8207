"""The embedded client: the engine in-process, with the API of `pyengine.client`.

    async with Broker.embedded("./data") as broker:
        producer = await broker.create_producer("persistent://public/default/out")
        consumer = await broker.subscribe("persistent://public/default/in", "sub",
                                          consumer_type="exclusive", initial_position="earliest")
        txn = await broker.new_transaction(timeout_ms=60_000)
        msg = await consumer.receive()
        await producer.send(b"...", txn=txn)
        await consumer.acknowledge(msg, txn=txn)
        await txn.commit()

Semantics are those of a network client against the broker: receiver queues with permits,
batch-index acknowledgements, negative acks, transactions registered with their coordinator
before their first send or ack on a topic, commit waiting for the transaction's operations.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import logging
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pyengine.broker.consumer import NO_CONSUMER_EPOCH, Consumer, Delivery
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.broker.subscription import Subscription
from pyengine.broker.topic import Producer, Topic
from pyengine.broker.transactions import append_condition
from pyengine.client.consumer import (
    ConsumerBatchReceivePolicy, ConsumerKeySharedPolicy, KeySharedMode, before_start, check_batch_receive_policy,
    check_key_shared_policy, receive_batch, receive_queued, wake_all, wake_one,
)
from pyengine.client.backoff import Backoff
from pyengine.client.config import ClientConfig
from pyengine.client.errors import (
    AlreadyClosedError, CumulativeAcknowledgementNotAllowedError, TransactionHasOperationFailedError,
)
from pyengine.client.handler import FATAL_ERRORS
from pyengine.client.held import HeldMessages
from pyengine.client.message import DecodeError, Message, MessageId, decode_entry, seek_ack_set
from pyengine.client.negative_acks import NegativeAckTracker
from pyengine.client.pattern import MultiTopicsConsumer, subscribe_target
from pyengine.client.producer import check_delivery, check_ordering_key
from pyengine.client.reader import has_more, position_before_last
from pyengine.client.transaction import is_end_refusal
from pyengine.client.validation import (
    check_consumer_type, check_initial_position, check_int, check_name, check_send_fields, check_timeout,
    check_topic,
)
from pyengine.errors import (
    InvalidTxnStatusError, NotAllowedError, ProducerBlockedQuotaExceededError, PulsarError, TopicFencedError,
    TransactionConflictError, TransactionNotFoundError, to_pulsar_error,
)
from pyengine.protocol import lookup
from pyengine.protocol.commands import message_metadata
from pyengine.protocol.pulsar_api_pb2 import KeyValue, MessageMetadata
from pyengine.storage.entry import headers_and_payload
from pyengine.storage.errors import StorageError
from pyengine.subscription_properties import check_subscription_properties
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID
from pyengine.transaction.pendingack import IndividualAck
from pyengine_kernels import Position, TxnId, ackset_new


def _now_ms() -> int:
    return int(time.time() * 1000)


log = logging.getLogger(__name__)
_T = TypeVar("_T")
_DEFAULT_NEGATIVE_ACK_DELAY_MS = 60_000       # pulsar-client's negative_ack_redelivery_delay_ms
# What attaching again retries (less FATAL_ERRORS): what the broker, its storage or its metadata
# store raise (a MetadataStoreError is a PulsarError), as a network client reconnects after them.
_TRANSIENT = (PulsarError, StorageError)
_OPERATION_TIMEOUT_MS = int(ClientConfig().operation_timeout * 1000)    # pyengine.client's default


async def _retried(attempt: Callable[[bool], Awaitable[_T]],
                   refusal: type[Exception] | tuple[type[Exception], ...], timeout_ms: int, *,
                   give_up: Callable[[], bool] = lambda: False,
                   fatal: tuple[type[BaseException], ...] = ()) -> _T:
    """`attempt(again)` (`again`: a retry) tried again while it raises `refusal` (but not one
    of `fatal`), at the network client's reconnect back-off; the refusal is raised once
    `timeout_ms` has passed (0: no limit) or `give_up()` says so. Any other error is raised at
    once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000 if timeout_ms > 0 else float("inf")
    backoff = Backoff()
    again = False
    while True:
        try:
            return await attempt(again)
        except refusal as exc:
            if isinstance(exc, fatal):
                raise
            again = True
            remaining = deadline - loop.time()
            if remaining <= 0 or give_up():
                raise
            await asyncio.sleep(min(backoff.next(), remaining))


async def _retried_while_held(attach: Callable[[], _T], timeout_ms: int) -> _T:
    """`attach()` (a producer's attachment to its topic), tried again while a
    producer_request_hold backlog quota refuses it, as a network client's producer is held and
    retried until the backlog is consumed. A producer_exception quota's refusal is raised at
    once. (The broker has no way to await the quota's end: it is checked again after each
    back-off delay.)"""
    async def attempt(_again: bool) -> _T:
        return attach()
    return await _retried(attempt, ProducerBlockedQuotaExceededError, timeout_ms)


async def _retried_while_closed(attach: Callable[[bool], Awaitable[_T]], service: BrokerService,
                                timeout_ms: int) -> _T:
    """`attach(again)` (a producer's or consumer's attachment to its topic), tried again while
    the topic is closed (being deleted: TopicFencedError), as pyengine.client retries the
    ServiceNotReady the broker answers then: once the deletion is over, the topic is created
    again on its next use. Given up at once if the broker is closing (no topic comes back)."""
    return await _retried(attach, TopicFencedError, timeout_ms, give_up=lambda: service.closed)


def _check_txn(txn: Any, service: BrokerService) -> None:
    """A send's or ack's `txn`: a transaction of this broker (TypeError, ValueError otherwise,
    as pyengine.client checks it). Another broker's v4 coordinators, or its private metadata
    store, number their transactions as this one's do: taken here, its id named an unrelated
    transaction of this broker, committed or aborted with that one."""
    if not isinstance(txn, EmbeddedTransaction):
        raise TypeError(f"txn must be an EmbeddedTransaction (new_transaction), not {type(txn).__name__}")
    if txn.service is not service:
        private = ("lmdb", "memory")
        shared = (txn.txn_id.most_bits == V5_COORDINATOR_ID and service.config.metadata_store not in private
                  and txn.service.config.metadata_store not in private)      # a v5 txn of a cluster
        if not shared:
            raise ValueError(f"transaction {txn.txn_id} is of another broker")


class ClosedError(AlreadyClosedError, NotAllowedError):
    """A closed producer, consumer or reader was used: `pyengine.client`'s AlreadyClosedError
    (what a MultiTopicsConsumer takes for a topic's consumer closed under it), and the
    NotAllowedError the embedded API raised for it before."""


class Broker:
    """Entry point of the embedding API."""

    @staticmethod
    @contextlib.asynccontextmanager
    async def embedded(data_dir: str | Path, **config: Any) -> AsyncIterator[EmbeddedClient]:
        """Start a broker on `data_dir` (LMDB) in this process and yield a client for it;
        everything is closed (and durable) when the block ends. `config` sets BrokerConfig
        fields (e.g. `deduplication_enabled=True`, `sync=False`)."""
        service = BrokerService(BrokerConfig(data_dir=Path(data_dir), **config))
        client: EmbeddedClient | None = None
        try:
            await service.start()
            client = EmbeddedClient(service)
            yield client
        finally:
            # Also when the block raised: what the client made is closed, and used afterwards
            # it says so (ClosedError) rather than that its topic or the coordinator is closed.
            try:
                if client is not None:
                    await client.close()
            finally:
                await service.close()


class _EmbeddedCore:
    """What a MultiTopicsConsumer asks of the network client's core (`ClientCore`), answered
    in-process: the topics of a namespace (as the broker answers GET_TOPICS_OF_NAMESPACE),
    and forgetting a consumer once it is closed."""

    # No network coordinator: a pyengine.client transaction is another client's here, and an
    # embedded one is checked by each topic's consumer (_check_txn).
    coordinator = None

    def __init__(self, client: EmbeddedClient) -> None:
        self._client = client
        self.config = ClientConfig()        # its back-off, to subscribe a failed topic again

    async def topics_of_namespace(self, namespace: str, mode: int) -> list[str]:
        return lookup.topics_of_namespace(self._client.service, namespace, mode)

    def forget(self, closed: object) -> None:
        if closed in self._client._consumers:
            self._client._consumers.remove(closed)  # type: ignore[arg-type]


class EmbeddedClient:
    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self._consumers: list[EmbeddedConsumer | MultiTopicsConsumer] = []
        self._producers: list[EmbeddedProducer] = []
        self._next_coordinator = itertools.count()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the client is closed")

    async def _closed_meanwhile(self, made: EmbeddedProducer | EmbeddedConsumer | MultiTopicsConsumer) -> None:
        """A producer or consumer made while the client was being closed: closed too, and the
        caller told (as pyengine.client's), rather than left open past the client's close."""
        if self._closed:
            await made.close()
            raise ClosedError("the client was closed while the producer or consumer was being created")

    async def _attachable_topic(self, name: str, *, again: bool = False) -> Topic:
        """The topic `name`, refused if it is a partitioned topic's base name (NotAllowedError,
        as the broker refuses it over the network): loading it would make a stray topic of
        that name. Producers, consumers and readers attach to its partitions.

        A missing segment is created on first use only while the broker's metadata store is
        its own (`lmdb` in its data dir, or `memory`). With a shared one (etcd, or a store the
        caller passed) the broker is one of a cluster: as on the wire, only the scalable topic's
        controller creates segments, and an empty copy made here would be taken at recovery for
        a segment created again, clearing the real segment's v5 state in the shared store.
        `again`: attached again after the topic was closed (deleted): a segment then must exist,
        as on the wire (made again, no scalable topic would route to it).

        Any other missing topic is created only where auto topic creation is allowed (the
        namespace's override, else the broker's setting; TopicNotFoundError otherwise), and
        always as a non-partitioned topic: this API attaches to one topic by its name, it does
        not discover partitions as a network client does."""
        private = self.service.config.metadata_store in ("lmdb", "memory")
        topic_name = lookup.resolve_topic(self.service, check_topic(name))
        # As on the wire: a partition beyond its partitioned topic's count is refused
        # (TopicNotFoundError), not created as a stray topic of that name.
        lookup.check_attachable(self.service, topic_name, existing_segment=again or not private)
        return await self.service.get_topic(name, create=self.service.auto_creates(topic_name))

    async def _add_producer(self, topic: Topic, name: str | None, send_timeout_ms: int) -> Producer:
        """A producer of bytes (it declares no schema) on `topic`: refused as the broker refuses a
        PRODUCER without a schema, on a topic with a schema where validation is enforced
        (IncompatibleSchemaError), and held past a producer_request_hold backlog quota."""
        await self.service.schemas.for_producer(topic, None)
        return await _retried_while_held(lambda: topic.add_producer(name), send_timeout_ms)

    async def create_producer(self, topic: str, *, producer_name: str | None = None,
                              initial_sequence_id: int | None = None,
                              initial_subscription_name: str | None = None,
                              send_timeout_ms: int = 30_000) -> EmbeddedProducer:
        """A producer on `topic`. As in `pyengine.client`: `initial_sequence_id`, the sequence
        id before the first send's (otherwise it goes on after what the broker has under the
        producer's name); `initial_subscription_name`, a durable subscription created at the
        earliest position with the producer if the topic has none of that name.

        Past a producer_request_hold backlog quota the creation, and the sends of a producer the
        broker closed for it, wait until the backlog is back under the quota, as a network
        client's producer is held and retried, for up to `send_timeout_ms` (0: no limit; the
        embedded client has no operation timeout of its own), then raise
        ProducerBlockedQuotaExceededError; past a producer_exception quota they fail at once. On a
        topic being deleted (closed) the creation is retried for up to pyengine.client's operation
        timeout, and a send waits for up to `send_timeout_ms` for the topic created again, as a
        network client's producer reconnects.

        The producer sends bytes: as a network client's producer without a schema, it is refused
        (IncompatibleSchemaError) on a topic with a schema where schema validation is enforced
        (by the broker, the namespace or the topic)."""
        self._check_open()
        check_topic(topic)
        check_name("producer_name", producer_name, optional=True)
        if initial_sequence_id is not None:
            check_int("initial_sequence_id", initial_sequence_id, -1)
        check_name("initial_subscription_name", initial_subscription_name, optional=True)
        check_int("send_timeout_ms", send_timeout_ms, 0)

        async def attach(again: bool) -> tuple[Topic, Producer]:
            self._check_open()
            loaded = await self._attachable_topic(topic, again=again)
            attached = await self._add_producer(loaded, producer_name, send_timeout_ms)
            if initial_subscription_name is not None and initial_subscription_name not in loaded.subscriptions:
                try:
                    self.service.check_initial_subscription(loaded)
                    await loaded.open_subscription(initial_subscription_name, "earliest")
                except Exception as exc:
                    loaded.remove_producer(attached)
                    error = to_pulsar_error(exc)
                    raise type(error)(f"Failed to create the initial subscription: {error}") from exc
            return loaded, attached

        loaded, attached = await _retried_while_closed(attach, self.service, _OPERATION_TIMEOUT_MS)
        producer = EmbeddedProducer(self, loaded, attached, initial_sequence_id, send_timeout_ms)
        self._producers.append(producer)
        await self._closed_meanwhile(producer)
        return producer

    async def subscribe(self, topic: str | list[str] | re.Pattern[str], subscription_name: str, *,
                        consumer_type: str = "exclusive",
                        initial_position: str = "latest", receiver_queue_size: int = 1000,
                        consumer_name: str | None = None, priority: int = 0,
                        negative_ack_redelivery_delay_ms: int = _DEFAULT_NEGATIVE_ACK_DELAY_MS,
                        read_compacted: bool = False, pattern_auto_discovery_period: float = 60,
                        batch_receive_policy: ConsumerBatchReceivePolicy | None = None,
                        key_shared_policy: ConsumerKeySharedPolicy | None = None,
                        subscription_properties: Mapping[str, str] | None = None,
                        ) -> EmbeddedConsumer | MultiTopicsConsumer:
        """Attach a consumer; `negative_ack_redelivery_delay_ms` as in `pyengine.client` and
        Pulsar's clients (a negatively acknowledged message comes back after it; 0: at once).
        `read_compacted`: the compacted view up to the compaction horizon, then the topic after
        it (Exclusive and Failover subscriptions only: NotAllowedError otherwise, as Pulsar).
        `batch_receive_policy` (ConsumerBatchReceivePolicy, or pulsar-client's): when
        `batch_receive()` returns, as in `pyengine.client`. `key_shared_policy`
        (ConsumerKeySharedPolicy, or pulsar-client's; Key_Shared only): its mode (Sticky: the
        hash ranges taken) and allow_out_of_order_delivery, as in `pyengine.client`.
        `subscription_properties` (str to str): those of the subscription if this creates it,
        as in `pyengine.client`.

        As `pyengine.client`, `topic` may also be a list of topics or a compiled regex (the
        topics of one namespace whose name matches it in full): then the consumer is a
        `pyengine.client.pattern.MultiTopicsConsumer` over one consumer per topic with these
        options; a pattern's topics are looked for again every `pattern_auto_discovery_period`
        seconds. On a topic being deleted (closed), the subscription is retried for up to
        pyengine.client's operation timeout, as the network client retries it; a consumer whose
        topic or subscription is deleted under it attaches again, as the network client's
        reconnects (see `EmbeddedConsumer.closed_by_broker`)."""
        self._check_open()
        target = subscribe_target(topic, pattern_auto_discovery_period)
        # checked before any topic is subscribed (a pattern may match none yet), as pyengine.client
        check_name("subscription_name", subscription_name)
        check_name("consumer_name", consumer_name, optional=True)
        consumer_type = check_consumer_type(consumer_type)
        initial_position = check_initial_position(initial_position)
        check_int("receiver_queue_size", receiver_queue_size, 1)
        check_int("priority", priority, 0)
        _check_read_compacted(read_compacted)
        properties = check_subscription_properties(subscription_properties)
        delay = negative_ack_redelivery_delay_ms
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise ValueError(f"negative_ack_redelivery_delay_ms must be an int >= 0, not {delay!r}")
        policy = check_batch_receive_policy(batch_receive_policy)
        key_shared = check_key_shared_policy(key_shared_policy)
        # As the network client, the policy only matters to a Key_Shared consumer.
        keyed = consumer_type == "key_shared"
        sticky_ranges = (key_shared.sticky_ranges
                         if keyed and key_shared.key_shared_mode is KeySharedMode.Sticky else None)
        out_of_order = keyed and key_shared.allow_out_of_order_delivery

        async def subscribe_one(name: str) -> EmbeddedConsumer:
            return await _retried_while_closed(lambda again: attach_one(name, again), self.service,
                                               _OPERATION_TIMEOUT_MS)

        async def subscribe_on(consumer: EmbeddedConsumer, loaded: Topic) -> tuple[Subscription, Consumer]:
            self.service.check_subscription_creation(loaded, subscription_name)
            broker_side = Consumer(consumer, name=consumer_name, priority=priority, sticky_ranges=sticky_ranges,
                                   allow_out_of_order_delivery=out_of_order)
            try:
                subscription = await loaded.subscribe(subscription_name, broker_side, sub_type=consumer_type,
                                                      initial_position=initial_position, read_compacted=read_compacted,
                                                      subscription_properties=properties)
            except Exception as exc:        # a cursor not saved: PersistenceError, as the wire answers
                raise to_pulsar_error(exc) from exc
            return subscription, broker_side

        async def attach_one(name: str, again: bool) -> EmbeddedConsumer:
            self._check_open()
            loaded = await self._attachable_topic(name, again=again)
            consumer = EmbeddedConsumer(self, loaded, receiver_queue_size, negative_ack_delay_ms=delay,
                                        batch_receive_policy=policy, subscribe_on=subscribe_on)
            consumer._attach(*await subscribe_on(consumer, loaded))
            return consumer

        if target.several:
            # The network client's class, over embedded consumers (they share its API).
            multi = MultiTopicsConsumer(_EmbeddedCore(self), subscription_name,  # type: ignore[arg-type]
                                        subscribe_one, receiver_queue_size,  # type: ignore[arg-type]
                                        target.pattern, target.period, batch_receive_policy=policy)
            await multi._start(target.topics)
            self._consumers.append(multi)
            await self._closed_meanwhile(multi)
            return multi
        assert target.name is not None
        consumer = await subscribe_one(target.name)
        self._consumers.append(consumer)
        await self._closed_meanwhile(consumer)
        return consumer

    async def create_reader(self, topic: str, start_message_id: MessageId, *,
                            receiver_queue_size: int = 1000, start_message_id_inclusive: bool = False,
                            reader_name: str | None = None, read_compacted: bool = False) -> EmbeddedConsumer:
        """A reader: a non-durable exclusive subscription starting after `start_message_id`, or
        at it if `start_message_id_inclusive` (as pulsar-client; MessageId.earliest /
        MessageId.latest allowed); a seek to an id follows the same setting. `read_compacted`: the
        compacted view up to the compaction horizon (from its start for MessageId.earliest),
        then the topic after it. `reader_name`: its consumer's name. On a topic being deleted
        (closed), the reader is retried for up to pyengine.client's operation timeout; one whose
        topic is deleted under it attaches again, after the last message it read."""
        self._check_open()
        check_topic(topic)
        if not isinstance(start_message_id, MessageId):
            raise TypeError(f"start_message_id must be a MessageId, not {type(start_message_id).__name__}")
        check_int("receiver_queue_size", receiver_queue_size, 1)
        if not isinstance(start_message_id_inclusive, bool):
            raise TypeError(f"start_message_id_inclusive must be a bool, "
                            f"not {type(start_message_id_inclusive).__name__}")
        check_name("reader_name", reader_name, optional=True)
        _check_read_compacted(read_compacted)

        async def subscribe_on(consumer: EmbeddedConsumer, loaded: Topic) -> tuple[Subscription, Consumer]:
            broker_side = Consumer(consumer, name=reader_name)
            # Attached again, it resumes at the first message it did not hand out, as the
            # network client's reader (and Java's) resubscribes (see closed_by_broker).
            begin = consumer._seek_start
            if begin is None:               # sought by time, nothing read or queued since: where it was
                assert consumer._subscription is not None
                start = consumer._subscription.cursor.read_position
            elif begin == MessageId.latest:
                start = loaded.ledger.lac.next()
            elif begin == MessageId.earliest:
                start = loaded.ledger.first_position()
            else:
                start = begin.position
            subscription = await loaded.subscribe(f"reader-{broker_side.consumer_id}", broker_side,
                                                  durable=False, start=start, read_compacted=read_compacted)
            return subscription, broker_side

        async def attach(again: bool) -> EmbeddedConsumer:
            self._check_open()
            loaded = await self._attachable_topic(topic, again=again)
            # negative acks of a reader wait the default delay too (60 s), as the network client's
            consumer = EmbeddedConsumer(self, loaded, receiver_queue_size, reader=True,
                                        start_inclusive=start_message_id_inclusive,
                                        negative_ack_delay_ms=_DEFAULT_NEGATIVE_ACK_DELAY_MS,
                                        subscribe_on=subscribe_on)
            consumer._start = consumer._seek_start = start_message_id
            consumer._attach(*await subscribe_on(consumer, loaded))
            return consumer

        consumer = await _retried_while_closed(attach, self.service, _OPERATION_TIMEOUT_MS)
        self._consumers.append(consumer)
        await self._closed_meanwhile(consumer)
        return consumer

    async def new_transaction(self, timeout_ms: int = 60_000, *, version: int = 4,
                              scalable: bool = False) -> EmbeddedTransaction:
        """A transaction of the v4 coordinators (for `persistent://` topics), or with
        `version=5` of the v5 (metadata-driven) coordinator, for `segment://` topics;
        `scalable=True` is `version=5`, by `pyengine.client`'s name."""
        self._check_open()
        check_int("timeout_ms", timeout_ms, 1)
        if isinstance(version, bool) or not isinstance(version, int):
            raise TypeError(f"version must be an int (4 or 5), not {type(version).__name__}")
        if not isinstance(scalable, bool):
            raise TypeError(f"scalable must be a bool, not {type(scalable).__name__}")
        if scalable and version == 4:
            version = 5
        if version == 5:
            txn_id = await self.service.coordinator.new_transaction(V5_COORDINATOR_ID, timeout_ms)
            return EmbeddedTransaction(self.service, txn_id, timeout_ms, client=self)
        if version != 4:
            raise ValueError(f"version must be 4 or 5, not {version!r}")
        coordinators = self.service.coordinator.coordinator_ids
        coordinator = coordinators[next(self._next_coordinator) % len(coordinators)]
        txn_id = await self.service.coordinator.new_transaction(coordinator, timeout_ms)
        return EmbeddedTransaction(self.service, txn_id, timeout_ms, client=self)

    async def close(self) -> None:
        """Close every producer and consumer made by this client; it makes no more (ClosedError),
        and its transactions are neither committed nor aborted through it (they time out, as
        a closed network client's)."""
        self._closed = True
        for consumer in list(self._consumers):
            await consumer.close()
        for producer in list(self._producers):
            await producer.close()


class EmbeddedTransaction:
    def __init__(self, service: BrokerService, txn_id: TxnId, timeout_ms: int | None = None,
                 deadline: float | None = None, *, client: EmbeddedClient | None = None) -> None:
        self.service = service
        self.txn_id = txn_id
        self._client = client
        self.state = "open"
        # As pyengine.client's Transaction (and Java's TransactionImpl): past its timeout the
        # transaction is "timed_out" here too (the coordinator aborts it at the same time), and
        # every operation is refused at once. `deadline`: time.monotonic() seconds.
        self._deadline = deadline if deadline is not None else (
            time.monotonic() + timeout_ms / 1000 if timeout_ms is not None else None)
        self._timer: asyncio.TimerHandle | None = None
        if self._deadline is not None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:            # rebound outside the loop (tests): the coordinator still times it out
                loop = None
            if loop is not None:
                self._timer = loop.call_later(max(0.0, self._deadline - time.monotonic()), self._timed_out)
        self._partitions: dict[str, asyncio.Future[None]] = {}
        # Sends and acks under way, and the first of them that failed: the commit waits until
        # none is under way, and aborts if one failed. (A count rather than a list of their
        # futures: a send that succeeded leaves nothing behind for the commit to look at.)
        self._in_flight = 0
        self._failure: BaseException | None = None
        self._settled: asyncio.Future[None] | None = None     # what the commit waits on
        # "committing" / "aborting": that end was cancelled under way and may be asked again (as
        # pyengine.client's; the coordinator answers a repeated decision with its outcome).
        self._retry: str | None = None
        self._registered: set[str] = set()      # partitions whose registration succeeded
        self._cumulative_consumers: list[EmbeddedConsumer] = []     # rewound by an abort (see abort)
        # The txn id fields of every message's metadata, encoded once: a serialized protobuf
        # message followed by more fields is that message with those fields set (encodings
        # merge). Setting the two fields by name on each message was a fifth of what a
        # transactional send adds to a plain one (instructions counted under callgrind).
        self._metadata_fields = MessageMetadata(
            txnid_most_bits=txn_id.most_bits, txnid_least_bits=txn_id.least_bits).SerializePartialToString()

    def _timed_out(self) -> None:
        if self.state == "open":
            self.state = "timed_out"

    def _check_open(self) -> None:
        if self.state != "open":
            raise InvalidTxnStatusError(f"transaction {self.txn_id} is {self.state.replace('_', ' ')}")

    def _fail(self, error: BaseException) -> None:
        """A send or ack of this open transaction failed before it was under way (a closed
        producer): the commit aborts and raises it, as the network client's does."""
        if self.state == "open" and self._failure is None:
            self._failure = error

    def _ending(self, state: str) -> None:
        if self._client is not None:
            self._client._check_open()
        if self.state == state and self._retry == state:
            self._retry = None          # an end cancelled under way, asked again
            return
        self._check_open()
        self.state = state
        if self._timer is not None:
            self._timer.cancel()

    def _rebound(self, service: BrokerService) -> EmbeddedTransaction:
        """This transaction on `service` (a restarted broker, whose coordinator kept it open):
        the same state, and a failed operation is still remembered (tests restart brokers
        under open transactions)."""
        if self._in_flight:
            raise InvalidTxnStatusError(f"transaction {self.txn_id} has operations under way")
        rebound = EmbeddedTransaction(service, self.txn_id, deadline=self._deadline if self.state == "open" else None)
        rebound.state = self.state
        rebound._partitions = dict(self._partitions)
        rebound._registered = set(self._registered)
        rebound._failure = self._failure
        rebound._retry = self._retry
        return rebound

    def _register_partition(self, topic: str) -> asyncio.Future[None]:
        """Register `topic` with the coordinator once (sends in flight share it). The record is
        submitted before this returns, so an entry appended right after, in the same
        event-loop turn, is committed together with it (as the client's ADD_PARTITION_TO_TXN
        before its first SEND)."""
        registration = self._partitions.get(topic)
        if registration is None or (registration.done() and not registration.cancelled()
                                    and registration.exception() is not None):
            registration = self.service.coordinator.register_produced_partitions(self.txn_id, [topic])
            self._partitions[topic] = registration
        return registration

    def _register_subscription(self, topic: str, subscription: str) -> asyncio.Future[None]:
        """The subscription's registration with the coordinator, asked for every ack as the
        wire broker asks for every transactional ACK: a transaction that ended meanwhile (its
        timeout) refuses it, and the ack with it. (Taken once, a later ack of an aborted
        transaction was reserved and its message never came back.)"""
        return self.service.coordinator.register_acked_subscriptions(self.txn_id, [(topic, subscription)])

    def _track(self, *operations: asyncio.Future[Any]) -> None:
        """Operations the commit waits for until they are settled, whatever happens to the
        caller that awaits them (an ack goes on when its caller is cancelled)."""
        for operation in operations:
            self._in_flight += 1
            operation.add_done_callback(self._tracked_settled)

    def _refused(self, failure: BaseException) -> None:
        """An operation of it was refused before it reached the broker (a message id whose
        batch is not the entry's): the commit fails as after any failed operation."""
        if self._failure is None:
            self._failure = failure

    def _tracked_settled(self, operation: asyncio.Future[Any]) -> None:
        self._operation_ended(asyncio.CancelledError() if operation.cancelled() else operation.exception())

    def _operation_ended(self, failure: BaseException | None = None) -> None:
        """A send or ack is over; `failure`: how it failed (a cancelled operation counts as
        failed: what it did may or may not have been done)."""
        self._in_flight -= 1
        if failure is not None and self._failure is None:
            if isinstance(failure, asyncio.CancelledError):
                # The commit raises what pyengine.client's raises then (a PulsarError, not a
                # CancelledError of a task nobody cancelled).
                error = TransactionHasOperationFailedError(
                    f"transaction {self.txn_id}: one of its operations was cancelled")
                error.__cause__ = failure
                failure = error
            self._failure = failure
        if not self._in_flight and self._settled is not None and not self._settled.done():
            self._settled.set_result(None)

    async def _operations_settled(self) -> BaseException | None:
        """Wait until no send or ack of the transaction is under way; the first that failed."""
        while self._in_flight:
            self._settled = asyncio.get_running_loop().create_future()
            try:
                await self._settled
            finally:
                self._settled = None
        return self._failure

    async def commit(self) -> None:
        """Commit once every send and ack of the transaction is done; if one of them failed,
        abort instead and raise its error (as Pulsar's clients do)."""
        self._ending("committing")
        try:
            failure = await self._operations_settled()
        except asyncio.CancelledError:
            self._retry = "committing"
            raise
        if failure is not None:
            self.state = "aborting"
            await self._end(TxnAction.ABORT, "aborting")
            self.state = "aborted"
            await self._rewind_cumulative_consumers()      # as an abort (Java's commit aborts)
            raise to_pulsar_error(failure)
        await self._end(TxnAction.COMMIT, "committing")
        self.state = "committed"

    async def _end(self, action: TxnAction, state: str) -> None:
        """End it at the coordinator. Refused for good there (not open, unknown, expired...):
        "error"; failed otherwise (cancelled under way, the decision not written): the same
        end may be asked again, as with pyengine.client's transactions."""
        try:
            await self.service.coordinator.end_transaction(self.txn_id, action)
        except asyncio.CancelledError:
            self._retry = state         # the decision may or may not be taken: ask again to know
            raise
        except Exception as exc:
            error = to_pulsar_error(exc)
            if is_end_refusal(error):
                self.state = "error"
            else:
                self._retry = state
            raise error from exc

    async def abort(self) -> None:
        """Abort: what the transaction sent is dropped, its acks are released. One past its
        timeout was aborted by the coordinator already (as the network client's abort)."""
        if self.state == "timed_out":
            self.state = "aborted"
            await self._rewind_cumulative_consumers()
            return
        self._ending("aborting")
        try:
            await self._operations_settled()
        except asyncio.CancelledError:
            self._retry = "aborting"
            raise
        try:
            await self._end(TxnAction.ABORT, "aborting")
        except TransactionNotFoundError:
            pass                        # ended and forgotten by the coordinator already (as the client's)
        self.state = "aborted"
        await self._rewind_cumulative_consumers()

    async def _rewind_cumulative_consumers(self) -> None:
        """As the network client's (and Java's) abort: a consumer that acked cumulatively in
        the transaction drops its queue and gets everything unacknowledged again, in order;
        else its queued later messages came before the released ones. On a v5 (segment)
        subscription the rewind first applies the abort there (its header watch may not have
        yet): awaited, so the abort returns with the consumer rewound."""
        consumers, self._cumulative_consumers = self._cumulative_consumers, []
        for consumer in consumers:
            if not consumer._closed:
                rewound = consumer._redeliver_all()
                if rewound is not None:
                    await rewound

    def __repr__(self) -> str:
        return f"EmbeddedTransaction({self.txn_id}, {self.state})"


class EmbeddedProducer:
    def __init__(self, client: EmbeddedClient, topic: Topic, producer: Producer,
                 initial_sequence_id: int | None = None, send_timeout_ms: int = 30_000) -> None:
        self._client = client
        self._topic = topic
        self._producer = producer
        self._next_sequence = (producer.last_sequence_id if initial_sequence_id is None else initial_sequence_id) + 1
        self._send_timeout_ms = send_timeout_ms
        # Sends held while the producer, closed by the broker past a backlog quota, is attached
        # again (None: none), in send order: each is let go after the one before it stored its
        # message (so sequence order stays send order), or all fail with the attachment.
        self._held_sends: deque[asyncio.Future[None]] | None = None
        self._attaching: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def producer_name(self) -> str:
        return self._producer.name

    @property
    def topic(self) -> str:
        return self._topic.name

    @property
    def last_sequence_id(self) -> int:
        return self._next_sequence - 1

    async def send(self, data: bytes, *, key: str | None = None, properties: dict[str, str] | None = None,
                   event_time: int | None = None, sequence_id: int | None = None,
                   txn: EmbeddedTransaction | None = None, deliver_after: datetime.timedelta | None = None,
                   deliver_at: int | None = None, ordering_key: str | None = None) -> MessageId:
        """Store one message; returns its id once durable (a duplicate of a message stored
        before, by sequence id, returns that message's id or (-1, -1) when it is not known).
        `deliver_after` (a timedelta) or `deliver_at` (ms since the epoch), as pulsar-client:
        Shared and Key_Shared subscriptions receive the message no sooner. `ordering_key`, as
        pulsar-client's: what a Key_Shared subscription routes the message by, before `key`."""
        if txn is not None and (type(txn) is not EmbeddedTransaction or txn.service is not self._client.service):
            _check_txn(txn, self._client.service)
        if self._closed:
            error = ClosedError("the producer is closed")
            if txn is not None:
                txn._fail(error)
            raise error
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be bytes, not {type(data).__name__}")
        if key is not None or properties is not None or event_time is not None or sequence_id is not None:
            check_send_fields(key, properties, event_time, sequence_id)      # before the producer changes
        if sequence_id is None:
            sequence_id = self._next_sequence
        delay = None if deliver_after is None and deliver_at is None else check_delivery(deliver_after, deliver_at)
        ordering = None if ordering_key is None else check_ordering_key(ordering_key)
        self._next_sequence = max(self._next_sequence, sequence_id + 1)
        counted = False     # in txn._in_flight already: a send held while the producer attaches again
        if self._held_sends is not None or self._producer.disconnected or self._topic.closed:
            # no await after this one before the message is handed to the topic (send order)
            if txn is not None:
                txn._check_open()
                txn._in_flight += 1         # a commit meanwhile waits for it, and fails with it
                counted = True              # (and it goes on once let go, the txn committing by then)
            try:
                await self._attached_again()
            except BaseException as exc:    # refused again (say, a terminated topic)
                if txn is not None:
                    txn._operation_ended(exc)
                raise
        publish_time = _now_ms()
        fields: dict[str, Any] = {}
        if key is not None:
            fields["partition_key"] = key
        if properties:
            fields["properties"] = [KeyValue(key=k, value=v) for k, v in properties.items()]
        if event_time:
            fields["event_time"] = event_time
        if delay is not None:
            fields["deliver_at_time"] = delay
        if ordering is not None:
            fields["ordering_key"] = ordering
        if txn is None:
            metadata = message_metadata(self._producer.name, sequence_id, publish_time, **fields).SerializeToString()
            try:
                position = await self._topic.publish(self._producer, headers_and_payload(metadata, bytes(data)),
                                                     sequence_id=sequence_id, publish_time=publish_time,
                                                     deliver_at=delay)
            except Exception as exc:
                raise to_pulsar_error(exc) from exc
        else:
            # The per-message path of a transaction: no call that a test of a field spares.
            if txn.state != "open" and not counted:
                txn._check_open()
            metadata = (message_metadata(self._producer.name, sequence_id, publish_time, **fields).SerializeToString()
                        + txn._metadata_fields)
            topic = self._topic.name
            try:
                # The partition's registration: new, shared with the sends in flight, or again
                # if it failed; none once it succeeded.
                registration = None if topic in txn._registered else txn._register_partition(topic)
                stored = self._topic.publish(self._producer, headers_and_payload(metadata, bytes(data)),
                                             sequence_id=sequence_id, publish_time=publish_time, txn=txn.txn_id,
                                             after=append_condition(txn.txn_id, registration), deliver_at=delay)
            except Exception as exc:
                # refused before it was stored (a delay past the policy's limit, a v5 txn on a
                # v4 topic...): a send of the transaction failed, so its commit must not succeed
                error = to_pulsar_error(exc)
                if counted:
                    txn._operation_ended(error)
                else:
                    txn._fail(error)
                raise error from exc
            if not counted:
                txn._in_flight += 1     # from here the commit waits for it, and aborts if it fails
            try:
                position = await stored
                if registration is not None:
                    # Committed with or before the entry: settled by now, so read rather than
                    # awaited (this is every message of a transaction's first sends).
                    if registration.done():
                        registration.result()       # raises its failure
                    else:
                        await registration
                    txn._registered.add(topic)
            except BaseException as exc:
                txn._operation_ended(exc)
                if isinstance(exc, Exception):
                    raise to_pulsar_error(exc) from exc
                raise
            txn._in_flight -= 1         # _operation_ended(), inlined: this is every message's path
            if not txn._in_flight and txn._settled is not None and not txn._settled.done():
                txn._settled.set_result(None)
        if position is None:
            return MessageId(-1, -1, partition=self._topic.partition_index)
        return MessageId(position.ledger_id, position.entry_id, partition=self._topic.partition_index)

    async def _attached_again(self) -> None:
        """Return when this send may go on: the producer, closed by the broker past a
        producer_request_hold backlog quota or left on its deleted (closed) topic, is attached
        again (one attempt loop for every send held, see `_retried_while_held` and
        `_retried_while_closed`) and the sends held before this one have stored theirs."""
        if self._held_sends is None:
            self._held_sends = deque()
            self._attaching = asyncio.ensure_future(self._attach_again())
        turn = asyncio.get_running_loop().create_future()
        self._held_sends.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._let_next_send_go()        # let go, then cancelled: the next one goes
            elif self._held_sends is not None and turn in self._held_sends:
                self._held_sends.remove(turn)
            raise
        self._let_next_send_go()

    def _let_next_send_go(self) -> None:
        """Let the first held send go on (it lets the next one go once it has stored its
        message); with none left, sends go straight to the topic again."""
        held = self._held_sends
        while held:
            turn = held.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._held_sends = None

    async def _attach_again(self) -> None:
        name = self._producer.name

        async def attach(again: bool) -> Producer:
            if self._topic.closed:
                # Deleted: the topic created again (or loaded again, if its deletion failed), as
                # the network client's producer reconnects to it.
                self._topic = await self._client._attachable_topic(self._topic.name, again=True)
            return await self._client._add_producer(self._topic, name, self._send_timeout_ms)

        try:
            self._producer = await _retried_while_closed(attach, self._client.service, self._send_timeout_ms)
        except BaseException as exc:
            held, self._held_sends = self._held_sends or deque(), None
            error = ClosedError("the producer is closed") if isinstance(exc, asyncio.CancelledError) else exc
            for turn in held:
                if not turn.done():
                    turn.set_exception(error)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._attaching = None
        self._let_next_send_go()

    async def flush(self) -> None:
        """Nothing to do: a send returns once its message is stored (as `pyengine.client`'s
        Producer.flush once every send is)."""
        if self._closed:
            raise ClosedError("the producer is closed")

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._attaching is not None:
                self._attaching.cancel()        # the sends held fail (ClosedError)
            self._topic.remove_producer(self._producer)
            # As a closed consumer: a client kept for the process's life must not hold every
            # producer it ever created.
            if self in self._client._producers:
                self._client._producers.remove(self)


# How an embedded consumer subscribes to a (loaded) topic: its subscription and broker-side consumer.
_SubscribeOn = Callable[["EmbeddedConsumer", Topic], Awaitable[tuple[Subscription, Consumer]]]


class EmbeddedConsumer:
    """Implements the broker's ConsumerSink: delivered entries land in a local receiver queue."""

    def __init__(self, client: EmbeddedClient, topic: Topic, receiver_queue_size: int, *,
                 reader: bool = False, start_inclusive: bool = False, negative_ack_delay_ms: int = 0,
                 batch_receive_policy: ConsumerBatchReceivePolicy | None = None,
                 subscribe_on: _SubscribeOn | None = None) -> None:
        self._client = client
        self._topic = topic
        # How it subscribes to a topic (as it was subscribed first), to attach again when the
        # broker closes its subscription; the attachment under way meanwhile.
        self._subscribe_on = subscribe_on
        self._attaching: asyncio.Task[None] | None = None
        self._nacks = NegativeAckTracker(negative_ack_delay_ms, self._redeliver) if negative_ack_delay_ms else None
        self._queue: deque[Message] = deque()
        # told (None, which message ids; None: all) when messages it delivered come again (asked
        # for again, a redeliver-all, attaching again, a seek): a MultiTopicsConsumer drops the
        # copies it took from this queue already
        self.on_entries_coming_again: Callable[[None, Callable[[MessageId], bool] | None], None] | None = None
        self._queued_bytes = 0                  # payload bytes in the queue (batch receive)
        # receive()'s waiters are woken one per delivered message, batch_receive()'s all at
        # once (one message may not be enough for a batch); every one when the consumer closes.
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._batch_waiters: list[asyncio.Future[None]] = []
        self._batch_receive_policy = check_batch_receive_policy(batch_receive_policy)
        self._queue_size = receiver_queue_size
        self._consumed_since_flow = 0
        self._epoch = NO_CONSUMER_EPOCH                   # PIP-84: raised by each redeliver-all
        self._last_received: MessageId | None = None     # for a reader's has_message_available
        self._start: MessageId | None = None              # a reader's start, or seek's
        self._sought_by_time = False                      # the last seek was by publish time
        # After a reader's start or a seek by id, what is delivered before it is dropped, and it
        # too unless start-inclusive (a reader's setting; never for a consumer). A consumer's
        # (durable) seek drops only the target's entry, as the network client's.
        # `_start_inclusive` is for the current start: a reader attached again resumes once
        # at a point of its own (see closed_by_broker); its seeks follow `_inclusive`.
        self._seek_start: MessageId | None = None
        self._inclusive = self._start_inclusive = reader and start_inclusive
        self._reader = reader
        self._subscription: Subscription | None = None
        self._consumer: Consumer | None = None
        self._closed = False
        self._closed_by: PulsarError | None = None     # why the broker's closing was for good
        self.active = False
        # Exclusive/Failover (and readers, whose subscription is Exclusive), as the network
        # client's: the last entry delivered since the queue last started over (entries come
        # in order there, so one at or before it means the subscription rewound on its own),
        # and the messages handed out and not yet covered by a cumulative ack (a transaction
        # may not ack cumulatively those handed out before such a rewind: see
        # `_check_not_stale`). Set on attach: only where cumulative acks are allowed does
        # every message pay for the tracking.
        self._in_order = False
        self._last_entry: Position | None = None
        self._held = HeldMessages()

    def _attach(self, subscription: Subscription, consumer: Consumer) -> None:
        self._subscription = subscription
        self._consumer = consumer
        self._epoch = consumer.consumer_epoch
        self._in_order = subscription.sub_type in ("exclusive", "failover")
        subscription.flow(consumer, self._queue_size)

    @property
    def topic(self) -> str:
        return self._topic.name

    @property
    def subscription_name(self) -> str:
        assert self._subscription is not None
        return self._subscription.name

    @property
    def consumer_name(self) -> str:
        assert self._consumer is not None
        return self._consumer.name

    # --- ConsumerSink ---------------------------------------------------------------------

    def deliver(self, deliveries: list[Delivery]) -> None:
        consumer = self._consumer
        if consumer is not None and consumer.consumer_epoch < self._epoch:
            # Sent before the rewind asked for (it waits for v5 decisions): it comes again.
            # Its permits go back, as the network client gives back a stale epoch's.
            assert self._subscription is not None
            self._subscription.flow(consumer, sum(delivery.permits for delivery in deliveries))
            return
        in_order = self._in_order
        for delivery in deliveries:
            if in_order:
                self._delivered_in_order(delivery.entry.position)
            try:
                messages = decode_entry(self._topic.name, delivery.entry.position, delivery.entry.data,
                                        partition=self._topic.partition_index,
                                        redelivery_count=delivery.redelivery_count, ack_set=delivery.ack_set)
            except DecodeError as exc:
                self._reject(delivery, exc)
                continue
            for message in messages:
                if self._seek_start is not None and self._before_seek_start(message.message_id):
                    self._credit(1)     # dropped after a seek: as if handed out
                    continue
                self._queue.append(message)
                self._queued_bytes += len(message.data)
                self._wake_one()
        if self._batch_waiters:
            self._wake_batch_waiters()

    def _before_seek_start(self, message_id: MessageId) -> bool:
        start = self._seek_start
        assert start is not None
        if not self._reader and (message_id.ledger_id, message_id.entry_id) != (start.ledger_id, start.entry_id):
            # As the network client's (and the C++ and Java clients'): a consumer's seek filters
            # only the target's own entry; the entries before it that its subscription delivers
            # later (moved back, made again) are its to receive.
            return False
        return before_start(message_id, start, self._start_inclusive)

    def _reject(self, delivery: Delivery, error: DecodeError) -> None:
        """An entry that cannot be decoded (a malformed batch a network producer stored): as
        pyengine.client (and the Java and C++ clients) do, acknowledged and its permits given
        back, rather than left pending here for good, never seen by the application."""
        assert self._subscription is not None and self._consumer is not None
        entry = delivery.entry
        log.warning("%s: undecodable message (%s) acknowledged: %s", self._topic.name, entry.position, error)
        acked = self._subscription.ack_individual(self._consumer, [IndividualAck(entry.position)])
        acked.add_done_callback(_log_failed_reject)
        self._subscription.flow(self._consumer, delivery.permits)

    def _delivered_in_order(self, entry: Position) -> None:
        """An Exclusive/Failover consumer is delivered `entry`: one at or before the last it
        was delivered (since its queue last started over) is the subscription's rewind."""
        last = self._last_entry
        if last is not None and entry <= last:
            self._rewound_by_subscription(entry)
        self._last_entry = entry

    def _rewound_by_subscription(self, entry: Position) -> None:
        """An Exclusive/Failover consumer is delivered `entry` again, or one before the last
        it was delivered, with no redelivery or seek of its own: the subscription rewound on
        its own (an ended transaction's acks given back, say one the coordinator aborted on
        its timeout, which the application hears of only when its commit fails) and delivers
        everything unacknowledged again, in order, under the same epoch. The queued messages
        from `entry` on come again: dropped, their permits given back, as by a redeliver-all
        (kept, they came before the given-back messages, and twice). What the application
        holds is stale, as the network client's after a reconnect: a transaction may not ack
        it cumulatively (the next one would take the new copies and process them again)."""
        queue = self._queue
        dropped = 0
        # The queue is in entry order (so is every delivery here): those from `entry` on are
        # at its end.
        while queue and queue[-1].message_id.position >= entry:
            self._queued_bytes -= len(queue.pop().data)
            dropped += 1
        if dropped:
            assert self._subscription is not None and self._consumer is not None
            self._subscription.flow(self._consumer, self._consumed_since_flow + dropped)
            self._consumed_since_flow = 0
        self._held.sent_again()

    def _check_not_stale(self, message_id: MessageId, txn: EmbeddedTransaction) -> None:
        """A transactional cumulative ack may not cover a message handed out before the
        subscription rewound on its own: it was delivered again since (acked by this ack, the
        next transaction would take the new copy and commit it a second time; the subscription
        cannot tell, an ack naming only where it ends), and earlier messages given back
        meanwhile (the ended transaction's) this ack would take unprocessed. Refused as the
        network client refuses it, and the transaction's commit aborts it (as after any failed
        ack of it): the messages come again."""
        if self._held.covers_stale(message_id):
            error = TransactionConflictError(
                f"cumulative ack of {message_id} on {self._topic.name} covers messages received before the "
                "subscription delivered them again")
            txn._fail(error)
            raise error

    def active_changed(self, active: bool) -> None:
        self.active = active

    def reset(self) -> None:
        self._drop_queued()
        self._consumed_since_flow = 0
        if self._subscription is not None and self._consumer is not None:
            self._subscription.flow(self._consumer, self._queue_size)

    def closed_by_broker(self) -> None:
        """The broker closed the subscription under this consumer: its topic deleted (or closed
        by a deletion that failed), the subscription deleted, the broker closing. As the network
        client's consumer reconnects, it attaches again in the background: to the topic created
        again after its deletion (where topics are created on use) or loaded again, to the
        subscription made again at the initial position if it was deleted; a reader resumes
        at the first message it did not hand out. Its operations wait for it; receive() gets
        what comes then. What was queued is dropped: the subscription delivers it again (a
        durable one kept it unacknowledged). A failure is retried with back-off, as the network
        client reconnects; closed for good when the broker or client is closing (ClosedError),
        or on a failure retrying cannot fix (then its operations raise that failure)."""
        if self._closed or self._attaching is not None:
            return          # (closed under its attachment: that one sees it, and attaches again)
        if self._subscribe_on is None or self._client._closed or self._client.service.closed:
            self._closed_for_good(None)
            return
        if self._reader:
            # As Java's clearReceiverQueue: the first queued message (none handed out past it)
            # inclusive, else after the last handed out; once: its seeks keep its setting.
            if self._queue:
                self._start = self._seek_start = self._queue[0].message_id
                self._start_inclusive, self._sought_by_time = True, False
            elif self._last_received is not None:
                self._start = self._seek_start = self._last_received
                self._start_inclusive = False
        # A durable consumer keeps its seek's filter (its target's entry), as the network client
        # and Java's keep startMessageId across reconnects.
        self._drop_queued()
        self._consumed_since_flow = 0
        self._held.sent_again()     # what the application holds is stale (as after a reconnect)
        self._attaching = asyncio.ensure_future(self._attach_again())

    async def _attach_again(self) -> None:
        assert self._subscribe_on is not None
        subscribe_on, name = self._subscribe_on, self._topic.name

        async def attempt(_again: bool) -> tuple[Topic, Subscription, Consumer]:
            try:
                loaded = await self._client._attachable_topic(name, again=True)
                subscribing = asyncio.ensure_future(subscribe_on(self, loaded))
                try:
                    subscription, consumer = await asyncio.shield(subscribing)
                except asyncio.CancelledError:
                    # Closed meanwhile (close() cancels this): what it attaches is detached then.
                    subscribing.add_done_callback(lambda done: done.cancelled() or done.exception() is not None
                                                  or self._detach(loaded, *done.result()))
                    raise
                if not consumer.connected or loaded.closed:
                    # Closed under it as it attached (deleted again): attached again, as the
                    # network client reconnects after every CLOSE_CONSUMER.
                    self._detach(loaded, subscription, consumer)
                    raise TopicFencedError(f"topic {name} was closed as the consumer attached to it")
            except Exception as exc:
                log.info("%s: attaching again failed: %r", name, exc)
                raise
            return loaded, subscription, consumer

        def closing() -> bool:
            return self._closed or self._client._closed or self._client.service.closed

        try:
            # As the network client's reconnect: a broker's, storage's or metadata store's error
            # (not a fatal one) is retried, until closed; anything else is a bug, not retried.
            loaded, subscription, consumer = await _retried(attempt, _TRANSIENT, 0, give_up=closing,
                                                            fatal=FATAL_ERRORS)
        except BaseException as exc:
            failure = None if closing() or not isinstance(exc, Exception) else to_pulsar_error(exc)
            if failure is not None:
                log.warning("%s of %s: closed by the broker, and attaching it again failed: %r",
                            "reader" if self._reader else "consumer", name, exc)
            self._closed_for_good(failure)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._attaching = None
        if self._closed:            # (close() cancels this task: not seen before this point)
            self._detach(loaded, subscription, consumer)
            return
        self._topic = loaded
        self._attach(subscription, consumer)

    def _closed_for_good(self, cause: PulsarError | None) -> None:
        if not self._closed:
            self._closed = True
            self._closed_by = cause
        self._drop_queued()
        self._wake_all()
        if self._nacks is not None:
            self._nacks.close()
        if self in self._client._consumers:
            self._client._consumers.remove(self)

    async def _attached(self) -> None:
        """Wait while the consumer attaches again (see closed_by_broker), as the network
        client's operations wait for its reconnect: TimeoutError after the operation timeout
        (the attachment goes on trying); ClosedError once it is closed (the failure that closed
        it, if one did)."""
        attaching = self._attaching
        if attaching is not None:
            # its outcome is the consumer's state
            done, _ = await asyncio.wait([attaching], timeout=_OPERATION_TIMEOUT_MS / 1000)
            if not done:
                raise TimeoutError(f"the consumer of {self._topic.name} did not attach again within the operation "
                                   f"timeout ({_OPERATION_TIMEOUT_MS} ms)")
        self._check_open()

    # --- API ------------------------------------------------------------------------------

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message (raises TimeoutError after `timeout` seconds)."""
        check_timeout("timeout", timeout)
        self._check_open()
        return await receive_queued(self._take_if_any, self._waiters, self._check_open, timeout)

    async def read_next(self, timeout: float | None = None) -> Message:
        """A reader's next message (`receive`), as `pyengine.client.Reader.read_next`."""
        return await self.receive(timeout)

    # What a MultiTopicsConsumer asks of the consumer of each of its topics (see
    # `pyengine.client.Consumer._receive_for_parent`); the embedded client has no ack timeout
    # whose clock the parent would start.
    async def _receive_for_parent(self) -> tuple[None, Message]:
        return None, await self.receive()

    def _track(self, handler: None, message: Message) -> None:
        pass

    async def batch_receive(self) -> list[Message]:
        """The messages queued once the `batch_receive_policy` given to subscribe has enough
        (`max_num_message` or `max_num_bytes`), or when its `timeout_ms` has passed: then
        whatever is queued, maybe none. As `pyengine.client.Consumer.batch_receive`: at most
        `max_num_message` messages and `max_num_bytes` bytes, but always at least one queued."""
        self._check_open()
        policy = self._batch_receive_policy.within(self._queue_size)
        # A full receiver queue gets no more messages: enough too, or a larger max_num_message
        # would wait for ever without a timeout.
        return await receive_batch(
            lambda: self._queue[0] if self._queue else None, self._take_if_any,
            lambda: policy.enough(len(self._queue), self._queued_bytes) or len(self._queue) >= self._queue_size,
            self._batch_waiters, self._check_open, policy)

    def _take(self) -> Message:
        """The queue's first message, handed out: the broker gets the permits back by halves."""
        message = self._queue.popleft()
        self._queued_bytes -= len(message.data)
        self._last_received = message.message_id
        if self._in_order:
            self._held.handed_out(message.message_id)
        self._consumed_since_flow += 1
        if self._consumed_since_flow >= max(1, self._queue_size // 2):
            assert self._subscription is not None and self._consumer is not None
            self._subscription.flow(self._consumer, self._consumed_since_flow)
            self._consumed_since_flow = 0
        return message

    def _take_if_any(self) -> Message | None:
        return self._take() if self._queue else None

    def _drop_queued(self) -> None:
        """The queue starts over (a redeliver-all, a seek, the consumer closed): what comes
        next may be before what came last."""
        self._queue.clear()
        self._queued_bytes = 0
        self._last_entry = None
        if self.on_entries_coming_again is not None:
            self.on_entries_coming_again(None, None)

    def _drop_queued_entries(self, entries: set[Position]) -> None:
        """Take the queued messages of `entries` (not handed out yet) out of the queue, their
        permits given back as if handed out."""
        kept: list[Message] = []
        dropped = 0
        for message in self._queue:
            if message.message_id.position in entries:
                self._queued_bytes -= len(message.data)
                dropped += 1
            else:
                kept.append(message)
        if dropped:
            self._queue.clear()
            self._queue.extend(kept)
            self._credit(dropped)
        if self.on_entries_coming_again is not None:
            self.on_entries_coming_again(None, lambda message_id: message_id.position in entries)

    def _wake_one(self) -> None:
        wake_one(self._waiters)

    def _wake_batch_waiters(self) -> None:
        wake_all(self._batch_waiters)

    def _wake_all(self) -> None:
        wake_all(self._waiters)
        wake_all(self._batch_waiters)

    def _message_id(self, message: Message | MessageId) -> MessageId:
        message_id = message.message_id if isinstance(message, Message) else message
        if not isinstance(message_id, MessageId):
            raise TypeError(f"expected a Message or MessageId, not {type(message).__name__}")
        # A received message's id names its topic: one of another topic would (n)ack whatever
        # sits at its position here; refused as pyengine.client (and pulsar-client-cpp) does.
        if message_id.topic_name and message_id.topic_name != self._topic.name:
            raise ValueError(f"message id {message_id} is of {message_id.topic_name}, not of {self._topic.name}")
        return message_id

    def _checked_batch(self, message_id: MessageId) -> None:
        """A batched message's id names an index of its batch and the batch's size as the
        broker knows it: checked before an ack set is built from them (a size of hundreds of
        millions took seconds and gigabytes before the broker refused it; an index past the
        size raised IndexError)."""
        assert self._subscription is not None
        if not 0 <= message_id.batch_index < message_id.batch_size:
            raise NotAllowedError(f"message id {message_id}: batch index {message_id.batch_index} is not in a "
                                  f"batch of {message_id.batch_size}")
        self._subscription.check_batch_size(self._consumer, message_id.position, message_id.batch_size)

    @staticmethod
    def _refused_in(txn: EmbeddedTransaction | None, build: Callable[[MessageId], _T], message_id: MessageId) -> _T:
        """`build(message_id)`; a refusal fails `txn` too (its commit), as a refused ack does."""
        try:
            return build(message_id)
        except NotAllowedError as exc:
            if txn is not None:
                txn._refused(exc)
            raise

    def _individual_ack(self, message_id: MessageId) -> IndividualAck:
        if message_id.batch_index < 0:
            return IndividualAck(message_id.position)
        self._checked_batch(message_id)
        size = message_id.batch_size
        words = [w & _MASK64 for w in ackset_new(size)]
        words[message_id.batch_index // 64] &= ~(1 << (message_id.batch_index % 64))
        return IndividualAck(message_id.position, size, tuple(_signed(w) for w in words))

    async def _attached_for(self, txn: EmbeddedTransaction | None) -> None:
        """`_attached`, for an ack: one of a transaction refused here (a closed consumer) fails
        the transaction's commit, as the network client's."""
        try:
            await self._attached()
        except Exception as exc:
            if isinstance(txn, EmbeddedTransaction):
                txn._fail(exc)
            raise

    async def acknowledge(self, message: Message | MessageId, txn: EmbeddedTransaction | None = None) -> None:
        await self._attached_for(txn)
        assert self._subscription is not None
        message_id = self._message_id(message)
        if txn is not None:
            _check_txn(txn, self._client.service)
        ack = self._refused_in(txn, self._individual_ack, message_id)
        try:
            if txn is None:
                await self._subscription.ack_individual(self._consumer, [ack])
                return
            txn._check_open()
            registration = txn._register_subscription(self._topic.name, self._subscription.name)
            operation = asyncio.ensure_future(self._subscription.ack_with_transaction(
                self._consumer, txn.txn_id, acks=[ack], after=append_condition(txn.txn_id, registration)))
            txn._track(registration, operation)     # the commit waits for them, whatever happens here
            await registration
            await operation
        except Exception as exc:
            raise to_pulsar_error(exc) from exc

    async def acknowledge_cumulative(self, message: Message | MessageId,
                                     txn: EmbeddedTransaction | None = None) -> None:
        """Acknowledge everything up to and including `message`. Inside a batch, the batch's
        indexes up to it are acknowledged too (batch-index acknowledgement, as for `acknowledge`
        and as the network path takes a cumulative ack with an ack set): in a transaction, the
        messages before it in its batch must not come back once it commits."""
        subscription = self._subscription
        if subscription is not None and subscription.sub_type in ("shared", "key_shared"):
            # first of all, as the network client
            raise CumulativeAcknowledgementNotAllowedError(
                f"cumulative acknowledgement is not allowed on a {subscription.sub_type} subscription")
        await self._attached_for(txn)
        subscription = self._subscription       # (another, if it was attached again meanwhile)
        assert subscription is not None
        message_id = self._message_id(message)
        if txn is not None:
            _check_txn(txn, self._client.service)
        in_batch = 0 <= message_id.batch_index < message_id.batch_size - 1
        if message_id.batch_index >= 0:        # (the last index of a batch acks the whole entry)
            self._refused_in(txn, self._checked_batch, message_id)
        ack = self._batch_prefix_ack(message_id) if in_batch else None
        try:
            if txn is None:
                self._held.covered_up_to(message_id)
                if ack is None:
                    await subscription.ack_cumulative(self._consumer, message_id.position)
                else:               # everything before the entry, and the entry's indexes up to it
                    before = self._topic.ledger.previous_position(message_id.position)
                    await asyncio.gather(subscription.ack_cumulative(self._consumer, before),
                                         subscription.ack_individual(self._consumer, [ack]))
                return
            txn._check_open()
            if self not in txn._cumulative_consumers:
                txn._cumulative_consumers.append(self)      # rewound by an abort (see abort)
            self._check_not_stale(message_id, txn)
            registration = txn._register_subscription(self._topic.name, subscription.name)
            after = append_condition(txn.txn_id, registration)
            operation = asyncio.ensure_future(
                subscription.ack_with_transaction(self._consumer, txn.txn_id, cumulative=message_id.position,
                                                  after=after)
                if ack is None else
                subscription.ack_cumulative_in_batch_with_transaction(self._consumer, txn.txn_id, ack, after=after))
            txn._track(registration, operation)     # the commit waits for them, whatever happens here
            await registration
            await operation
            self._held.covered_up_to(message_id)
        except Exception as exc:
            raise to_pulsar_error(exc) from exc

    def _batch_prefix_ack(self, message_id: MessageId) -> IndividualAck:
        """The entry of a batched message with its indexes up to the message acknowledged."""
        size, index = message_id.batch_size, message_id.batch_index
        words = [w & _MASK64 for w in ackset_new(size)]
        for word in range(index // 64 + 1):          # clear bits 0..index (a clear bit is acked)
            bits = 64 if word < index // 64 else index % 64 + 1
            words[word] &= ~((1 << bits) - 1) & _MASK64
        return IndividualAck(message_id.position, size, tuple(_signed(w) for w in words))

    async def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Ask for the message again: redelivered, with a higher redelivery count, once the
        consumer's negative-ack delay has passed (its whole entry, as Pulsar redelivers)."""
        await self._attached()
        message_id = self._message_id(message)
        if self._nacks is None:
            self._redeliver(self, [message_id])
        else:
            self._nacks.add(self, message_id)

    def _redeliver(self, _owner: object, message_ids: list[MessageId]) -> None:
        if self._closed or self._attaching is not None or self._subscription is None or self._consumer is None:
            return          # (attached again, the subscription delivers everything unacked again)
        if self._subscription.sub_type in ("shared", "key_shared"):
            # Their entries come again: the copies still queued are dropped first (kept, each
            # was handed out twice), their permits given back, as the network client's
            # _drop_queued_entries (Java's removeExpiredMessagesFromQueue).
            self._drop_queued_entries({m.position for m in message_ids})
            self._subscription.redeliver_unacknowledged(self._consumer, [m.position for m in message_ids])
        else:
            # As pulsar-client (and the wire server): on Exclusive and Failover, asking for
            # some messages again asks for everything unacknowledged, so they come in order.
            self._redeliver_all()

    async def redeliver_unacknowledged_messages(self) -> None:
        await self._attached()
        rewound = self._redeliver_all()
        if rewound is not None:
            await rewound

    def _redeliver_all(self) -> asyncio.Future[None] | None:
        """Have everything unacknowledged delivered again; a future when the subscription's
        rewind waits (a v5 one applying its transactions' decisions first), else None.
        Nothing to do while it attaches again: its new subscription delivers all of it."""
        if self._attaching is not None:
            return None
        assert self._subscription is not None and self._consumer is not None
        # The queued messages are dropped (they come again): their permits go back to the
        # broker with the consumed ones, as the Java client's increaseAvailablePermits.
        dropped = len(self._queue)
        self._drop_queued()
        # PIP-84, as the network client: what the broker delivers before it rewinds carries
        # the older epoch and is dropped as it arrives (see deliver).
        self._epoch += 1
        rewound = self._subscription.redeliver_unacknowledged(self._consumer, epoch=self._epoch)
        self._subscription.flow(self._consumer, self._consumed_since_flow + dropped)
        self._consumed_since_flow = 0
        return rewound

    async def seek(self, target: MessageId | int) -> None:
        """Move the subscription to a message id, or to a publish timestamp in ms. A
        read-compacted consumer's seek by time also looks in the compacted view (it may hold
        entries of ledgers trimmed since), as the wire server's SEEK does."""
        await self._attached()
        if isinstance(target, bool) or not isinstance(target, (MessageId, int)):
            raise TypeError(f"seek takes a MessageId or a timestamp in ms, not {type(target).__name__}")
        if isinstance(target, int) and not 0 <= target < 1 << 64:
            raise ValueError(f"a seek timestamp is in ms since the epoch, >= 0 and < 2**64, not {target}")
        if isinstance(target, MessageId) and target.topic_name and target.topic_name != self._topic.name:
            raise ValueError(f"message id {target} is of {target.topic_name}, not of {self._topic.name}")
        subscription = self._subscription
        assert subscription is not None
        earliest: bool | None = None
        if isinstance(target, int):
            position = self._topic.ledger.find_by_publish_time(target)
            earliest = False
            if any(getattr(c, "read_compacted", False) for c in subscription.consumers):
                position = self._topic.compaction.find_by_publish_time(target, position)
        elif target == MessageId.earliest:
            position = self._topic.ledger.first_position()
            earliest = True
        elif target == MessageId.latest:
            position = self._topic.ledger.lac.next()
        else:
            position = self._message_id(target).position
        # As pulsar-client: the cursor goes to the id's entry and what follows the id comes next
        # (a start-inclusive reader reads the id's message again). Set first: the new
        # position's deliveries may come before the seek returns.
        previous = self._seek_start, self._start_inclusive
        self._seek_start = target if isinstance(target, MessageId) else None
        self._start_inclusive = self._inclusive
        ack_set = None
        if isinstance(target, MessageId) and position == Position(target.ledger_id, target.entry_id):
            ack_set = seek_ack_set(target)      # into a batch: its earlier indexes acknowledged
        try:
            await subscription.seek(position, earliest=earliest, ack_set=ack_set)
        except BaseException as exc:
            self._seek_start, self._start_inclusive = previous
            if isinstance(exc, Exception):  # a save that failed: PersistenceError, as the wire answers
                raise to_pulsar_error(exc) from exc
            raise
        self._last_received = None
        self._start = target if isinstance(target, MessageId) else None
        self._sought_by_time = not isinstance(target, MessageId)

    def _credit(self, permits: int) -> None:
        """Messages dropped before the queue (after a seek): their permits come back as if
        they had been handed out. (A batch's indexes acknowledged already took none.)"""
        self._consumed_since_flow += permits
        if self._consumed_since_flow >= max(1, self._queue_size // 2):
            assert self._subscription is not None and self._consumer is not None
            self._subscription.flow(self._consumer, self._consumed_since_flow)
            self._consumed_since_flow = 0

    async def has_message_available(self) -> bool:
        """A reader's: whether a message after the last one read is stored (and so will be
        read), as `pyengine.client.Reader.has_message_available`; a read-compacted reader
        goes by the compacted view (see `get_last_message_id`)."""
        await self._attached()
        if self._queue:
            return True
        last = await self.get_last_message_id()
        if self._last_received is None and last.entry_id >= 0:
            if self._sought_by_time:
                # The seek's time names no message: as the C++ client (and the wire reader), whether
                # the subscription's position is before the last message.
                assert self._subscription is not None
                return position_before_last(self._subscription.cursor.mark_delete, last)
            if self._start == MessageId.latest and self._start_inclusive:
                await self.seek(last)               # as the C++ client: the last message is read next
                return True
        return has_more(last, self._last_received, self._start, self._start_inclusive)

    async def get_last_message_id(self) -> MessageId:
        """The id of the last message stored on the topic; for a read-compacted consumer with
        nothing after the compaction horizon, the compacted view's last (as the wire server
        answers GET_LAST_MESSAGE_ID: else a reader would wait for a compacted-out message)."""
        await self._attached()
        position, batch_size = self._topic.last_message_position()
        batch_index = batch_size - 1 if batch_size > 1 else -1
        if getattr(self._consumer, "read_compacted", False):
            position, batch_index = self._topic.compaction.last_message_position(position, batch_index)
        return MessageId(position.ledger_id, position.entry_id, batch_index, self._topic.partition_index)

    async def unsubscribe(self) -> None:
        """Delete the subscription and close. Refused while it has other consumers (as Apache:
        MetadataError), and the consumer stays open then, as the network client's."""
        await self._attached()
        subscription = self._subscription
        assert subscription is not None
        if not self._reader:
            subscription.check_unsubscribe_by(self._consumer)
        await self.close()
        if not self._reader:
            try:
                await self._topic.unsubscribe(subscription.name)
            except Exception as exc:        # a deletion not written: PersistenceError, as the wire answers
                raise to_pulsar_error(exc) from exc

    async def close(self) -> None:
        if self._closed:
            self._closed_by = None      # closed by the application now (ClosedError), as the network client's
            return
        self._closed_for_good(None)
        if self._attaching is not None:
            self._attaching.cancel()        # (what it attaches meanwhile is detached)
        elif self._subscription is not None and self._consumer is not None:
            self._detach(self._topic, self._subscription, self._consumer)

    def _detach(self, topic: Topic, subscription: Subscription, consumer: Consumer) -> None:
        subscription.remove_consumer(consumer)
        if self._reader:
            topic.unsubscribe_reader(subscription)

    def _check_open(self) -> None:
        if self._closed:
            if self._closed_by is not None:
                # As the network client's: the failure, not AlreadyClosedError (which a
                # MultiTopicsConsumer takes for closed by itself: it subscribes a failed one again).
                raise self._closed_by
            raise ClosedError("the consumer is closed")


_MASK64 = (1 << 64) - 1


def _log_failed_reject(acked: asyncio.Future[None]) -> None:
    if not acked.cancelled() and acked.exception() is not None:
        log.warning("acknowledging an undecodable message failed: %s", acked.exception())


def _check_read_compacted(value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"read_compacted must be a bool, not {type(value).__name__}")


def _signed(word: int) -> int:
    return word - (1 << 64) if word >= 1 << 63 else word
