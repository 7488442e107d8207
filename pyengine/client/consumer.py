"""Consumers: receiver queues with FLOW permits, acknowledgements, redelivery, seek.

A `PartitionConsumer` is one broker-side consumer on one topic or partition. It gives the broker
`receiver_queue_size` permits when it subscribes and, as the C++ client does, tops them up by
the number taken once the application has taken half of the queue. Messages land in the
`Consumer`'s queue (one queue for all partitions); each queued message remembers the
generation of its partition consumer, so a reconnect, a seek or a redelivery drops what was
queued before it without touching the other partitions.

Plain acknowledgements are fire-and-forget (as in Pulsar, no ACK_RESPONSE is asked for) and
are grouped per event-loop turn; a batch message is acknowledged by its index (an ack set with
only its bit cleared, which the broker merges). Transactional acknowledgements register the
subscription with the transaction first, ask for an ACK_RESPONSE and wait for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, MutableSequence, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from core_ext.frames import Frame
from pyengine.client.backoff import every
from pyengine.client.chunks import NUM_CHUNKS_TAG, ChunkAssembler, ChunkMessageId, chunk_entries
from pyengine.client.connection import ClientConnection
from pyengine.client.dead_letter import ConsumerDeadLetterPolicy, DeadLetterSender, check_dead_letter_policy
from pyengine.client.errors import AlreadyClosedError, ConnectError, CumulativeAcknowledgementNotAllowedError
from pyengine.errors import NotAllowedError, TransactionConflictError
from pyengine.client.handler import CLOSED, CLOSING, FAILED, READY, ConnectionHandler, close_all, start_all
from pyengine.client.held import HeldMessages
from pyengine.client.message import (
    DecodeError, Message, MessageId, _decompress, _schema_version, decode_entry, seek_ack_set, unacked_from,
)
from pyengine.client.negative_acks import NegativeAckTracker
from pyengine.concurrency import RunOnce
from pyengine.client.unacked import UnackedMessageTracker
from pyengine.client.validation import (
    check_consumer_type, check_initial_position, check_int, check_name, check_schema, check_timeout, option_name,
)
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command, parse_message_metadata
from pyengine.protocol.schema_codec import fill_schema
from pyengine.schema import SchemaData
from pyengine.storage.entry import split_headers_and_payload
from pyengine.storage.errors import StorageError
from pyengine.subscription_properties import check_subscription_properties
from pyengine_kernels import Position, ackset_unacked_count

if TYPE_CHECKING:
    from pyengine.client.client import ClientCore
    from pyengine.client.transaction import Transaction

log = logging.getLogger(__name__)

T = pb.BaseCommand
# A MultiTopicsConsumer's listener: (the partition's consumer, which of its message ids come
# again; None: every one it delivered so far).
EntriesComingAgain = Callable[["PartitionConsumer | None", "Callable[[MessageId], bool] | None"], None]
_SUB_TYPES = {"exclusive": pb.CommandSubscribe.Exclusive, "shared": pb.CommandSubscribe.Shared,
              "failover": pb.CommandSubscribe.Failover, "key_shared": pb.CommandSubscribe.Key_Shared}
_MASK64 = (1 << 64) - 1

# pulsar-client (the C++ ConsumerConfiguration) refuses an ack timeout under 10 s; tests lower
# this module value to run with short timeouts. The tick is the C++ default (tickDurationInMs).
MIN_UNACKED_MESSAGES_TIMEOUT_MS = 10_000
DEFAULT_TICK_DURATION_MS = 1_000

DEFAULT_BATCH_RECEIVE_MAX_BYTES = 10 * 1024 * 1024      # the C++ BatchReceivePolicy's defaults
DEFAULT_BATCH_RECEIVE_TIMEOUT_MS = 100


def _check_plain_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class ConsumerBatchReceivePolicy:
    """pulsar-client's ConsumerBatchReceivePolicy: `batch_receive()` returns once
    `max_num_message` messages or `max_num_bytes` bytes of payload are queued, or
    `timeout_ms` has passed (a limit <= 0 is no limit). As the C++ BatchReceivePolicy, at least
    one of them must be set, and with neither size limit the defaults are taken for both."""

    max_num_message: int = -1
    max_num_bytes: int = DEFAULT_BATCH_RECEIVE_MAX_BYTES
    timeout_ms: int = DEFAULT_BATCH_RECEIVE_TIMEOUT_MS

    def __post_init__(self) -> None:
        for name in ("max_num_message", "max_num_bytes", "timeout_ms"):
            _check_plain_int(name, getattr(self, name))
        if self.max_num_message <= 0 and self.max_num_bytes <= 0:
            if self.timeout_ms <= 0:
                raise ValueError("At least one of max_num_message, max_num_bytes and timeout_ms must be > 0")
            # Otherwise a batch could only end with the timeout: the C++ client resets both.
            object.__setattr__(self, "max_num_message", -1)
            object.__setattr__(self, "max_num_bytes", DEFAULT_BATCH_RECEIVE_MAX_BYTES)

    def within(self, receiver_queue_size: int) -> ConsumerBatchReceivePolicy:
        """This policy for a consumer of `receiver_queue_size`: as the C++ ConsumerImplBase, a
        max_num_message above it is lowered to it (more could never be queued at once: the
        batch would only end with the timeout, or never without one)."""
        if self.max_num_message <= receiver_queue_size:
            return self
        return dataclasses.replace(self, max_num_message=receiver_queue_size)

    def enough(self, count: int, size: int) -> bool:
        """Whether `count` queued messages of `size` bytes make a batch before the timeout."""
        return ((0 < self.max_num_message <= count) or (0 < self.max_num_bytes <= size))

    def can_add(self, count: int, size: int, message: Message) -> bool:
        """Whether a batch of `count` messages and `size` bytes takes `message` too (the first
        one always: a message over max_num_bytes must not block the consumer)."""
        if count == 0:
            return True
        if 0 < self.max_num_message < count + 1:
            return False
        return not 0 < self.max_num_bytes < size + len(message.data)


def check_batch_receive_policy(value: Any) -> ConsumerBatchReceivePolicy:
    """None (the defaults), a ConsumerBatchReceivePolicy, or pulsar-client's own
    `pulsar.ConsumerBatchReceivePolicy` (read through the C++ policy it wraps)."""
    if value is None:
        return ConsumerBatchReceivePolicy()
    if isinstance(value, ConsumerBatchReceivePolicy):
        return value
    if type(value).__name__ == "ConsumerBatchReceivePolicy" and type(value).__module__.split(".")[0] == "pulsar":
        policy = value.policy()
        return ConsumerBatchReceivePolicy(policy.getMaxNumMessages(), policy.getMaxNumBytes(), policy.getTimeoutMs())
    raise TypeError("batch_receive_policy must be a ConsumerBatchReceivePolicy (pyengine.client or pulsar), "
                    f"not {type(value).__name__}")


class KeySharedMode(enum.Enum):
    """pulsar-client's KeySharedMode: how a Key_Shared subscription spreads key hashes over its
    consumers (AutoSplit: the broker's hash ring; Sticky: the ranges each consumer asks for)."""

    AutoSplit = "auto_split"
    Sticky = "sticky"


KEY_HASH_RANGE = 1 << 16        # a sticky range's bounds are key hash slots: 0 to 65535


@dataclass(frozen=True, slots=True)
class ConsumerKeySharedPolicy:
    """pulsar-client's ConsumerKeySharedPolicy, used when the consumer type is Key_Shared:
    `key_shared_mode` (KeySharedMode, pulsar's, or "auto_split" / "sticky"),
    `allow_out_of_order_delivery` (the broker no longer holds a key back from a consumer that
    joined while another consumer holds unacknowledged messages of it; all the consumers of a
    subscription must agree, ConsumerBusyError otherwise, as on the mode) and, in Sticky mode
    (required there), `sticky_ranges`: the (start, end) key hash slots this consumer takes, both
    included (ranges another consumer of the subscription took: ConsumerAssignError)."""

    key_shared_mode: KeySharedMode | str = KeySharedMode.AutoSplit
    allow_out_of_order_delivery: bool = False
    sticky_ranges: list[tuple[int, int]] | None = None

    def __post_init__(self) -> None:
        mode = option_name("key_shared_mode", self.key_shared_mode, "KeySharedMode")
        mode = {"autosplit": "auto_split"}.get(mode, mode)
        if mode not in ("auto_split", "sticky"):
            raise ValueError(f"key_shared_mode must be KeySharedMode.AutoSplit or KeySharedMode.Sticky, "
                             f"not {self.key_shared_mode!r}")
        object.__setattr__(self, "key_shared_mode", KeySharedMode(mode))
        if not isinstance(self.allow_out_of_order_delivery, bool):
            raise TypeError(f"allow_out_of_order_delivery must be a bool, "
                            f"not {type(self.allow_out_of_order_delivery).__name__}")
        if self.sticky_ranges is not None:
            object.__setattr__(self, "sticky_ranges", _check_sticky_ranges(self.sticky_ranges))
        elif self.key_shared_mode is KeySharedMode.Sticky:
            raise ValueError("key_shared_mode KeySharedMode.Sticky needs sticky_ranges")


def _check_sticky_ranges(ranges: Any) -> list[tuple[int, int]]:
    """Sticky ranges as the C++ KeySharedPolicy takes them: pairs of ints in [0, 65535], start
    <= end, none overlapping another."""
    if isinstance(ranges, (str, bytes)) or not isinstance(ranges, (list, tuple)):
        raise TypeError(f"sticky_ranges must be a list of (start, end) tuples, not {type(ranges).__name__}")
    checked: list[tuple[int, int]] = []
    for item in ranges:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise TypeError(f"sticky_ranges must be a list of (start, end) tuples, not {item!r}")
        for bound in item:
            _check_plain_int("a sticky range's bound", bound)
        start, end = item
        if not 0 <= start <= end < KEY_HASH_RANGE:
            raise ValueError(f"sticky ranges must lie within [0, {KEY_HASH_RANGE - 1}] with start <= end, "
                             f"not {tuple(item)!r}")
        checked.append((start, end))
    if not checked:
        raise ValueError("sticky_ranges must not be empty")
    ordered = sorted(checked)
    for before, after in zip(ordered, ordered[1:]):
        if after[0] <= before[1]:
            raise ValueError(f"sticky ranges must not overlap: {before!r} and {after!r}")
    return checked


def check_key_shared_policy(value: Any) -> ConsumerKeySharedPolicy:
    """None (AutoSplit, in order), a ConsumerKeySharedPolicy, or pulsar-client's own
    `pulsar.ConsumerKeySharedPolicy` (read through its properties)."""
    if value is None:
        return ConsumerKeySharedPolicy()
    if isinstance(value, ConsumerKeySharedPolicy):
        return value
    if type(value).__name__ == "ConsumerKeySharedPolicy" and type(value).__module__.split(".")[0] == "pulsar":
        ranges = [tuple(r) for r in value.sticky_ranges or ()]
        return ConsumerKeySharedPolicy(value.key_shared_mode, value.allow_out_of_order_delivery, ranges or None)
    raise TypeError("key_shared_policy must be a ConsumerKeySharedPolicy (pyengine.client or pulsar), "
                    f"not {type(value).__name__}")


def fill_key_shared_meta(meta: pb.KeySharedMeta, policy: ConsumerKeySharedPolicy) -> None:
    """CommandSubscribe's KeySharedMeta for `policy` (the ranges only in Sticky mode, as the
    C++ client sends them)."""
    sticky = policy.key_shared_mode is KeySharedMode.Sticky
    meta.keySharedMode = pb.STICKY if sticky else pb.AUTO_SPLIT
    meta.allowOutOfOrderDelivery = policy.allow_out_of_order_delivery
    if sticky:
        for start, end in policy.sticky_ranges or ():
            meta.hashRanges.add(start=start, end=end)


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    subscription_name: str
    consumer_type: str = "exclusive"
    initial_position: str = "latest"
    receiver_queue_size: int = 1000
    consumer_name: str | None = None
    priority: int = 0
    negative_ack_redelivery_delay_ms: int = 60_000
    durable: bool = True
    start_message_id: MessageId | None = None
    start_message_id_inclusive: bool = False           # as pulsar-client's readers
    batch_index_ack_enabled: bool = True
    schema: SchemaData | None = None
    read_compacted: bool = False
    unacked_messages_timeout_ms: int | None = None
    tick_duration_ms: int = DEFAULT_TICK_DURATION_MS
    dead_letter_policy: ConsumerDeadLetterPolicy | None = None
    max_pending_chunked_message: int = 10
    auto_ack_oldest_chunked_message_on_queue_full: bool = False
    expire_time_of_incomplete_chunked_message_ms: int = 60_000
    batch_receive_policy: ConsumerBatchReceivePolicy | None = None
    key_shared_policy: ConsumerKeySharedPolicy | None = None
    # A partitioned topic's partitions share it (pulsar-client-cpp's default): each gets
    # min(receiver_queue_size, this / partitions), so many partitions do not buffer N times.
    max_total_receiver_queue_size_across_partitions: int = 50_000
    # Those of the subscription if this subscribe creates it (PIP-105): str to str.
    subscription_properties: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        check_name("subscription_name", self.subscription_name)
        object.__setattr__(self, "subscription_properties",
                           check_subscription_properties(self.subscription_properties))
        object.__setattr__(self, "batch_receive_policy", check_batch_receive_policy(self.batch_receive_policy))
        object.__setattr__(self, "key_shared_policy", check_key_shared_policy(self.key_shared_policy))
        check_int("max_pending_chunked_message", self.max_pending_chunked_message, 0)
        check_int("expire_time_of_incomplete_chunked_message_ms",
                  self.expire_time_of_incomplete_chunked_message_ms, 0)
        timeout = self.unacked_messages_timeout_ms
        if timeout is None:
            object.__setattr__(self, "unacked_messages_timeout_ms", 0)
        else:
            check_int("unacked_messages_timeout_ms", timeout, 0)
            if 0 < timeout < MIN_UNACKED_MESSAGES_TIMEOUT_MS:
                raise ValueError(f"unacked_messages_timeout_ms must be 0 (off) or at least "
                                 f"{MIN_UNACKED_MESSAGES_TIMEOUT_MS} ms, not {timeout}")
        check_int("tick_duration_ms", self.tick_duration_ms, 1)
        object.__setattr__(self, "dead_letter_policy", check_dead_letter_policy(self.dead_letter_policy))
        if not isinstance(self.read_compacted, bool):
            raise TypeError(f"read_compacted must be a bool, not {type(self.read_compacted).__name__}")
        check_schema(self.schema)
        object.__setattr__(self, "consumer_type", check_consumer_type(self.consumer_type))
        object.__setattr__(self, "initial_position", check_initial_position(self.initial_position))
        check_int("receiver_queue_size", self.receiver_queue_size, 1)
        check_int("max_total_receiver_queue_size_across_partitions",
                  self.max_total_receiver_queue_size_across_partitions, 1)
        check_name("consumer_name", self.consumer_name, optional=True)
        check_int("priority", self.priority, 0)
        check_int("negative_ack_redelivery_delay_ms", self.negative_ack_redelivery_delay_ms, 0)
        if self.read_compacted and self.consumer_type not in ("exclusive", "failover"):
            # As Pulsar's clients (ConsumerBuilderImpl) refuse it before asking the broker.
            raise ValueError("Read compacted can only be used with exclusive or failover persistent subscriptions")
        if self.start_message_id is not None and not isinstance(self.start_message_id, MessageId):
            raise TypeError(f"start_message_id must be a MessageId, not {type(self.start_message_id).__name__}")
        for flag in ("durable", "start_message_id_inclusive", "batch_index_ack_enabled",
                     "auto_ack_oldest_chunked_message_on_queue_full"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be a bool, not {type(getattr(self, flag)).__name__}")


def _partition_options(options: ConsumerOptions, partitions: int) -> ConsumerOptions:
    """The options of each partition's consumer: the receiver queue shared out as
    pulsar-client-cpp's MultiTopicsConsumerImpl does (at least 1 message each)."""
    if partitions <= 0:
        return options
    size = max(1, min(options.receiver_queue_size,
                      options.max_total_receiver_queue_size_across_partitions // partitions))
    return options if size == options.receiver_queue_size else dataclasses.replace(options, receiver_queue_size=size)


def _signed(word: int) -> int:
    return word - (1 << 64) if word >= 1 << 63 else word


def _start_id(start: MessageId | None, inclusive: bool) -> MessageId | None:
    """Where to start for `start`: a chunked message's id is its last chunk's position, so an
    inclusive start at one is at its first chunk (the C++ client's getStartMessageId)."""
    if inclusive and isinstance(start, ChunkMessageId) and start.chunk_ids:
        return start.first_chunk_id
    return start


def _ack_id(message_id: MessageId, *, whole_entry: bool = False) -> pb.MessageIdData:
    """The MessageIdData acknowledging one message: its entry, or for a batch message the
    entry's ack set with only its index cleared (set bits are the unacknowledged indexes)."""
    data = pb.MessageIdData(ledgerId=message_id.ledger_id & _MASK64, entryId=message_id.entry_id & _MASK64)
    if not whole_entry and message_id.batch_index >= 0 and message_id.batch_size > 0:
        size = message_id.batch_size
        words = [_MASK64] * (size // 64) + ([(1 << (size % 64)) - 1] if size % 64 else [])
        words[message_id.batch_index // 64] &= ~(1 << (message_id.batch_index % 64))
        data.ack_set.extend(_signed(w) for w in words)
        data.batch_size = size
    return data


def _cumulative_target_with_ack_set(message_id: MessageId) -> pb.MessageIdData:
    """What a cumulative ack of `message_id` sends with batch-index acks, and always in a
    transaction (as the Java and C++ clients): its entry, and for a batch message that is not
    its batch's last, the ack set of the indexes after it (still unacknowledged). Acking the
    entry before instead would bring the batch's acknowledged messages back after a
    reconnect, and in a transaction conflict with the previous transaction's ack of the batch."""
    data = pb.MessageIdData(ledgerId=message_id.ledger_id & _MASK64, entryId=message_id.entry_id & _MASK64)
    size, index = message_id.batch_size, message_id.batch_index
    if 0 <= index < size - 1:
        data.ack_set.extend(unacked_from(index + 1, size))
        data.batch_size = size
    return data


def _seek_target(message_id: MessageId) -> pb.MessageIdData:
    """What a seek to `message_id` sends: its entry (a chunked message's first chunk, as C++)
    and, inside a batch, `seek_ack_set` (as the Java client), so the broker's cursor holds the
    batch's earlier indexes acknowledged: not delivered again, to any consumer, nor after a
    reconnect."""
    first = chunk_entries(message_id)[0]
    data = pb.MessageIdData(ledgerId=first.ledger_id & _MASK64, entryId=first.entry_id & _MASK64)
    data.ack_set.extend(seek_ack_set(message_id) or ())
    return data


class PartitionConsumer(ConnectionHandler):
    def __init__(self, core: ClientCore, parent: Consumer, topic: str, partition: int,
                 options: ConsumerOptions) -> None:
        super().__init__(core, topic)
        self._parent = parent
        self.partition = partition
        self.options = options
        self.consumer_id = core.new_consumer_id()
        self.consumer_name = (options.consumer_name if options.consumer_name is not None
                              else "" if not options.durable else f"{random.getrandbits(40):010x}")
        self.generation = 0
        # The messages handed out and not yet covered by a cumulative ack: since the stream
        # last came again (a reconnect, a rewind of the broker's) and before (a transaction
        # may not ack those cumulatively: see `_check_not_stale`).
        self.held = HeldMessages()
        # Only where cumulative acks are allowed: every message taken pays for the tracking.
        self.tracks_handed = options.consumer_type in ("exclusive", "failover")
        # The last entry received in this generation (Exclusive/Failover): entries come in
        # order there, so one at or before it means the broker rewound on its own.
        self._last_entry: tuple[int, int] | None = None
        # PIP-84, as the Java client: raised by each redeliver-all of an Exclusive or Failover
        # consumer; a MESSAGE the broker stamped with a lower one was read before that
        # redelivery (the cursor rewound since) and is dropped, so the redelivered messages
        # come first and in order.
        self.epoch = 0
        self.queued = 0
        self.queued_bytes = 0             # payload bytes of the queued messages (batch receive)
        self._consumed_since_flow = 0
        self._flow_threshold = max(1, options.receiver_queue_size // 2)
        self.active = False
        self.flow_enabled = True          # False: asks for no message (creating a subscription)
        self._ready = asyncio.Event()       # set when connected (or closed / failed: waiters look)
        self._failure: BaseException | None = None
        self._acks: list[pb.MessageIdData] = []
        # Without batch-index acks: the indexes of each batch delivered here still unacked (the
        # count starts over with each delivery, as the C++ client's acker of a delivered batch);
        # and of a batch the broker holds part of (acknowledged in a transaction, or delivered
        # with an ack set), the indexes its plain ack leaves alone (it then goes by index).
        self._batch_remaining: dict[tuple[int, int], set[int]] = {}
        self._batch_left: dict[tuple[int, int], set[int]] = {}
        self._cumulative: pb.MessageIdData | None = None
        self._ack_flush: asyncio.Handle | None = None
        # Readers: where to start, and the last message handed out (the restart point).
        self.start = _start_id(options.start_message_id, options.start_message_id_inclusive)
        self.start_inclusive = options.start_message_id_inclusive
        self.last_dequeued: MessageId | None = None
        # Resubscribed before the last message handed out (at a chunked message it had not
        # finished, which other messages interleave): what comes at or before it is dropped.
        self._handed_out_through: MessageId | None = None
        # The last seek was by publish time: until something is read, only the broker knows
        # where the subscription is (has_message_available asks for its mark-delete position).
        self.sought_by_timestamp = False
        # A reader's last seek by publish time while nothing was read since: a reader that
        # subscribes again anew (its connection lost, the topic moved) seeks to it again, as its
        # new subscription starts at the reader's initial position. The broker closes a reader
        # for its seek and keeps its moved subscription for the next SUBSCRIBE: no seek then.
        self._sought_time: int | None = None
        self._seek_kept_by_broker = False
        self._seeking_again: asyncio.Task[None] | None = None
        # Chunked messages being put back together (created with the first chunk).
        self._chunks: ChunkAssembler | None = None
        # The chunks of each chunked message queued here and not acknowledged, by its last
        # chunk's entry: a deserialized id names only its first and last chunk.
        self._chunked_unacked: dict[tuple[int, int], tuple[MessageId, ...]] = {}
        self._chunk_timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"consumer {self.consumer_id} of {self.options.subscription_name!r} on {self.topic}"

    # --- connection -----------------------------------------------------------------------

    async def _connection_opened(self, connection: ClientConnection) -> None:
        options = self.options
        connection.consumers[self.consumer_id] = self
        cmd = base_command(
            T.SUBSCRIBE, topic=self.topic, subscription=options.subscription_name,
            subType=_SUB_TYPES[options.consumer_type], consumer_id=self.consumer_id,
            request_id=connection.new_request_id(), consumer_name=self.consumer_name,
            priority_level=options.priority, durable=options.durable, read_compacted=options.read_compacted,
            consumer_epoch=self.epoch,
            initialPosition=(pb.CommandSubscribe.Earliest if options.initial_position == "earliest"
                             else pb.CommandSubscribe.Latest),
            replicate_subscription_state=False)
        cmd.subscribe.subscription_properties.extend(
            pb.KeyValue(key=key, value=value) for key, value in options.subscription_properties.items())
        if options.consumer_type == "key_shared":
            fill_key_shared_meta(cmd.subscribe.keySharedMeta, options.key_shared_policy)
        if options.schema is not None:
            fill_schema(cmd.subscribe.schema, options.schema)
        if not options.durable:
            # A reader resumes at the first message it did not hand out, as Java's
            # clearReceiverQueue: the first queued (inclusive; a chunked message at its first
            # chunk, also one still being put together), else after the last handed out. (A
            # durable cursor knows by itself, and keeps its last seek's filter, as Pulsar's
            # clients do.) Its later seeks go by its option again.
            first = self._parent._first_queued(self)
            firsts = [_start_id(first, True)] if first is not None else []
            if self._chunks is not None and (pending := self._chunks.first_chunk()) is not None:
                firsts.append(pending)
            if firsts:
                self.start, self.start_inclusive = min(firsts), True
                self.sought_by_timestamp = False        # the start names a message now
                self._handed_out_through = self.last_dequeued
            elif self.last_dequeued is not None:
                self.start, self.start_inclusive = self.last_dequeued, False
            if self.start is not None:
                self._sought_time = None
        seek_kept, self._seek_kept_by_broker = self._seek_kept_by_broker, False
        # As Java's clearReceiverQueue, with the start taken: what was queued comes again, so
        # none of it is handed out while the SUBSCRIBE is on its way (it would come twice), nor
        # counted (a batch receive would take the count for messages it cannot have).
        self._new_generation(reconnected=True)
        self.queued = 0
        self.queued_bytes = 0
        self._consumed_since_flow = 0
        if self.start is not None and not options.durable:
            cmd.subscribe.start_message_id.CopyFrom(self.start.to_proto())
        try:
            await connection.request(cmd, self._core.config.operation_timeout)
        except BaseException as exc:
            if connection.consumers.get(self.consumer_id) is self:
                del connection.consumers[self.consumer_id]
            self._given_up(connection, cmd, exc)
            raise
        if self.state in (CLOSING, CLOSED):
            return
        if not connection.usable:
            # It closed while the answer was on its way (see the producer's): not ready on it.
            raise ConnectError(f"{self}: the connection closed as the consumer was subscribed")
        # What was queued before is redelivered by the broker: drop it here.
        self._new_generation(reconnected=True)
        self.queued = 0
        self.queued_bytes = 0
        self._consumed_since_flow = 0
        if self._chunks is not None:
            self._chunks.clear()          # their chunks come again
        self._forget_deliveries()
        self._parent._handler_reset(self)
        self.connection = connection
        self.state = READY
        self._ready.set()
        if self._sought_time is not None and not seek_kept:
            self._seek_again(self._sought_time)     # it asks for messages once there
        else:
            self._flow(self.options.receiver_queue_size)
        self._flush_acks()

    def on_connection_closed(self, connection: ClientConnection) -> None:
        if connection is self.connection:
            self._ready.clear()
            self._seek_kept_by_broker = False         # a reader's subscription ends with it
        super().on_connection_closed(connection)

    def _seek_again(self, publish_time: int) -> None:
        async def seek() -> None:
            try:
                await self.seek(publish_time)
            except asyncio.CancelledError:
                raise
            except Exception as exc:                # noqa: BLE001 - logged, and reading goes on
                if self.state == READY:
                    log.warning("%s: could not seek again to publish time %d: %s", self, publish_time, exc)
                    self._flow(self.options.receiver_queue_size)
                # else: it subscribes again, and seeks again then
        self._seeking_again = asyncio.get_running_loop().create_task(seek())

    def on_closed_by_broker(self) -> None:
        self._ready.clear()
        super().on_closed_by_broker()

    def _failed(self, error: BaseException) -> None:
        self._failure = error
        self._ready.set()                   # the operations waiting for a connection end now
        self._parent._handler_failed(self, error)

    def on_active_changed(self, active: bool) -> None:
        self.active = active

    # --- receiving ------------------------------------------------------------------------

    def _flow(self, permits: int) -> None:
        if permits > 0 and self.flow_enabled and self.state == READY and self.connection is not None:
            self.connection.send_command(base_command(T.FLOW, consumer_id=self.consumer_id, messagePermits=permits))

    def credit(self, permits: int) -> None:
        """Messages taken from (or dropped before) the queue: give permits back in halves."""
        self._consumed_since_flow += permits
        if self._consumed_since_flow >= self._flow_threshold:
            self._flow(self._consumed_since_flow)
            self._consumed_since_flow = 0

    def on_message(self, command: pb.CommandMessage, frame: Frame) -> None:
        if self.state != READY:
            return
        if command.HasField("consumer_epoch") and command.consumer_epoch < self.epoch:
            # Sent before the last redeliver-all: it comes again. Its permits come back, as the
            # Java client gives them back (the broker took one per message of the entry).
            self.credit(_permits_of(frame.headers_and_payload, command.ack_set))
            return
        ledger_id, entry_id = command.message_id.ledgerId, command.message_id.entryId
        if self.tracks_handed:
            entry = (ledger_id, entry_id)
            last = self._last_entry
            if last is not None and entry <= last:
                self._rewound_by_broker(entry)
            self._last_entry = entry
        if frame.checksum_valid is False or frame.headers_and_payload is None:
            self._reject(ledger_id, entry_id, pb.CommandAck.ChecksumMismatch,
                         _permits_of(frame.headers_and_payload, command.ack_set))
            return
        raw_metadata = frame.metadata
        if raw_metadata is not None and NUM_CHUNKS_TAG in raw_metadata and self._on_chunk(command, frame):
            return
        try:
            messages = decode_entry(self.topic, Position(ledger_id, entry_id), frame.headers_and_payload,
                                    partition=self.partition, redelivery_count=command.redelivery_count,
                                    ack_set=list(command.ack_set) or None)
        except DecodeError as exc:
            log.warning("%s: undecodable message (%d:%d): %s", self, ledger_id, entry_id, exc)
            self._reject(ledger_id, entry_id, pb.CommandAck.BatchDeSerializeError,
                         _permits_of(frame.headers_and_payload, command.ack_set))
            return
        # A batch's indexes acknowledged already (the ack set) took no permits at the broker
        # (Pulsar's Consumer.sendMessages), and none come back for them (as the Java client).
        skipped = 0
        if messages and messages[0].message_id.batch_size and not self.options.batch_index_ack_enabled:
            self._batch_delivered(messages[0].message_id, {m.message_id.batch_index for m in messages},
                                  with_ack_set=bool(command.ack_set))
        if self.start is not None:          # a reader's start, or a seek's message id
            kept = [m for m in messages
                    if not self._before_start(m.message_id) and not self._handed_out_already(m.message_id)]
            skipped += len(messages) - len(kept)
            messages = kept
        if skipped:
            self.credit(skipped)
        if messages and self._parent._dead_letter is not None:
            kept = self._parent._screen_dead_letters(self, messages, command.redelivery_count)
            if len(kept) < len(messages):
                self.credit(len(messages) - len(kept))
            messages = kept
        for message in messages:
            self.queued += 1
            self._parent._push(self, message)

    def _on_chunk(self, command: pb.CommandMessage, frame: Frame) -> bool:
        """A chunk of a chunked message (False: not one after all). As the C++ client's
        processMessageChunk: a chunk that does not complete its message takes no room in the
        queue (its permit comes back now); the completed message is queued as any other."""
        try:
            md = parse_message_metadata(frame.metadata)
        except ValueError:
            return False                  # decode_entry reports it
        if md.num_chunks_from_msg <= 1 or md.HasField("num_messages_in_batch"):
            return False
        ledger_id, entry_id = command.message_id.ledgerId, command.message_id.entryId
        if self._chunks is None:
            options = self.options
            self._chunks = ChunkAssembler(options.max_pending_chunked_message,
                                          options.auto_ack_oldest_chunked_message_on_queue_full,
                                          options.expire_time_of_incomplete_chunked_message_ms)
        if self._chunk_timer is None and self._chunks.expire_ms > 0:
            self._chunk_timer = asyncio.get_running_loop().call_later(self._chunks.expire_ms / 1000,
                                                                      self._expire_chunks)
        chunk_id = MessageId(_signed(ledger_id), _signed(entry_id), -1, self.partition)
        outcome = self._chunks.process(md.uuid, md.chunk_id, md.num_chunks_from_msg, md.total_chunk_msg_size,
                                       md.publish_time, chunk_id, frame.payload or b"", time.time_ns() // 1_000_000)
        for dropped in outcome.ack:
            self._acks.append(_ack_id(dropped))
        if outcome.ack:
            self._schedule_ack_flush()
        unacked = self._parent._unacked
        if unacked is not None:
            for left in outcome.track:
                unacked.add(self, left)
            if outcome.message_id is not None:
                # Chunks tracked when dropped earlier are now in a whole message, tracked as such.
                for chunk in outcome.message_id.chunk_ids:
                    unacked.remove(self, chunk)
        if outcome.message_id is None:
            self.credit(1)
            return True
        assert outcome.payload is not None
        try:
            payload = _decompress(md.compression, outcome.payload, md.uncompressed_size)
        except DecodeError as exc:
            log.warning("%s: undecodable chunked message %s: %s", self, outcome.message_id, exc)
            self._acks.extend(_ack_id(entry) for entry in outcome.message_id.chunk_ids)
            self._schedule_ack_flush()
            self.credit(1)
            return True
        message = Message(
            topic=self.topic, data=payload,
            message_id=dataclasses.replace(outcome.message_id, topic_name=self.topic),   # as decode_entry's
            properties={kv.key: kv.value for kv in md.properties},
            partition_key=md.partition_key if md.HasField("partition_key") else None,
            ordering_key=md.ordering_key if md.HasField("ordering_key") else None,
            event_time=md.event_time, publish_time=md.publish_time, producer_name=md.producer_name,
            sequence_id=md.sequence_id, redelivery_count=command.redelivery_count,
            schema_version=_schema_version(md.schema_version) if md.HasField("schema_version") else None)
        if self.start is not None and (self._before_start(message.message_id)
                                       or self._handed_out_already(message.message_id)):
            self.credit(1)
            return True
        messages = [message]
        if self._parent._dead_letter is not None:
            messages = self._parent._screen_dead_letters(self, messages, command.redelivery_count)
            if not messages:
                self.credit(1)
                return True
        if self.options.durable:            # a reader acknowledges nothing: nothing to remember
            last = outcome.message_id
            self._chunked_unacked[(last.ledger_id, last.entry_id)] = last.chunk_ids
        self.queued += 1
        self._parent._push(self, message)
        return True

    def _expire_chunks(self) -> None:
        self._chunk_timer = None
        chunks = self._chunks
        if chunks is None or self.state in (CLOSING, CLOSED):
            return
        acks = chunks.expire(time.time_ns() // 1_000_000)
        if acks:
            log.info("%s: dropping %d chunk(s) of expired incomplete chunked messages", self, len(acks))
            self._acks.extend(_ack_id(m) for m in acks)
            self._schedule_ack_flush()
        if chunks.expire_ms > 0:
            self._chunk_timer = asyncio.get_running_loop().call_later(chunks.expire_ms / 1000, self._expire_chunks)

    def _before_start(self, message_id: MessageId) -> bool:
        start = self.start
        assert start is not None
        if self.options.durable and (message_id.ledger_id, message_id.entry_id) != (start.ledger_id, start.entry_id):
            # A consumer's seek filters only the target's own entry (the id, and its batch before
            # it), as the C++ and Java clients do: the subscription may be moved back later
            # (another consumer's seek, an admin's reset), and the earlier entries that come
            # then are this consumer's to receive.
            return False
        return before_start(message_id, start, self.start_inclusive)

    def _handed_out_already(self, message_id: MessageId) -> bool:
        """A reader resubscribed at a chunked message it had not finished: whether this message,
        which came again with it, was handed out before (the filter ends at the first that was
        not: they come in order)."""
        through = self._handed_out_through
        if through is None:
            return False
        if before_start(message_id, through, False):
            return True
        self._handed_out_through = None
        return False

    def _reject(self, ledger_id: int, entry_id: int, validation_error: int, permits: int = 1) -> None:
        # As the C++ client: a message that cannot be read is acknowledged with the reason.
        # The permits the broker took for the entry (`_permits_of`) come back.
        if self.connection is not None:
            self.connection.send_command(base_command(
                T.ACK, consumer_id=self.consumer_id, ack_type=pb.CommandAck.Individual,
                message_id=[pb.MessageIdData(ledgerId=ledger_id, entryId=entry_id)],
                validation_error=validation_error))
        self.credit(permits)

    def _new_generation(self, *, reconnected: bool) -> None:
        """The queue starts over. After a reconnect what the application holds is stale: it
        did not ask for it again (a redeliver-all or seek it asked for, it knows of)."""
        self.generation += 1
        self._last_entry = None
        self._parent._started_over(self, None)
        if reconnected:
            self.held.sent_again()

    def _rewound_by_broker(self, entry: tuple[int, int]) -> None:
        """An Exclusive/Failover consumer got `entry` again, or one before the last it got,
        with no redelivery or seek of its own: the broker rewound on its own (an ended
        transaction's acks given back, say one the coordinator aborted on its timeout, which
        the client hears of only later) and sends everything unacknowledged again, in order,
        under the same epoch. The queued entries from `entry` on come again: dropped, as
        after a redeliver-all (kept, they came before the given-back messages, and twice).
        What the application holds is stale, as after a reconnect: a transaction may not ack
        it cumulatively (the next one would take the new copies and process them again)."""
        self._parent._drop_queued_where(self, lambda at: (at.ledger_id, at.entry_id) >= entry)
        self.held.sent_again()

    def _check_not_stale(self, message_id: MessageId) -> None:
        """A transactional cumulative ack may not cover a message handed out before a
        reconnect or a rewind of the broker's: the broker has sent it again since (acked by
        this ack, the next transaction would take the new copy and commit it a second time; the
        broker cannot tell, an ack naming only where it ends), and may have given back earlier
        messages meanwhile (an ended transaction's) that this ack would take unprocessed.
        Refused, the transaction aborts and the messages come again."""
        if self.held.covers_stale(message_id):
            raise TransactionConflictError(
                f"{self}: cumulative ack of {message_id} covers messages received before the broker "
                "delivered them again (a reconnect, or its own rewind)")

    def drop_queued(self, *, give_back_permits: bool) -> None:
        """Forget the queued messages (their generation ends)."""
        if give_back_permits and self.queued:
            self.credit(self.queued)
        self._new_generation(reconnected=False)
        self.queued = 0
        self.queued_bytes = 0

    # --- acknowledgements -----------------------------------------------------------------

    def ack(self, message_id: MessageId) -> None:
        if type(message_id) is ChunkMessageId:
            # Every chunk's entry (as the C++ client's individual ack of a ChunkMessageIdImpl).
            self._acks.extend(_ack_id(m) for m in self._chunks_of(message_id))
            self._schedule_ack_flush()
            return
        if (not self.options.batch_index_ack_enabled and message_id.batch_index >= 0
                and message_id.batch_size > 0):
            # A broker without batch-index acks would take an ack set as the whole entry's ack:
            # acknowledge the entry once all its messages are (the C++ client's default).
            self._batch_acked(message_id, in_txn=False)
            return
        self._acks.append(_ack_id(message_id))
        self._schedule_ack_flush()

    def _chunks_of(self, message_id: MessageId) -> tuple[MessageId, ...]:
        """The chunk entries of `message_id`, which stops being remembered (acknowledged or
        asked for again). A deserialized chunked id names only its first and last chunk: for a
        message received here the middle ones come from what this consumer remembers of it (as
        the Java client's map of received chunk ids). Not the range of entries between first and
        last: another producer's messages may lie between them. For a chunked message not
        received here, the first and last chunk are all there is to go by."""
        named = chunk_entries(message_id)
        if type(message_id) is not ChunkMessageId:
            return named
        received = self._chunked_unacked.pop((message_id.ledger_id, message_id.entry_id), None)
        if received is not None and (received[0].ledger_id, received[0].entry_id) == (named[0].ledger_id,
                                                                                       named[0].entry_id):
            return received
        return named

    def _forget_deliveries(self) -> None:
        """Everything unacknowledged comes again (reconnect, redeliver-all, seek): what this
        consumer kept about the messages delivered so far is of no more use."""
        self._chunked_unacked.clear()
        self._batch_remaining.clear()
        self._batch_left.clear()

    def _batch_acked(self, message_id: MessageId, *, in_txn: bool) -> None:
        """Without batch-index acks: one message of a batch is acknowledged, plainly or (its
        TXN ack answered) in a transaction. Once every message of the batch is, the plain ack
        goes: the whole entry; or when the broker holds part of the batch, the ack set of the
        messages acknowledged plainly, the others left to it (a transaction's stay its own: an
        abort brings them back). The Java client leaves a transaction's acks out of its count,
        and so never acknowledges such a batch."""
        key = (message_id.ledger_id, message_id.entry_id)
        remaining = self._batch_remaining.get(key)
        if remaining is None:
            # No delivery of it is open here: completed already, given back for redelivery
            # (maybe to another consumer), or never received. Counting it anew would keep an
            # entry that nothing completes any more.
            return
        remaining.discard(message_id.batch_index)
        if in_txn:
            self._batch_left.setdefault(key, set()).add(message_id.batch_index)
        if not remaining:
            self._batch_complete(key, message_id.batch_size)

    def _batch_delivered(self, message_id: MessageId, indexes: set[int], *, with_ack_set: bool) -> None:
        """A batch came (again, maybe): `indexes` are left to acknowledge, counted from scratch
        (acks of an earlier delivery are the broker's no more). With an ack set the others are
        acknowledged on the broker (or reserved by a transaction) and left to it."""
        key = (message_id.ledger_id, message_id.entry_id)
        self._batch_remaining[key] = set(indexes)
        if with_ack_set:
            self._batch_left[key] = set(range(message_id.batch_size)) - indexes
        else:
            self._batch_left.pop(key, None)

    def _batch_complete(self, key: tuple[int, int], size: int) -> None:
        del self._batch_remaining[key]
        data = pb.MessageIdData(ledgerId=key[0] & _MASK64, entryId=key[1] & _MASK64)
        left = self._batch_left.pop(key, None)
        if left is not None:
            if len(left) >= size:
                return                          # nothing acknowledged plainly
            words = [0] * ((size + 63) // 64)   # set bits: not acknowledged by this ack
            for index in left:
                words[index // 64] |= 1 << (index % 64)
            data.ack_set.extend(_signed(w) for w in words)
            data.batch_size = size
        self._acks.append(data)
        self._schedule_ack_flush()

    def ack_cumulative(self, message_id: MessageId) -> None:
        self.held.covered_up_to(message_id)
        if self.options.batch_index_ack_enabled:
            target = _cumulative_target_with_ack_set(message_id)
        else:
            target = _cumulative_target(message_id)
            if 0 <= message_id.batch_index < message_id.batch_size - 1:
                self._batch_acked_up_to(message_id)
        if self._batch_remaining or self._batch_left or self._chunked_unacked:
            # The batches and chunked messages it covers are settled: forget them (not the
            # entry of a batch it covers only in part).
            covered = (target.ledgerId, _signed(target.entryId))
            in_part = bool(target.ack_set)
            for table in (self._batch_remaining, self._batch_left, self._chunked_unacked):
                for key in [k for k in table if (entry := (k[0] & _MASK64, k[1] & _MASK64)) < covered
                            or (entry == covered and not in_part)]:
                    del table[key]
        if self._cumulative is None or _cumulative_order(target) > _cumulative_order(self._cumulative):
            self._cumulative = target
        self._schedule_ack_flush()

    def _batch_acked_up_to(self, message_id: MessageId) -> None:
        """Without batch-index acks, a cumulative ack inside a batch acknowledges the entry
        before it (the broker would take the rest of the batch as acknowledged too): its
        indexes up to `message_id` count as acknowledged here, so that the batch completes (and
        its entry is acknowledged) once the others are, in either order (the C++ client's
        BatchMessageAcker)."""
        key = (message_id.ledger_id, message_id.entry_id)
        remaining = self._batch_remaining.get(key)
        if remaining is None:
            return
        remaining.difference_update(range(message_id.batch_index + 1))
        if not remaining:
            self._batch_complete(key, message_id.batch_size)

    def _schedule_ack_flush(self) -> None:
        if self._ack_flush is None:
            self._ack_flush = asyncio.get_running_loop().call_soon(self._flush_acks)

    def _flush_acks(self) -> None:
        self._ack_flush = None
        if self.state != READY or self.connection is None:
            return                        # kept until the consumer is connected again
        if self._acks:
            acks, self._acks = self._acks, []
            self.connection.send_command(base_command(T.ACK, consumer_id=self.consumer_id,
                                                      ack_type=pb.CommandAck.Individual, message_id=acks))
        if self._cumulative is not None:
            cumulative, self._cumulative = self._cumulative, None
            self.connection.send_command(base_command(T.ACK, consumer_id=self.consumer_id,
                                                      ack_type=pb.CommandAck.Cumulative, message_id=[cumulative]))

    async def _connected(self) -> ClientConnection:
        """Its connection, once it is (re)connected; raises at once when it is closed or has
        failed meanwhile, TimeoutError when it stays disconnected for the operation timeout."""
        if self.state != READY:
            self._check_usable()
            timeout = self._core.config.operation_timeout
            try:
                async with asyncio.timeout(timeout):        # not wait_for: 3.11's ignores a late cancel
                    await self._ready.wait()
            except TimeoutError:
                raise TimeoutError(f"{self}: not connected to the broker within the operation timeout "
                                   f"({timeout} s)") from None
            self._check_usable()
        assert self.connection is not None
        return self.connection

    def _check_usable(self) -> None:
        if self.state == FAILED and self._failure is not None:
            raise self._failure
        if self.state in (CLOSING, CLOSED, FAILED):
            raise AlreadyClosedError(f"{self} is {self.state}")

    async def ack_with_transaction(self, message_id: MessageId, txn: Transaction, cumulative: bool) -> None:
        if cumulative:
            target, ack_type = _cumulative_target_with_ack_set(message_id), pb.CommandAck.Cumulative
        else:
            target, ack_type = _ack_id(message_id), pb.CommandAck.Individual
        targets = [_ack_id(m) for m in self._chunks_of(message_id)] if not cumulative and type(
            message_id) is ChunkMessageId else [target]
        connection = await self._connected()
        if cumulative:
            self._check_not_stale(message_id)
        cmd = base_command(T.ACK, consumer_id=self.consumer_id, ack_type=ack_type, message_id=targets,
                           txnid_most_bits=txn.txn_id.most_bits, txnid_least_bits=txn.txn_id.least_bits,
                           request_id=connection.new_request_id())
        await connection.request(cmd, self._core.config.operation_timeout)
        if cumulative:
            self.held.covered_up_to(message_id)
        if (not cumulative and not self.options.batch_index_ack_enabled and message_id.batch_index >= 0
                and message_id.batch_size > 0):
            # The batch's plain ack must not wait for this message any more (it is sent by
            # index with the transaction, as Pulsar's clients do, whatever the setting).
            self._batch_acked(message_id, in_txn=True)

    # --- redelivery, seek, last message id, close -----------------------------------------

    def redeliver(self, message_ids: list[MessageId] | None) -> None:
        """Ask the broker to send again `message_ids` (their entries), or everything unacked."""
        self._flush_acks()
        if self.state != READY or self.connection is None:
            return                        # a reconnect redelivers everything unacked anyway
        if message_ids is None:
            if self.options.consumer_type in ("exclusive", "failover"):
                self.epoch += 1
            self.connection.send_command(base_command(T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
                                                      consumer_id=self.consumer_id, consumer_epoch=self.epoch))
            self.drop_queued(give_back_permits=True)
            if self._chunks is not None:
                self._chunks.clear()
            self._forget_deliveries()
            return
        for message_id in message_ids:
            # The entry comes again, maybe to another consumer: its count here is of no more use.
            self._batch_remaining.pop((message_id.ledger_id, message_id.entry_id), None)
            self._batch_left.pop((message_id.ledger_id, message_id.entry_id), None)
        ids = [pb.MessageIdData(ledgerId=c.ledger_id & _MASK64, entryId=c.entry_id & _MASK64)
               for m in message_ids for c in self._chunks_of(m)]
        self.connection.send_command(base_command(T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
                                                  consumer_id=self.consumer_id, message_ids=ids))

    async def seek(self, target: MessageId | int) -> None:
        self._flush_acks()
        connection = await self._connected()
        cmd = base_command(T.SEEK, consumer_id=self.consumer_id, request_id=connection.new_request_id())
        if isinstance(target, MessageId):
            cmd.seek.message_id.CopyFrom(_seek_target(target))
        else:
            cmd.seek.message_publish_time = target
        await connection.request(cmd, self._core.config.operation_timeout)
        self.drop_queued(give_back_permits=False)
        if self._chunks is not None:
            self._chunks.clear()
        self._forget_deliveries()
        # Now, not once the other partitions have moved too: what this one sends from its new
        # position meanwhile is received, and must time out if it is not acknowledged.
        self._parent._handler_reset(self)
        self._consumed_since_flow = 0
        self.last_dequeued = None
        self._handed_out_through = None
        self._sought_time = None if isinstance(target, MessageId) or self.options.durable else target
        if isinstance(target, MessageId):
            # The broker moves the cursor to the id's entry; as Pulsar's clients, what comes
            # before the id (in its batch too) is dropped here, and the id itself unless
            # start-inclusive: a reader's setting, never for a consumer (Pulsar's default).
            inclusive = self.options.start_message_id_inclusive and not self.options.durable
            self.start, self.start_inclusive = _start_id(target, inclusive), inclusive
        else:
            self.start = None
        self.sought_by_timestamp = not isinstance(target, MessageId)
        if self.state == READY and self.connection is connection:
            # The broker moved the cursor and forgot this consumer's permits (a broker that
            # closes the consumer instead makes it subscribe again, with a fresh FLOW).
            self._flow(self.options.receiver_queue_size)
        elif connection.usable:
            self._seek_kept_by_broker = not self.options.durable

    async def get_last_message_id(self) -> MessageId:
        return (await self.get_last_message_id_and_position())[0]

    async def get_last_message_id_and_position(self) -> tuple[MessageId, MessageId | None]:
        """The topic's last message id, and the subscription's mark-delete position (None when
        the broker gives none): GET_LAST_MESSAGE_ID's answer."""
        connection = await self._connected()
        cmd = base_command(T.GET_LAST_MESSAGE_ID, consumer_id=self.consumer_id, request_id=connection.new_request_id())
        response = await connection.request(cmd, self._core.config.operation_timeout)
        last = MessageId.from_proto(response.last_message_id)
        mark_delete = (MessageId.from_proto(response.consumer_mark_delete_position)
                       if response.HasField("consumer_mark_delete_position") else None)
        return MessageId(last.ledger_id, last.entry_id, last.batch_index, self.partition), mark_delete

    async def unsubscribe(self) -> None:
        self._flush_acks()
        connection = await self._connected()
        cmd = base_command(T.UNSUBSCRIBE, consumer_id=self.consumer_id, request_id=connection.new_request_id())
        await connection.request(cmd, self._core.config.operation_timeout)
        self._closed_locally()

    async def close(self) -> None:
        if self.state in (CLOSING, CLOSED):
            return
        self._flush_acks()
        self.state = CLOSING
        self._stop_reconnecting()
        try:
            await self._close_on_broker(self.connection, T.CLOSE_CONSUMER, consumer_id=self.consumer_id)
        finally:
            # Cancelled too: CLOSE_CONSUMER is out, and a CLOSING handler would stay so for good.
            self._closed_locally()

    def _closed_locally(self) -> None:
        self.state = CLOSED
        if self._seeking_again is not None:
            self._seeking_again.cancel()
            self._seeking_again = None
        self._ready.set()                   # the operations waiting for a connection end now
        self._stop_reconnecting()
        if self._chunk_timer is not None:
            self._chunk_timer.cancel()
            self._chunk_timer = None
        if self._ack_flush is not None:
            self._ack_flush.cancel()
            self._ack_flush = None
        if self.connection is not None:
            self.connection.consumers.pop(self.consumer_id, None)
            self.connection = None
        self.drop_queued(give_back_permits=False)
        self._forget_deliveries()


def before_start(message_id: MessageId, start: MessageId, inclusive: bool) -> bool:
    """Whether a received message comes before a reader's start or a seek's message id (so is
    dropped): an earlier entry, an earlier message of the start's batch, or the start itself
    unless `inclusive`. A start without a batch index at a batch entry keeps the whole batch,
    inclusive or not (the C++ and Java clients compare batch indexes with the start's -1)."""
    if start == MessageId.earliest or start == MessageId.latest:
        return False
    entry, start_entry = (message_id.ledger_id, message_id.entry_id), (start.ledger_id, start.entry_id)
    if entry != start_entry:
        return entry < start_entry
    if message_id.batch_index < 0:
        return not inclusive
    if start.batch_index < 0:
        return False
    return message_id.batch_index < start.batch_index or (message_id.batch_index == start.batch_index
                                                          and not inclusive)


def _permits_of(headers_and_payload: bytes | None, ack_set: Sequence[int] = ()) -> int:
    """The permits the broker took for an entry the client does not queue (unreadable, or sent
    before the last redeliver-all): a permit per message its metadata counts, or with an ack
    set (a batch partly acknowledged) per message the ack set leaves unacknowledged, as the
    broker charges (Consumer.sendMessages); 1 when even the metadata is unreadable."""
    if headers_and_payload is None:
        return 1
    try:
        metadata = parse_message_metadata(split_headers_and_payload(headers_and_payload)[0])
    except (ValueError, StorageError):      # undecodable metadata, or headers cut short
        return 1
    messages = max(1, metadata.num_messages_in_batch) if metadata.HasField("num_messages_in_batch") else 1
    if ack_set:
        try:
            return ackset_unacked_count(list(ack_set), messages)
        except (ValueError, OverflowError):
            return messages                 # (a broker's malformed ack set: the metadata's count)
    return messages


def _cumulative_target(message_id: MessageId) -> pb.MessageIdData:
    """What a cumulative ack of `message_id` sends without batch-index acks (the broker would
    take an ack set as the whole entry's ack): its entry, or for a batch message that is not
    its batch's last, the entry before (the rest of its batch is not acknowledged yet): for the
    first entry of a ledger (ledger, -1), everything before the ledger, as the C++ client's
    getPreviousMessageId and Java's prevMessageId."""
    entry_id = message_id.entry_id
    if message_id.batch_index >= 0 and message_id.batch_index < message_id.batch_size - 1:
        entry_id -= 1
    return pb.MessageIdData(ledgerId=message_id.ledger_id & _MASK64, entryId=entry_id & _MASK64)


def _cumulative_order(target: pb.MessageIdData) -> tuple[int, int, int]:
    """How far a cumulative ack's `target` reaches: its entry, then within it the fewer indexes
    its ack set leaves unacknowledged (none: the whole entry), the further."""
    left = sum(bin(word & _MASK64).count("1") for word in target.ack_set)
    return target.ledgerId, _signed(target.entryId), -left      # (ledger, -1): before its entry 0


_Item = TypeVar("_Item")


def wake_one(waiters: deque[asyncio.Future[None]]) -> None:
    """Wake the first receive() still waiting: one queued message, one receiver."""
    while waiters:
        waiter = waiters.popleft()
        if not waiter.done():
            waiter.set_result(None)
            return


async def _until(waiter: asyncio.Future[None], deadline: float | None) -> None:
    """Wait for `waiter` until the loop time `deadline` (None: no limit); TimeoutError after it.
    A cancel always raises, even once `waiter` is done (Python 3.11's wait_for would swallow it
    and let a cancelled receive take a message that nobody gets)."""
    async with asyncio.timeout_at(deadline):
        await waiter


async def receive_queued(take: Callable[[], _Item | None], waiters: deque[asyncio.Future[None]],
                         check_open: Callable[[], None], timeout: float | None) -> _Item:
    """receive()'s loop (Consumer's and MultiTopicsConsumer's): what `take` gives once there is
    something, waiting in `waiters` (woken by `wake_one`) until `timeout` seconds have passed."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        item = take()
        if item is not None:
            return item
        waiter = loop.create_future()
        waiters.append(waiter)
        try:
            await _until(waiter, deadline)
        except BaseException as exc:
            if waiter in waiters:
                waiters.remove(waiter)
            elif waiter.done() and not waiter.cancelled():
                # Woken for a message, but leaving (cancelled) without it: another waiter
                # takes it, or it would sit in the queue while that one waits.
                wake_one(waiters)
            if isinstance(exc, TimeoutError):
                # one may have come in as the wait ended (a MultiTopicsConsumer's pumps refill
                # its buffer when receive() yields): a receive(timeout=0) loop drains them all
                check_open()
                item = take()
                if item is not None:
                    return item
                raise TimeoutError(f"no message within {timeout}s") from None
            raise
        check_open()


def wake_all(waiters: MutableSequence[asyncio.Future[None]]) -> None:
    """Wake every waiter: every batch_receive() (each decides whether what is queued is enough),
    or every receive() when the consumer closes or fails."""
    woken = list(waiters)
    waiters.clear()
    for waiter in woken:
        if not waiter.done():
            waiter.set_result(None)


async def receive_batch(peek: Callable[[], Message | None], take: Callable[[], Message | None],
                        enough: Callable[[], bool], waiters: list[asyncio.Future[None]],
                        check_open: Callable[[], None], policy: ConsumerBatchReceivePolicy) -> list[Message]:
    """batch_receive()'s loop (Consumer's and MultiTopicsConsumer's): wait in `waiters` (woken
    by `wake_all`) until `enough()` or the policy's timeout, then take what the policy allows
    of what is queued (`peek` shows the next message, `take` takes it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + policy.timeout_ms / 1000 if policy.timeout_ms > 0 else None
    while not enough():
        waiter = loop.create_future()
        waiters.append(waiter)
        try:
            await _until(waiter, deadline)
        except TimeoutError:
            break
        finally:
            if waiter in waiters:
                waiters.remove(waiter)
        check_open()
    check_open()
    batch: list[Message] = []
    size = 0
    while (message := peek()) is not None and policy.can_add(len(batch), size, message):
        taken = take()
        assert taken is message
        batch.append(message)
        size += len(message.data)
    return batch


class Consumer:
    """A subscription's consumer on a topic (on a partitioned topic: on every partition)."""

    def __init__(self, core: ClientCore, topic: str, options: ConsumerOptions, partitions: int,
                 dead_letter: DeadLetterSender | None = None) -> None:
        self._core = core
        self._topic = topic
        self.options = options
        self._partitioned = partitions > 0
        self._queue: deque[tuple[PartitionConsumer, int, Message]] = deque()
        # told (the partition's consumer, which of its message ids; None: all) when messages it
        # delivered come again (asked for again, a redeliver-all, a reconnect, a seek): a
        # MultiTopicsConsumer drops the copies it took from this queue already
        self.on_entries_coming_again: EntriesComingAgain | None = None
        self._waiters: deque[asyncio.Future[None]] = deque()
        # batch_receive() calls waiting for enough messages: each push wakes them all (one
        # message may not be enough), receive()'s waiters one at a time.
        self._batch_waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self._failure: BaseException | None = None
        from pyengine.naming import TopicName

        name = TopicName.parse(topic)
        if options.consumer_name is None and options.durable:
            # One name on every partition, as pulsar-client-cpp and Java name a partitioned
            # consumer: Failover ranks its consumers by name on each partition, and names drawn
            # per partition would rank them at random (several partitions to one consumer).
            options = dataclasses.replace(options, consumer_name=f"{random.getrandbits(40):010x}")
            self.options = options
        # A consumer of one partition, named as such, gives ids of that partition (pulsar-client-cpp's
        # setPartitionIndex), so that a consumer of the whole topic takes them.
        per_partition = _partition_options(options, partitions)
        self._handlers: dict[int, PartitionConsumer] = (
            {i: PartitionConsumer(core, self, str(name.partition(i)), i, per_partition) for i in range(partitions)}
            if partitions > 0 else
            {name.partition_index: PartitionConsumer(core, self, topic, name.partition_index, options)})
        self._nacks = NegativeAckTracker(options.negative_ack_redelivery_delay_ms, self._redeliver)
        self._unacked = (UnackedMessageTracker(options.unacked_messages_timeout_ms, options.tick_duration_ms,
                                               self._redeliver)
                         if options.unacked_messages_timeout_ms else None)
        # Dead letters: the messages of each entry that came with redelivery_count >= the
        # maximum (batch index -> message), and the entries being sent to the DLQ right now.
        self._dead_letter = dead_letter
        self._dead_candidates: dict[tuple[PartitionConsumer, int, int], dict[int, Message]] = {}
        self._dead_in_flight: set[tuple[PartitionConsumer, int, int]] = set()
        # Entries whose dead-lettering failed: handed to the application when they come again,
        # as the Java client does (dead-lettered at once on arrival, they would loop).
        self._dead_letter_failed: set[tuple[PartitionConsumer, int, int]] = set()
        self._dead_tasks: set[asyncio.Task[None]] = set()
        self._partitions_update: asyncio.Task[None] | None = None
        self._closing = RunOnce(self._close)

    async def _start(self) -> None:
        try:
            await start_all(self._handlers.values())
        except BaseException:
            # Failed or cancelled: the partitions the broker already subscribed are closed too.
            await self.close()
            raise
        interval = self._core.partitions_update_interval
        if self._partitioned and interval > 0:
            # As Pulsar's clients (autoUpdatePartitions): the partitions added later are taken up.
            self._partitions_update = asyncio.get_running_loop().create_task(
                every(interval, self._add_new_partitions, lambda: self._closed,
                      f"consumer of {self.subscription_name!r} on {self._topic}: updating its partitions"))

    async def _add_new_partitions(self) -> None:
        """Subscribe each partition past the ones consumed (never fewer: partitions are not
        removed). A new partition is read from its start: all it holds was published after
        this consumer subscribed the topic, and the broker does not give the subscription to
        new partitions, so at the latest position what was sent there first would be missed."""
        from pyengine.naming import TopicName

        count = await self._core.lookup.partitions(self._topic)
        missing = [i for i in range(count) if i not in self._handlers]
        if not missing or self._closed:
            return
        options = dataclasses.replace(_partition_options(self.options, count), initial_position="earliest",
                                      start_message_id=None if self.options.durable else MessageId.earliest)
        name = TopicName.parse(self._topic)
        added = [PartitionConsumer(self._core, self, str(name.partition(i)), i, options) for i in missing]
        for handler in added:               # known before it is started: its first message may come at once
            self._handlers[handler.partition] = handler
        try:
            results = await asyncio.gather(*(h._start() for h in added), return_exceptions=True)
        except BaseException:                   # cancelled (closing): none of them is kept
            await self._drop_handlers(added)
            raise
        failed = [(h, r) for h, r in zip(added, results) if isinstance(r, BaseException)]
        if failed:                              # the next update tries those partitions again
            await self._drop_handlers([h for h, _ in failed])
            raise failed[0][1]

    async def _drop_handlers(self, handlers: list[PartitionConsumer]) -> None:
        for handler in handlers:
            self._handlers.pop(handler.partition, None)
        await close_all(handlers)

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def subscription_name(self) -> str:
        return self.options.subscription_name

    @property
    def consumer_name(self) -> str:
        return next(iter(self._handlers.values())).consumer_name

    @property
    def active(self) -> bool:
        """For Failover subscriptions: whether the broker made this consumer the active one."""
        return any(h.active for h in self._handlers.values())

    # --- the queue ------------------------------------------------------------------------

    def _push(self, handler: PartitionConsumer, message: Message) -> None:
        self._queue.append((handler, handler.generation, message))
        handler.queued_bytes += len(message.data)
        wake_one(self._waiters)
        wake_all(self._batch_waiters)

    def _drop_queued_entries(self, handler: PartitionConsumer, entries: set[tuple[int, int]]) -> None:
        """Take out of the queue `handler`'s messages of `entries` not handed out yet, giving
        back their permits: the broker sends those entries again (a nack or an ack timeout of
        one message of a batch), and they would come twice (the Java client's
        removeExpiredMessagesFromQueue)."""
        self._drop_queued_where(handler, lambda at: (at.ledger_id, at.entry_id) in entries)

    def _drop_queued_where(self, handler: PartitionConsumer, coming_again: Callable[[MessageId], bool]) -> None:
        """Take out of the queue `handler`'s messages (of its generation) whose id is
        `coming_again`, giving back their permits; the listener drops its copies too."""
        self._started_over(handler, coming_again)
        kept: list[tuple[PartitionConsumer, int, Message]] = []
        dropped = 0
        for queued in self._queue:
            owner, generation, message = queued
            if owner is handler and generation == handler.generation and coming_again(message.message_id):
                handler.queued -= 1
                handler.queued_bytes -= len(message.data)
                dropped += 1
            else:
                kept.append(queued)
        if dropped:
            self._queue.clear()
            self._queue.extend(kept)
            handler.credit(dropped)

    def _started_over(self, handler: PartitionConsumer, coming_again: Callable[[MessageId], bool] | None) -> None:
        """`handler`'s messages `coming_again` (None: all it delivered so far) come again."""
        if self.on_entries_coming_again is not None:
            self.on_entries_coming_again(handler, coming_again)

    def _peek(self) -> Message | None:
        """The message `_take` would return, left in the queue (stale ones are dropped)."""
        while self._queue:
            handler, generation, message = self._queue[0]
            if generation == handler.generation:
                return message
            self._queue.popleft()
        return None

    def _first_queued(self, handler: PartitionConsumer) -> MessageId | None:
        """The id of `handler`'s first message queued (of its generation), not handed out yet."""
        for queued_by, generation, message in self._queue:
            if queued_by is handler and generation == handler.generation:
                return message.message_id
        return None

    def _take(self) -> Message | None:
        taken = self._take_untracked()
        if taken is None:
            return None
        self._track(*taken)
        return taken[1]

    def _take_untracked(self) -> tuple[PartitionConsumer, Message] | None:
        """The next message and its partition's handler, not yet given to the ack-timeout
        tracker (`_track`)."""
        while self._queue:
            handler, generation, message = self._queue.popleft()
            if generation != handler.generation:
                continue
            handler.queued -= 1
            handler.queued_bytes -= len(message.data)
            handler.credit(1)
            handler.last_dequeued = message.message_id
            if handler.tracks_handed:
                handler.held.handed_out(message.message_id)
            return handler, message
        return None

    def _track(self, handler: PartitionConsumer, message: Message) -> None:
        """The application has `message`: its ack timeout starts."""
        if self._unacked is not None:
            self._unacked.add(handler, message.message_id)

    async def _receive_for_parent(self) -> tuple[PartitionConsumer, Message]:
        """receive() for a MultiTopicsConsumer: the message is tracked for its ack timeout only
        when the application receives it from the parent (`_track`), as the Java client's
        ConsumerImpl leaves tracking to its parent consumer."""
        self._check_open()
        return await receive_queued(self._take_untracked, self._waiters, self._check_open, None)

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosedError(f"the consumer of {self.subscription_name!r} on {self._topic} is closed")
        if self._failure is not None:
            raise self._failure

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message (TimeoutError after `timeout` seconds; None waits for ever)."""
        check_timeout("timeout", timeout)
        self._check_open()
        return await receive_queued(self._take, self._waiters, self._check_open, timeout)

    async def batch_receive(self) -> list[Message]:
        """The messages queued once the `batch_receive_policy` given to subscribe has enough
        (`max_num_message` or `max_num_bytes`), or when its `timeout_ms` has passed: then
        whatever is queued, maybe none (an empty list). As pulsar-client's: at most
        `max_num_message` messages and `max_num_bytes` bytes, but always at least one queued."""
        self._check_open()
        policy = self.options.batch_receive_policy
        assert policy is not None
        policy = policy.within(self.options.receiver_queue_size)
        return await receive_batch(self._peek, self._take, lambda: self._enough_for_batch(policy),
                                   self._batch_waiters, self._check_open, policy)

    def _queued_totals(self) -> tuple[int, int]:
        """How many messages are queued, and their payload bytes."""
        handlers = self._handlers.values()
        return sum(h.queued for h in handlers), sum(h.queued_bytes for h in handlers)

    def _enough_for_batch(self, policy: ConsumerBatchReceivePolicy) -> bool:
        # A full receiver queue gets no more messages: enough too, even with no max_num_message
        # (the C++ client would wait for max_num_bytes, for ever without a timeout).
        # The queue is full once it holds every permit the broker was given: the permits of
        # messages taken but not given back yet (under half a queue) and partitions' queues
        # smaller than receiver_queue_size (max_total_...) leave it short of that size.
        count, size = self._queued_totals()
        room = sum(h.options.receiver_queue_size - h._consumed_since_flow
                   for h in self._handlers.values() if h.state != CLOSED)
        return policy.enough(count, size) or count >= min(self.options.receiver_queue_size, room)

    def _wake_all(self) -> None:
        wake_all(self._waiters)
        wake_all(self._batch_waiters)

    def _handler_failed(self, handler: PartitionConsumer, error: BaseException) -> None:
        self._failure = error
        self._wake_all()

    # --- acknowledgements -----------------------------------------------------------------

    def _resolve(self, message: Any) -> tuple[PartitionConsumer, MessageId]:
        if isinstance(message, Message):
            message_id = message.message_id
        elif isinstance(message, MessageId):
            message_id = message
        else:
            raise TypeError(f"expected a Message or MessageId, not {type(message).__name__}")
        if not self._partitioned:
            handler = next(iter(self._handlers.values()))
        else:
            handler = self._handlers.get(message_id.partition)
            if handler is None:
                raise ValueError(f"message id {message_id} is not of a partition of {self._topic}")
        # A received message's id names its topic: one of another topic, acknowledged here,
        # would acknowledge whatever sits at its position on this one (as pulsar-client-cpp,
        # which looks the consumer up by the id's topic, it is refused).
        if message_id.topic_name and message_id.topic_name != handler.topic:
            raise ValueError(f"message id {message_id} is of {message_id.topic_name}, not of {handler.topic}")
        return handler, message_id

    async def acknowledge(self, message: Message | MessageId, txn: Transaction | None = None) -> None:
        """Acknowledge one message; with `txn`, as part of the transaction (it takes effect on
        commit, and waits for the broker's answer: a conflict raises TransactionConflictError)."""
        await self._acknowledge(message, txn, cumulative=False)

    async def acknowledge_cumulative(self, message: Message | MessageId, txn: Transaction | None = None) -> None:
        """Acknowledge every message up to this one (Exclusive and Failover subscriptions)."""
        if self.options.consumer_type in ("shared", "key_shared"):
            raise CumulativeAcknowledgementNotAllowedError(
                f"cumulative acknowledgement is not allowed on a {self.options.consumer_type} subscription")
        await self._acknowledge(message, txn, cumulative=True)

    async def _acknowledge(self, message: Any, txn: Transaction | None, *, cumulative: bool) -> None:
        from pyengine.client.transaction import Transaction, check_same_client

        handler, message_id = self._resolve(message)
        if txn is not None:
            check_same_client(txn, self._core.coordinator)  # before a closed consumer fails it
        try:
            self._check_open()
        except Exception as exc:
            if isinstance(txn, Transaction):
                txn._refused(exc)       # as a closed producer's send: the commit must not succeed
            raise
        if txn is None:
            self._acknowledged(handler, message_id, cumulative)
            if cumulative:
                handler.ack_cumulative(message_id)
            else:
                handler.ack(message_id)
            return
        if not isinstance(txn, Transaction):
            raise TypeError(f"txn must be a Transaction of pyengine.client, not {type(txn).__name__}")
        txn._check_open()
        operation: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        txn._track(operation)          # commit waits for this ack, whatever happens below
        try:
            if cumulative and self not in txn._cumulative_consumers:
                # Rewound if the transaction aborts, even when this ack fails (a refused
                # registration too: the application took messages it will not process; as
                # Java's registerCumulativeAckConsumer, before anything is sent). A v4 abort
                # is applied when it is answered, a v5 one (segment topics) by the broker
                # before the rewind it asks for.
                txn._cumulative_consumers.append(self)
            # Shielded: the registration is shared with the transaction's other acks here.
            await asyncio.shield(txn._register_subscription(handler.topic, self.subscription_name))
            # As the Java client: the message stops being tracked (ack timeout, DLQ) when its
            # ACK goes out, not before: an ended transaction or a failed registration leaves
            # it unacknowledged, to time out and be redelivered.
            self._acknowledged(handler, message_id, cumulative)
            await handler.ack_with_transaction(message_id, txn, cumulative)
        except BaseException as exc:
            operation.set_exception(exc)
            operation.exception()
            raise
        operation.set_result(None)

    async def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Ask for the message again after `negative_ack_redelivery_delay_ms` (redelivered with a
        higher redelivery count)."""
        handler, message_id = self._resolve(message)
        self._check_open()
        if self._unacked is not None:
            self._unacked.remove(handler, message_id)
        if self.options.negative_ack_redelivery_delay_ms == 0:
            self._redeliver(handler, [message_id])
        else:
            self._nacks.add(handler, message_id)

    def _acknowledged(self, handler: PartitionConsumer, message_id: MessageId, cumulative: bool) -> None:
        """An acknowledgement: the message no longer times out nor goes to the DLQ."""
        if self._unacked is not None:
            if cumulative:
                self._unacked.remove_until(handler, message_id)
            else:
                self._unacked.remove(handler, message_id)
        if not self._dead_candidates:
            return
        if cumulative:
            limit = (message_id.ledger_id, message_id.entry_id)
            for key in [k for k in self._dead_candidates if k[0] is handler and k[1:] < limit]:
                del self._dead_candidates[key]
        key = (handler, message_id.ledger_id, message_id.entry_id)
        candidates = self._dead_candidates.get(key)
        if candidates is not None:
            if cumulative:
                for index in [i for i in candidates if i <= message_id.batch_index]:
                    del candidates[index]
            else:
                candidates.pop(message_id.batch_index, None)
            if not candidates:
                del self._dead_candidates[key]

    def _handler_reset(self, handler: PartitionConsumer) -> None:
        """`handler` (re)subscribed or moved: the broker sends everything unacked again."""
        if self._unacked is not None:
            self._unacked.forget(handler)
        for key in [k for k in self._dead_candidates if k[0] is handler]:
            del self._dead_candidates[key]

    # --- redelivery and dead letters ----------------------------------------------------------

    def _redeliver(self, handler: object, message_ids: list[MessageId]) -> None:
        """Ask again for messages nacked or timed out; those redelivered too often go to the
        dead letter topic instead (as the C++ client's processPossibleToDLQ)."""
        assert isinstance(handler, PartitionConsumer)
        if self._closed:
            return
        if self._dead_letter is not None and self._dead_candidates:
            dead: list[tuple[PartitionConsumer, int, int]] = []
            rest: list[MessageId] = []
            for message_id in message_ids:
                key = (handler, message_id.ledger_id, message_id.entry_id)
                if key in self._dead_in_flight or key in dead:
                    continue
                if key in self._dead_candidates:
                    dead.append(key)
                else:
                    rest.append(message_id)
            if dead:
                self._dead_in_flight.update(dead)
                task = asyncio.get_running_loop().create_task(self._send_dead_letters(handler, dead, rest))
                self._dead_tasks.add(task)
                task.add_done_callback(self._dead_tasks.discard)
                return
            message_ids = rest
        self._redeliver_plain(handler, message_ids)

    def _redeliver_plain(self, handler: PartitionConsumer, message_ids: list[MessageId]) -> None:
        if not message_ids or self._closed:
            return
        if self.options.consumer_type in ("shared", "key_shared"):
            self._drop_queued_entries(handler, {(c.ledger_id, c.entry_id) for m in message_ids
                                                for c in chunk_entries(m)})
            handler.redeliver(message_ids)
        else:
            # One consumer owns the subscription's order: as Pulsar's clients, redeliver
            # everything unacknowledged (the broker does so for an exclusive consumer anyway).
            handler.redeliver(None)
            if self._unacked is not None:
                self._unacked.forget(handler)

    async def _send_dead_letters(self, handler: PartitionConsumer, keys: list[tuple[PartitionConsumer, int, int]],
                                 rest: list[MessageId]) -> None:
        sender = self._dead_letter
        assert sender is not None
        failed: list[MessageId] = []
        try:
            for key in keys:
                messages = list(self._dead_candidates.pop(key, {}).values())
                results = await asyncio.gather(*(sender.send(handler.topic, m) for m in messages),
                                               return_exceptions=True)
                entry_failed = False
                for message, result in zip(messages, results):
                    if isinstance(result, BaseException):
                        log.warning("%s: could not send %s to the dead letter topic %s: %s", handler,
                                    message.message_id, sender.topic_for(handler.topic), result)
                        entry_failed = True
                    elif not self._closed and handler.state not in (CLOSING, CLOSED):
                        self._acknowledged(handler, message.message_id, False)
                        handler.ack(message.message_id)
                if entry_failed:
                    self._dead_letter_failed.add(key)
                    # A chunked message by its own id, so that every chunk comes again (the
                    # last chunk's entry alone could not be put back together).
                    chunked = [m.message_id for m in messages if type(m.message_id) is ChunkMessageId]
                    failed.append(chunked[0] if chunked else MessageId(key[1], key[2], -1, handler.partition))
        finally:
            self._dead_in_flight.difference_update(keys)
        # What could not be dead-lettered is redelivered, to be tried again.
        self._redeliver_plain(handler, rest + failed)

    def _screen_dead_letters(self, handler: PartitionConsumer, messages: list[Message],
                             redelivery_count: int) -> list[Message]:
        """The messages of an arriving entry to queue. From `max_redeliver_count` on they are
        remembered for the DLQ; above it they are not handed out but dead-lettered at once."""
        sender = self._dead_letter
        assert sender is not None
        first = messages[0].message_id
        key = (handler, first.ledger_id, first.entry_id)
        if key in self._dead_in_flight:
            return []                 # on its way to the DLQ (and acknowledged after)
        if redelivery_count < sender.max_redeliver_count:
            return messages
        self._dead_candidates[key] = {m.message_id.batch_index: m for m in messages}
        if key in self._dead_letter_failed:
            self._dead_letter_failed.discard(key)
            return messages           # its next nack or ack timeout tries the DLQ again
        if redelivery_count > sender.max_redeliver_count:
            self._redeliver(handler, [MessageId(first.ledger_id, first.entry_id, -1, handler.partition)])
            return []
        return messages

    async def redeliver_unacknowledged_messages(self) -> None:
        """Have the broker send again every message it sent to this consumer that is not
        acknowledged (the local queue is dropped: its messages come again). On an Exclusive or
        Failover subscription the consumer epoch goes up (PIP-84): what the broker sent before
        and is still on its way is dropped as it arrives."""
        self._check_open()
        for handler in self._handlers.values():
            handler.redeliver(None)
            if self._unacked is not None:
                self._unacked.forget(handler)

    async def seek(self, target: MessageId | int) -> None:
        """Move the subscription to a message id (MessageId.earliest / .latest too) or to a
        publish time in milliseconds since the epoch. As pulsar-client: what comes next is what
        follows the id (the rest of its batch, then the next entries); a reader created
        start-inclusive reads the id's message again. On a partitioned topic an id moves its
        own partition only, earliest / latest / a time every partition."""
        self._check_open()
        if isinstance(target, bool) or not isinstance(target, (MessageId, int)):
            raise TypeError(f"seek takes a MessageId or a timestamp in ms, not {type(target).__name__}")
        if isinstance(target, int) and not 0 <= target < 1 << 64:
            raise ValueError(f"a seek timestamp is in ms since the epoch, >= 0 and < 2**64, not {target}")
        if isinstance(target, MessageId) and target not in (MessageId.earliest, MessageId.latest):
            handler, _ = self._resolve(target)
            # An id of another topic names no entry of this one (a received message's id names its topic).
            if target.topic_name and target.topic_name != handler.topic:
                raise ValueError(f"message id {target} is of {target.topic_name}, not of {handler.topic}")
            if self._partitioned:           # as pulsar-client: only the id's partition moves
                await handler.seek(target)
                return
        await asyncio.gather(*(h.seek(target) for h in self._handlers.values()))

    async def get_last_message_id(self) -> MessageId:
        """The id of the last message stored on the topic. Not on a partitioned topic, where
        no one id is the last (ledger ids do not order partitions): `get_last_message_ids`
        gives each partition's; pulsar-client-cpp answers OperationNotSupported."""
        self._check_open()
        if self._partitioned:
            raise NotAllowedError(f"{self._topic} is partitioned: it has no one last message id "
                                  "(get_last_message_ids() gives each partition's)")
        return await next(iter(self._handlers.values())).get_last_message_id()

    async def get_last_message_ids(self) -> list[MessageId]:
        """The id of the last message stored on each partition (one id on a topic that is not
        partitioned), in partition order, as the Java client's getLastMessageIds."""
        self._check_open()
        handlers = [self._handlers[i] for i in sorted(self._handlers)]
        return list(await asyncio.gather(*(h.get_last_message_id() for h in handlers)))

    async def unsubscribe(self) -> None:
        """Delete the subscription (on a partitioned topic: on every partition), then close. As
        pulsar-client-cpp: every partition is tried; if one fails, its error is raised and this
        consumer stays open, so unsubscribe can be retried (on the partitions still subscribed)."""
        self._check_open()
        # Partitions unsubscribed by an earlier, partly failed call stay closed (and kept, so
        # that the partition update does not subscribe them again): not tried again.
        handlers = [h for h in self._handlers.values() if h.state != CLOSED]
        results = await asyncio.gather(*(h.unsubscribe() for h in handlers), return_exceptions=True)
        errors: list[BaseException] = []
        for handler, result in zip(handlers, results):
            if isinstance(result, BaseException):
                errors.append(result)
                log.warning("consumer of %r: unsubscribing %s failed: %s",
                            self.subscription_name, handler.topic, result)
        if errors:
            raise errors[0]
        await self.close()

    async def close(self) -> None:
        """Close every partition's consumer; a cancelled close still finishes (see RunOnce)."""
        await self._closing()

    async def _close(self) -> None:
        # First, as the C++ client: what waits to receive ends now (AlreadyClosedError).
        self._closed = True
        self._queue.clear()
        self._wake_all()
        if self._partitions_update is not None:
            self._partitions_update.cancel()
        await asyncio.gather(*(h.close() for h in self._handlers.values()))
        self._nacks.close()
        if self._unacked is not None:
            self._unacked.close()
        for task in list(self._dead_tasks):
            task.cancel()
        self._dead_candidates.clear()
        self._dead_letter_failed.clear()
        if self._dead_letter is not None:
            await self._dead_letter.close()
        self._core.forget(self)

