"""Dead letter policy: a message redelivered too often is published to a dead letter topic and
acknowledged, instead of being handed to the application again (Pulsar's DLQ, as the C++
client behind pulsar-client does it).

The consumer remembers each message that arrives with `redelivery_count >= max_redeliver_count`
(it is still handed to the application: a last chance). When such a message is asked for again
(negative acknowledgement, ack timeout), or when one arrives with a count above the maximum, it
is not redelivered but sent to the dead letter topic, with its payload, partition and ordering
keys and properties plus `REAL_TOPIC` (the topic, or partition, it was read from) and
`ORIGIN_MESSAGE_ID` (its id, in the C++ client's "(ledger,entry,partition,batch index)" form),
and acknowledged once the send succeeded. A send that fails leaves it to be redelivered, to the
application (as the Java client). Each message of a batch is sent and acknowledged by itself.
The dead letter producer chunks (as Java's), so a chunked message too large for one frame goes
there whole.

As in Pulsar, it works on Shared and Key_Shared subscriptions: Pulsar's brokers (and this one)
count no redeliveries on Exclusive and Failover ones, whose messages always come with count 0.

The dead letter topic defaults to `<topic>-<subscription>-DLQ`, where `<topic>` is the consumer's
topic, or for a partitioned topic the partition's (the C++ client's ConsumerImpl is per
partition). With `initial_subscription_name`, that subscription of the dead letter topic is
created by the broker along with the dead letter producer (the producer's own
`initial_subscription_name`, as in Pulsar), before the first message is sent to it, so none is
missed.

The dead letter producer has the consumer's schema; an AUTO_CONSUME consumer's, which no producer
may declare, is replaced as the Java client does it (its dead letter producer is AUTO_PRODUCE_BYTES
of the consumer's schema, each dead letter sent with the schema it was written with): each dead
letter goes by a producer with the schema of its own version on the consumer's topic (none for a
message written without one), its bytes unchanged, so the dead letter topic registers that schema
and the message carries its version there.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyengine.client.message import Message
from pyengine.client.validation import check_int, check_name, check_topic
from pyengine.schema import SchemaType

if TYPE_CHECKING:
    from pyengine.client.client import Client
    from pyengine.client.producer import Producer
    from pyengine.schema import SchemaData

log = logging.getLogger(__name__)

REAL_TOPIC = "REAL_TOPIC"                 # the C++ client's SYSTEM_PROPERTY_REAL_TOPIC
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"   # and its PROPERTY_ORIGIN_MESSAGE_ID
DLQ_SUFFIX = "-DLQ"                       # DLQ_GROUP_TOPIC_SUFFIX


@dataclass(frozen=True, slots=True)
class ConsumerDeadLetterPolicy:
    """pulsar-client's ConsumerDeadLetterPolicy: after `max_redeliver_count` redeliveries a
    message goes to `dead_letter_topic` (default `<topic>-<subscription>-DLQ`); with
    `initial_subscription_name`, that subscription of the dead letter topic is created first."""

    max_redeliver_count: int
    dead_letter_topic: str | None = None
    initial_subscription_name: str | None = None

    def __post_init__(self) -> None:
        check_int("max_redeliver_count", self.max_redeliver_count, 1)
        if self.dead_letter_topic is not None:
            object.__setattr__(self, "dead_letter_topic", check_topic(self.dead_letter_topic))
        check_name("initial_subscription_name", self.initial_subscription_name, optional=True)


def check_dead_letter_policy(value: Any) -> ConsumerDeadLetterPolicy | None:
    """None, a ConsumerDeadLetterPolicy, or pulsar-client's own `pulsar.ConsumerDeadLetterPolicy`
    (read through its properties, where an unset name is '')."""
    if value is None or isinstance(value, ConsumerDeadLetterPolicy):
        return value
    if type(value).__name__ == "ConsumerDeadLetterPolicy" and type(value).__module__.split(".")[0] == "pulsar":
        return ConsumerDeadLetterPolicy(value.max_redeliver_count, value.dead_letter_topic or None,
                                        value.initial_subscription_name or None)
    raise TypeError("dead_letter_policy must be a ConsumerDeadLetterPolicy (pyengine.client or pulsar), "
                    f"not {type(value).__name__}")


def _text(value: str | bytes) -> str:
    # A key or property that is not UTF-8 comes as bytes (pyengine.protocol.text), which a send
    # refuses: it goes as the Java client's dead letter producer has it, U+FFFD for each invalid
    # sequence (refused, the message never reached the DLQ but came back at every redelivery).
    return value.decode(errors="replace") if type(value) is bytes else value


def dead_letter_key(message: Message) -> str | None:
    return None if message.partition_key is None else _text(message.partition_key)


def dead_letter_properties(message: Message) -> dict[str, str]:
    properties = {_text(key): _text(value) for key, value in message.properties.items()}
    properties[ORIGIN_MESSAGE_ID] = str(message.message_id)
    properties[REAL_TOPIC] = message.topic
    return properties


def _schema_key(schema: SchemaData | None) -> tuple[Any, ...] | None:
    if schema is None:
        return None
    return schema.type, schema.data, tuple(sorted(schema.properties.items())), schema.name


class DeadLetterSender:
    """The consumer's producers on its dead letter topic(s), opened at the first dead letter."""

    def __init__(self, client: Client, policy: ConsumerDeadLetterPolicy, subscription: str,
                 schema: SchemaData | None) -> None:
        self.policy = policy
        self.max_redeliver_count = policy.max_redeliver_count
        self._client = client
        self._subscription = subscription
        self._schema = schema
        # AUTO_CONSUME: each message's own schema, looked up by its topic and version (kept).
        self._writer_schemas = schema is not None and schema.type == SchemaType.AUTO_CONSUME
        self._schemas: dict[tuple[str, int], SchemaData] = {}
        # by dead letter topic and schema (_schema_key): one producer each
        self._producers: dict[tuple[str, tuple[Any, ...] | None], asyncio.Future[Producer]] = {}
        self._closed = False

    def topic_for(self, consumer_topic: str) -> str:
        if self.policy.dead_letter_topic is not None:
            return self.policy.dead_letter_topic
        return f"{consumer_topic}-{self._subscription}{DLQ_SUFFIX}"

    async def _schema_for(self, message: Message) -> SchemaData | None:
        """The schema the dead letter producer declares for `message`."""
        if not self._writer_schemas:
            return self._schema
        if message.schema_version is None:
            return None                          # written without a schema: bytes
        key = (message.topic, message.schema_version)
        schema = self._schemas.get(key)
        if schema is None:
            info = await self._client.get_schema_info(message.topic, message.schema_version)
            schema = self._schemas[key] = info.schema
        return schema

    async def _producer(self, topic: str, schema: SchemaData | None) -> Producer:
        key = (topic, _schema_key(schema))
        future = self._producers.get(key)
        if future is None:
            future = asyncio.ensure_future(self._open(topic, schema))
            self._producers[key] = future
        try:
            return await asyncio.shield(future)
        except Exception:
            if self._producers.get(key) is future:
                del self._producers[key]         # tried again at the next dead letter (as C++)
            raise

    async def _open(self, topic: str, schema: SchemaData | None) -> Producer:
        # As the Java client's dead letter producer: no batching, never blocks on a full queue,
        # chunking (a chunked message, larger than the broker's limit, can be dead-lettered),
        # and the initial subscription created by the broker with the producer
        # (CommandProducer.initial_subscription_name), before the first dead letter is sent.
        return await self._client.create_producer(
            topic, batching_enabled=False, block_if_queue_full=False, chunking_enabled=True,
            schema=schema, initial_subscription_name=self.policy.initial_subscription_name)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")

    async def send(self, consumer_topic: str, message: Message) -> None:
        """Publish `message` to the dead letter topic; raises if it could not be."""
        self._check_open()
        schema = await self._schema_for(message)
        self._check_open()                  # a producer opened after close() would be left open
        producer = await self._producer(self.topic_for(consumer_topic), schema)
        send_copy = getattr(producer, "_send_copy", None)
        if send_copy is None:           # a scalable topic's producer: no ordering key to give
            await producer.send(message.data, key=dead_letter_key(message), properties=dead_letter_properties(message))
            return
        # Its keys as well as its payload and properties (the C++ client's processPossibleToDLQ).
        await send_copy(message.data, dead_letter_key(message), message.ordering_key, dead_letter_properties(message))

    async def close(self) -> None:
        self._closed = True
        futures, self._producers = list(self._producers.values()), {}
        for future in futures:
            if not future.done():
                future.cancel()
                continue
            if future.cancelled() or future.exception() is not None:
                continue
            try:
                await future.result().close()
            except Exception as exc:             # closing goes on for the others
                log.warning("closing a dead letter producer: %s", exc)
