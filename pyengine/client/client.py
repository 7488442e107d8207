"""`Client`: the asyncio Pulsar client, with transactions.

    async with Client("pulsar://127.0.0.1:6650") as client:
        txn = await client.new_transaction(timeout_ms=60_000)
        producer = await client.create_producer("persistent://public/default/out")
        consumer = await client.subscribe("persistent://public/default/in", "sub",
                                          consumer_type="exclusive", initial_position="earliest")
        msg = await consumer.receive()
        await producer.send(b"...", txn=txn)
        await consumer.acknowledge(msg, txn=txn)
        await txn.commit()

The method names and semantics are those of the embedded client (`Broker.embedded()`), so code
written against one runs against the other.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import re
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TypeVar

from pyengine.client.config import ClientConfig
from pyengine.client.consumer import Consumer, ConsumerBatchReceivePolicy, ConsumerKeySharedPolicy, ConsumerOptions
from pyengine.client.coordinator import TransactionCoordinatorClient
from pyengine.client.dead_letter import ConsumerDeadLetterPolicy, DeadLetterSender
from pyengine.client.errors import AlreadyClosedError
from pyengine.client.handler import close_all, start_all
from pyengine.client.key_batching import BatchingType
from pyengine.client.lookup import LookupService
from pyengine.client.message import MessageId
from pyengine.concurrency import RunOnce
from pyengine.client.pattern import MultiTopicsConsumer, subscribe_target
from pyengine.client.pool import ConnectionPool
from pyengine.client.producer import CompressionType, PartitionProducer, Producer, ProducerOptions
from pyengine.client.reader import Reader
from pyengine.client.router import check_hashing_scheme
from pyengine.client.scalable import CheckpointConsumer, DagWatch, QueueConsumer, ScalableProducer, StreamConsumer
from pyengine.client.transaction import Transaction
from pyengine.client.url import parse_service_url
from pyengine.client.validation import check_int, check_name, check_topic
from pyengine.errors import NotAllowedError
from pyengine.naming import TopicName
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command
from pyengine.protocol.schema_codec import schema_from_proto
from pyengine.schema import SchemaData, SchemaInfo, decode_version, encode_version
from pyengine.transaction.coordinator.keys import check_transaction_key

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# the create_producer options a scalable producer passes on to each segment's producer
_SCALABLE_PRODUCER_OPTIONS = frozenset({
    "producer_name", "batching_enabled", "batching_max_messages", "batching_max_allowed_size_in_bytes",
    "batching_max_publish_delay_ms", "max_pending_messages", "block_if_queue_full", "send_timeout_ms",
    "compression_type", "batching_type"})


def check_partitions_update_interval(value: Any) -> None:
    """Seconds, a finite number >= 0 (0 turns the updates off, as the C++ client's 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"partitions_update_interval must be a number of seconds, not {type(value).__name__}")
    if not 0 <= value < float("inf"):
        raise ValueError(f"partitions_update_interval must be a finite number of seconds >= 0 (0: off), "
                         f"not {value!r}")


class ClientCore:
    """What producers, consumers and coordinator handlers share: settings, connections,
    lookups and the client-wide id counters."""

    def __init__(self, service_url: str, config: ClientConfig, transaction_key: str | None = None,
                 partitions_update_interval: float = 60.0) -> None:
        self.config = config
        # seconds between re-reads of a partitioned topic's partition count (0: never)
        self.partitions_update_interval = partitions_update_interval
        self.pool = ConnectionPool(config)
        self.lookup = LookupService(self.pool, parse_service_url(service_url), config)
        self._producer_ids = itertools.count()
        self._consumer_ids = itertools.count()
        self.open_objects: list[Producer | Consumer] = []
        self.coordinator = TransactionCoordinatorClient(self, transaction_key)

    def new_producer_id(self) -> int:
        return next(self._producer_ids)

    def new_consumer_id(self) -> int:
        return next(self._consumer_ids)

    async def topics_of_namespace(self, namespace: str, mode: int) -> list[str]:
        """The topics of `namespace` (GET_TOPICS_OF_NAMESPACE, asked of the service URL's broker
        as Pulsar's clients do; `mode`: CommandGetTopicsOfNamespace.Mode), partitions by name.
        A host that cannot be reached is passed over for the next (`LookupService.retrying`)."""
        async def attempt() -> list[str]:
            connection = await self.pool.get(self.lookup.service_address())
            cmd = base_command(pb.BaseCommand.GET_TOPICS_OF_NAMESPACE, request_id=connection.new_request_id(),
                               namespace=namespace, mode=mode)
            response = await connection.request(cmd, self.config.operation_timeout)
            return list(response.topics)

        return await self.lookup.retrying(f"topics of {namespace}", attempt)

    def forget(self, closed: Producer | Consumer) -> None:
        if closed in self.open_objects:
            self.open_objects.remove(closed)


class Client:
    def __init__(self, service_url: str, *, operation_timeout_seconds: float = 30.0,
                 connection_timeout_ms: int = 10_000, keep_alive_interval_seconds: float = 30.0,
                 transaction_key: str | None = None, partitions_update_interval: float = 60) -> None:
        """`partitions_update_interval` (the C++ client's partitionsUpdateInterval, seconds; 0:
        off): how often producers and consumers of a partitioned topic read its partition count
        again, to produce to and consume from the partitions added since (never fewer).

        `transaction_key` (pip-transaction-key-fencing): this client's transactions belong to
        the key; its first transaction request takes the key's next epoch, which aborts the
        open transaction of any earlier client with the key and fences that client (its later
        sends, acks and ends raise ExpiredTransactionError). One open transaction per key.
        Not empty, at most 256 characters, no '&' (InvalidTransactionKeyError)."""
        check_int("connection_timeout_ms", connection_timeout_ms, 1)
        check_partitions_update_interval(partitions_update_interval)
        if transaction_key is not None:
            check_transaction_key(transaction_key)
        config = ClientConfig(operation_timeout=operation_timeout_seconds,
                              connection_timeout=connection_timeout_ms / 1000,
                              keep_alive_interval=keep_alive_interval_seconds)
        self._core = ClientCore(service_url, config, transaction_key, float(partitions_update_interval))
        self._closed = False
        self._closing = RunOnce(self._close)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosedError("the client is closed")

    async def _opened(self, obj: _T) -> _T:
        """Keep `obj` (a producer, consumer, reader just made) among the client's open objects;
        if the client was closed while it was being made, close it and raise AlreadyClosed, as
        the Java and C++ clients fail creations under way at close (found by an audit: the
        object came back "ready" on a dead connection, its sends never settled)."""
        if self._closed:
            await obj.close()  # type: ignore[attr-defined]
            raise AlreadyClosedError("the client was closed while the producer or consumer was being created")
        self._core.open_objects.append(obj)  # type: ignore[arg-type]
        return obj

    async def get_topic_partitions(self, topic: str) -> list[str]:
        """The partitions of `topic` (the topic itself when it is not partitioned)."""
        self._check_open()
        name = check_topic(topic)
        partitions = await self._core.lookup.partitions(name)
        if partitions == 0:
            return [name]
        parsed = TopicName.parse(name)
        return [str(parsed.partition(i)) for i in range(partitions)]

    async def create_producer(self, topic: str, *, producer_name: str | None = None, batching_enabled: bool = False,
                              batching_max_messages: int = 1000,
                              batching_max_allowed_size_in_bytes: int = 128 * 1024,
                              batching_max_publish_delay_ms: int = 10, max_pending_messages: int = 1000,
                              block_if_queue_full: bool = True, send_timeout_ms: int = 30_000,
                              initial_sequence_id: int | None = None, schema: SchemaData | None = None,
                              compression_type: CompressionType | str = CompressionType.NONE,
                              initial_subscription_name: str | None = None,
                              chunking_enabled: bool = False,
                              batching_type: BatchingType | str = BatchingType.Default,
                              hashing_scheme: str = "murmur3_32") -> Producer:
        """A producer on `topic` (on every partition of a partitioned topic). For a scalable
        `topic://` name: a ScalableProducer routing each key to its active segment. A `schema`
        (pyengine.schema.SchemaData) is registered with the topic's schema registry (or found
        there: `Producer.schema_version`); an incompatible one raises IncompatibleSchemaError.
        Payloads stay bytes: encoding them is the caller's. `compression_type` (CompressionType,
        its name in any case, or pulsar-client's enum) compresses each batch, or each message sent
        alone, as Pulsar's clients do; the size limit applies to the compressed payload.
        `initial_subscription_name` (Pulsar's initialSubscriptionName): the broker creates that
        durable subscription, at the earliest position, with the producer if the topic (each
        partition) has none of that name, so what is sent before any consumer is kept.
        `chunking_enabled` (pulsar-client's; not with batching: ValueError): a message whose
        payload, compressed, is over the broker's max_message_size is sent as several chunks,
        which consumers put back together (see pyengine.client.chunks). `batching_type`
        (pulsar-client's; BatchingType, its name such as "key_based", or pulsar.BatchingType):
        KeyBased batches messages by key, one entry per key, so that a Key_Shared subscription
        gives each key's messages to one consumer, in order (see pyengine.client.key_batching).
        `hashing_scheme` (Pulsar's hashingScheme): the key hash that picks a keyed message's
        partition, "murmur3_32" (Murmur3_32Hash) or "java_string" (JavaStringHash, the Java
        client's default; use it to share keys' partitions with Java producers at their
        defaults); Pulsar's names are taken too (see pyengine.client.router)."""
        self._check_open()
        name = check_topic(topic)
        if TopicName.parse(name).is_scalable:
            if check_hashing_scheme(hashing_scheme) != "murmur3_32":
                raise ValueError("a scalable topic:// producer routes keys by its segments' Murmur3 hash ranges: "
                                 "hashing_scheme cannot be changed")
            if initial_subscription_name is not None:
                raise ValueError("initial_subscription_name is not supported on scalable topic:// producers")
            if chunking_enabled:
                raise ValueError("chunking_enabled is not supported on scalable topic:// producers")
            # every option goes to the segment producers (or is refused there): none is dropped
            return await self.create_scalable_producer(  # type: ignore[return-value]
                name, producer_name=producer_name, batching_enabled=batching_enabled,
                batching_max_messages=batching_max_messages,
                batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
                batching_max_publish_delay_ms=batching_max_publish_delay_ms,
                max_pending_messages=max_pending_messages, block_if_queue_full=block_if_queue_full,
                send_timeout_ms=send_timeout_ms, initial_sequence_id=initial_sequence_id, schema=schema,
                compression_type=compression_type, batching_type=batching_type)
        options = ProducerOptions(producer_name, batching_enabled, batching_max_messages,
                                  batching_max_allowed_size_in_bytes, batching_max_publish_delay_ms,
                                  max_pending_messages, block_if_queue_full, send_timeout_ms, initial_sequence_id,
                                  schema, compression_type,
                                  initial_subscription_name=initial_subscription_name,
                                  chunking_enabled=chunking_enabled, batching_type=batching_type,
                                  hashing_scheme=hashing_scheme)
        partitions = await self._core.lookup.partitions(name)
        parsed = TopicName.parse(name)
        handlers = ([PartitionProducer(self._core, str(parsed.partition(i)), i, options) for i in range(partitions)]
                    if partitions > 0 else [PartitionProducer(self._core, name, -1, options)])
        try:
            await start_all(handlers)
        except BaseException:
            # Failed or cancelled: the partitions the broker already created are closed too.
            await close_all(handlers)
            raise
        producer = Producer(self._core, name, handlers, options, partitioned=partitions > 0)
        return await self._opened(producer)

    async def watch_scalable_topic(self, topic: str) -> DagWatch:
        """A DAG watch of a `topic://` scalable topic (its `layout` stays current)."""
        self._check_open()
        watch = await DagWatch(self._core, check_topic(topic)).start()
        return watch

    async def create_scalable_producer(self, topic: str, **producer_options: Any) -> ScalableProducer:
        """A producer of a `topic://` scalable topic: each key goes to the active segment holding
        its hash; sends are re-routed after a split or merge. Options: create_producer's, each
        given to every segment's producer; refused here (before anything is opened) are an
        unknown option, a `schema` and an `initial_sequence_id` (sequence ids are per segment,
        and a re-routed send gets the next one of the child's producer)."""
        self._check_open()
        unknown = sorted(set(producer_options) - _SCALABLE_PRODUCER_OPTIONS - {"schema", "initial_sequence_id"})
        if unknown:
            raise TypeError(f"unknown producer options: {', '.join(unknown)}")
        if producer_options.pop("schema", None) is not None:
            raise ValueError("schemas are not supported on scalable topic:// producers")
        if producer_options.pop("initial_sequence_id", None) is not None:
            raise ValueError("initial_sequence_id is not supported on scalable topic:// producers: "
                             "sequence ids are per segment")
        ProducerOptions(**producer_options)          # the values are checked now, not at the first send
        watch = await self.watch_scalable_topic(topic)
        producer = ScalableProducer(self, watch, producer_options)
        return await self._opened(producer)

    async def subscribe_queue(self, topic: str, subscription_name: str, *, receiver_queue_size: int = 1000,
                              consumer_name: str | None = None) -> QueueConsumer:
        """A QueueConsumer of a `topic://` scalable topic: Shared on every segment, no controller."""
        # checked now, as subscribe does: the segments' consumers get them later
        ConsumerOptions(subscription_name, receiver_queue_size=receiver_queue_size, consumer_name=consumer_name)
        watch = await self.watch_scalable_topic(topic)
        consumer = QueueConsumer(self, watch, subscription_name,
                                 {"receiver_queue_size": receiver_queue_size, "consumer_name": consumer_name})
        try:
            await consumer._start()
        except BaseException:
            await consumer.close()
            raise
        return await self._opened(consumer)

    async def subscribe_stream(self, topic: str, subscription_name: str, consumer_name: str, *,
                               receiver_queue_size: int = 1000) -> StreamConsumer:
        """A StreamConsumer of a `topic://` scalable topic: ordered per key, its segments assigned
        by the controller leader to the subscription's consumers (by name, kept across
        reconnects within the grace period)."""
        # checked now: a segment's subscribe gets them only once one is assigned (maybe never)
        ConsumerOptions(subscription_name, receiver_queue_size=receiver_queue_size, consumer_name=consumer_name)
        check_name("consumer_name", consumer_name)
        watch = await self.watch_scalable_topic(topic)
        consumer = StreamConsumer(self, watch, subscription_name, consumer_name,
                                  {"receiver_queue_size": receiver_queue_size})
        try:
            await consumer._register()
        except BaseException:
            await consumer.close()
            raise
        return await self._opened(consumer)

    async def subscribe_checkpoint(self, topic: str, subscription_name: str, consumer_name: str, *,
                                   checkpoint: dict[int, MessageId] | None = None) -> CheckpointConsumer:
        """A CheckpointConsumer of a `topic://` scalable topic: assigned by the controller like a
        StreamConsumer, reading from `checkpoint` (a previous consumer's `checkpoint()`) on."""
        check_name("subscription_name", subscription_name)
        check_name("consumer_name", consumer_name)
        if checkpoint is not None and not isinstance(checkpoint, dict):
            raise TypeError("checkpoint is a dict of segment id to MessageId (CheckpointConsumer.checkpoint())")
        for sid in checkpoint or {}:
            # a key that is no segment id (a str, once saved as JSON) would match no segment,
            # and the consumer would read everything from the start again, silently
            if not isinstance(sid, int) or isinstance(sid, bool) or sid < 0:
                raise TypeError(f"checkpoint keys are segment ids (ints >= 0), not {sid!r}")
        watch = await self.watch_scalable_topic(topic)
        try:
            consumer = CheckpointConsumer(self, watch, subscription_name, consumer_name, {}, checkpoint)
        except BaseException:
            await watch.close()
            raise
        try:
            await consumer._register()
        except BaseException:
            await consumer.close()      # unregistered, its readers and the watch closed
            raise
        return await self._opened(consumer)

    async def subscribe(self, topic: str | list[str] | re.Pattern[str], subscription_name: str, *,
                        consumer_type: str = "exclusive",
                        initial_position: str = "latest", receiver_queue_size: int = 1000,
                        consumer_name: str | None = None, priority: int = 0,
                        negative_ack_redelivery_delay_ms: int = 60_000,
                        batch_index_ack_enabled: bool = True, schema: SchemaData | None = None,
                        read_compacted: bool = False, unacked_messages_timeout_ms: int | None = None,
                        dead_letter_policy: ConsumerDeadLetterPolicy | None = None,
                        max_pending_chunked_message: int = 10,
                        auto_ack_oldest_chunked_message_on_queue_full: bool = False,
                        expire_time_of_incomplete_chunked_message_ms: int = 60_000,
                        pattern_auto_discovery_period: float = 60,
                        batch_receive_policy: ConsumerBatchReceivePolicy | None = None,
                        key_shared_policy: ConsumerKeySharedPolicy | None = None,
                        max_total_receiver_queue_size_across_partitions: int = 50_000,
                        subscription_properties: Mapping[str, str] | None = None,
                        ) -> Consumer | MultiTopicsConsumer:
        """Subscribe to `topic` (every partition of a partitioned topic). A message of a batch
        is acknowledged by its index (`batch_index_ack_enabled`, which this broker supports);
        turned off, a batch is acknowledged once all its messages are, for brokers without
        batch-index acknowledgements. A `schema` must be able to read the topic's (it becomes
        the topic's first schema only on an idle topic); IncompatibleSchemaError otherwise.
        `read_compacted`: read the topic's compacted view (the latest message of each key up to
        the last compaction), then what came after it (Exclusive and Failover only).

        `unacked_messages_timeout_ms` (pulsar-client's ack timeout; 0 or None: off, otherwise at
        least 10000): a received message not acknowledged within it is redelivered (its id for
        Shared / Key_Shared, everything unacknowledged for Exclusive / Failover), checked every
        second. `dead_letter_policy` (ConsumerDeadLetterPolicy, or pulsar-client's): a message
        redelivered more than `max_redeliver_count` times goes to the dead letter topic and is
        acknowledged (see pyengine.client.dead_letter).

        Chunked messages (see pyengine.client.chunks) are put back together, as pulsar-client
        does: at most `max_pending_chunked_message` incomplete ones at a time (0: no limit; the
        oldest is dropped, and acknowledged if `auto_ack_oldest_chunked_message_on_queue_full`),
        and one whose next chunk does not come within `expire_time_of_incomplete_chunked_message_ms`
        (0: never) is dropped and its chunks acknowledged.

        `batch_receive_policy` (ConsumerBatchReceivePolicy, or pulsar-client's): when
        `batch_receive()` returns (so many messages or bytes, or its timeout).

        `key_shared_policy` (ConsumerKeySharedPolicy, or pulsar-client's; Key_Shared only, as
        pulsar-client): AutoSplit or Sticky mode (with its hash ranges), and whether the broker
        may deliver a key out of order while the consumers change (allow_out_of_order_delivery).

        On a partitioned topic each partition is given min(`receiver_queue_size`,
        `max_total_receiver_queue_size_across_partitions` / partitions) permits, as
        pulsar-client-cpp: many partitions do not buffer that many times the queue.

        As pulsar-client, `topic` may also be a list of topics or a compiled regex
        (`re.compile("persistent://public/default/orders-.*")`: the topics of that one namespace
        whose name matches it in full): then the consumer is a MultiTopicsConsumer, one consumer
        of the subscription per topic with these options (see pyengine.client.pattern); a
        pattern's topics are looked for again every `pattern_auto_discovery_period` seconds.

        `subscription_properties` (str to str, as pulsar-client's): the properties of the
        subscription when this subscribe creates it (each partition's); one that exists keeps
        its own (the admin API changes them)."""
        self._check_open()
        target = subscribe_target(topic, pattern_auto_discovery_period)
        options = ConsumerOptions(subscription_name, consumer_type, initial_position, receiver_queue_size,
                                  consumer_name, priority, negative_ack_redelivery_delay_ms,
                                  batch_index_ack_enabled=batch_index_ack_enabled, schema=schema,
                                  read_compacted=read_compacted,
                                  unacked_messages_timeout_ms=unacked_messages_timeout_ms,
                                  dead_letter_policy=dead_letter_policy,
                                  max_pending_chunked_message=max_pending_chunked_message,
                                  auto_ack_oldest_chunked_message_on_queue_full=(
                                      auto_ack_oldest_chunked_message_on_queue_full),
                                  expire_time_of_incomplete_chunked_message_ms=(
                                      expire_time_of_incomplete_chunked_message_ms),
                                  batch_receive_policy=batch_receive_policy,
                                  key_shared_policy=key_shared_policy,
                                  max_total_receiver_queue_size_across_partitions=(
                                      max_total_receiver_queue_size_across_partitions),
                                  subscription_properties=subscription_properties)
        if target.several:
            multi = MultiTopicsConsumer(self._core, subscription_name,
                                        lambda one: self._subscribe_one(one, options, schema), receiver_queue_size,
                                        target.pattern, target.period,
                                        batch_receive_policy=options.batch_receive_policy)
            await multi._start(target.topics)
            return await self._opened(multi)
        assert target.name is not None
        consumer = await self._subscribe_one(target.name, options, schema)
        return await self._opened(consumer)

    async def _subscribe_one(self, name: str, options: ConsumerOptions, schema: SchemaData | None) -> Consumer:
        """A started consumer of topic `name` (of each partition of a partitioned topic)."""
        dead_letter = (DeadLetterSender(self, options.dead_letter_policy, options.subscription_name, schema)
                       if options.dead_letter_policy is not None else None)
        consumer = Consumer(self._core, name, options, await self._core.lookup.partitions(name), dead_letter)
        await consumer._start()
        return consumer

    async def create_reader(self, topic: str, start_message_id: MessageId, *, receiver_queue_size: int = 1000,
                            start_message_id_inclusive: bool = False, reader_name: str | None = None,
                            read_compacted: bool = False) -> Reader:
        """A reader of `topic` from `start_message_id` on (MessageId.earliest / .latest too);
        as pulsar-client's, it starts after the start message unless `start_message_id_inclusive`.
        `read_compacted`: read the compacted view first (see `subscribe`)."""
        self._check_open()
        name = check_topic(topic)
        if not isinstance(start_message_id, MessageId):
            raise TypeError(f"start_message_id must be a MessageId, not {type(start_message_id).__name__}")
        if start_message_id.topic_name and start_message_id.topic_name != name:
            # as Reader.seek: another topic's ledger and entry ids name nothing here
            raise ValueError(f"start_message_id {start_message_id} is of {start_message_id.topic_name}, not of {name}")
        partitions = await self._core.lookup.partitions(name)
        if partitions > 0 and start_message_id not in (MessageId.earliest, MessageId.latest):
            raise ValueError("a reader of a partitioned topic starts at MessageId.earliest or MessageId.latest")
        options = ConsumerOptions(f"reader-{random.getrandbits(40):010x}", "exclusive", "latest",
                                  receiver_queue_size, reader_name, 0, 60_000, durable=False,
                                  start_message_id=start_message_id,
                                  start_message_id_inclusive=start_message_id_inclusive,
                                  read_compacted=read_compacted)
        reader = Reader(self._core, name, options, partitions)
        await reader._start()
        return await self._opened(reader)

    async def get_schema_info(self, topic: str, version: int | None = None) -> SchemaInfo:
        """The topic's latest schema, or its `version` (TopicNotFoundError when there is none)."""
        self._check_open()
        name = check_topic(topic)
        if version is not None:
            check_int("version", version, 0, 2**63 - 1)     # the wire's int64: past it, struct.error
        async def attempt() -> pb.CommandGetSchemaResponse:
            connection = await self._core.pool.get(await self._core.lookup.lookup(name))
            cmd = base_command(pb.BaseCommand.GET_SCHEMA, topic=name, request_id=connection.new_request_id())
            if version is not None:
                cmd.getSchema.schema_version = encode_version(version)
            return await connection.request(cmd, self._core.config.operation_timeout)

        # A host of the service URL that cannot be reached is passed over for the next.
        response = await self._core.lookup.retrying(f"schema of {name}", attempt)
        return SchemaInfo(decode_version(response.schema_version), schema_from_proto(response.schema))

    async def new_transaction(self, timeout_ms: int = 60_000, *, scalable: bool = False) -> Transaction:
        """Begin a transaction; the coordinator aborts it if it is not ended within `timeout_ms`.

        `scalable=True`: a transaction over scalable topics (`topic://`, `segment://`), started
        on the broker's v5 (metadata-driven, PIP-473) coordinator — the spec's "v5 client".
        Transactions over `persistent://` topics are v4 (the default); a broker refuses a
        transaction of the other design on a topic (NotAllowed / TransactionConflict)."""
        self._check_open()
        check_int("timeout_ms", timeout_ms, 1, 2**64 - 1)    # NEW_TXN carries it in a uint64
        if not isinstance(scalable, bool):
            raise TypeError(f"scalable must be a bool, not {type(scalable).__name__}")
        if scalable and self._core.coordinator.transaction_key is not None:
            raise ValueError("transaction keys fence v4 transactions; a keyed client cannot start scalable ones")
        txn_id = await self._core.coordinator.new_transaction(timeout_ms, v5=scalable)
        return Transaction(self._core.coordinator, txn_id, timeout_ms)

    @property
    def transaction_epoch(self) -> int:
        """The epoch of the transaction key this client holds (-1 until it connected)."""
        return self._core.coordinator.epoch

    async def connect_transaction_key(self) -> int:
        """Take the transaction key's next epoch now (it is otherwise taken by the first
        transaction), fencing any earlier client with the key; returns the epoch."""
        self._check_open()
        if self._core.coordinator.transaction_key is None:
            raise NotAllowedError("this client has no transaction key")
        await self._core.coordinator.start()
        return self._core.coordinator.epoch

    async def close(self) -> None:
        """Close every producer (after its pending sends), consumer and connection; a cancelled
        close still finishes (see RunOnce), and a second close() waits for it."""
        self._closed = True
        await self._closing()

    async def _close(self) -> None:
        async def close_one(closable: Any) -> None:
            try:
                await closable.close()
            except Exception as exc:           # closing goes on for the others
                log.warning("closing %r: %s", closable, exc)
        # All together, as the Java and C++ clients: one after the other, each waiting up to the
        # operation timeout for a slow broker, closing N objects took N timeouts. (Those closed
        # twice, as a scalable producer's segment producers, share one close: RunOnce.)
        await asyncio.gather(*(close_one(closable) for closable in list(self._core.open_objects)),
                             return_exceptions=True)      # (a close ending cancelled stops none of the others)
        await self._core.coordinator.close()
        await self._core.pool.close()
