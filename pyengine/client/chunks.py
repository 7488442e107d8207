"""Chunked messages: one large message split over several entries, and put back together.

Pulsar's producers split a message whose (compressed) payload is over the broker's
`max_message_size` into chunks, each sent as its own SEND with the message's sequence id and
the chunk fields of MessageMetadata: `uuid` (producer name + "-" + sequence id), `chunk_id`
(0 .. num_chunks_from_msg - 1), `num_chunks_from_msg` and `total_chunk_msg_size` (the size of
the whole payload as sent, compressed). A consumer concatenates the chunks of one uuid, in
order, and decompresses the result; the application gets one message whose id spans every
chunk entry (`ChunkMessageId`: its own ledger and entry are the last chunk's, as Pulsar's
ChunkMessageIdImpl), so acknowledging it acknowledges every chunk.

`ChunkAssembler` is the consumer's side, after the C++ client's ConsumerImpl::processMessageChunk
and ChunkedMessageCtx (pulsar-client-cpp lib/ConsumerImpl.cc, lib/ConsumerImpl.h).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyengine.client.message import MessageId
from pyengine.protocol.pulsar_api_pb2 import MessageIdData

# The varint tag of MessageMetadata.num_chunks_from_msg (field 27): a cheap test of whether a
# message's metadata may carry chunk fields, before parsing it (false positives just parse).
NUM_CHUNKS_TAG = bytes([(27 << 3) & 0x7F | 0x80, (27 << 3) >> 7])

# pulsar-client's defaults (C++ ConsumerConfigurationImpl.h; the Python create_producer /
# subscribe keyword defaults are the same).
DEFAULT_MAX_PENDING_CHUNKED_MESSAGE = 10
DEFAULT_EXPIRE_TIME_OF_INCOMPLETE_CHUNKED_MESSAGE_MS = 60_000


@dataclass(frozen=True, slots=True)
class ChunkMessageId(MessageId):
    """The id of a chunked message: the last chunk's position, with every chunk's id."""

    chunk_ids: tuple[MessageId, ...] = field(default=(), compare=False)

    @property
    def first_chunk_id(self) -> MessageId:
        return self.chunk_ids[0]

    @classmethod
    def of(cls, chunk_ids: list[MessageId]) -> ChunkMessageId:
        last = chunk_ids[-1]
        return cls(last.ledger_id, last.entry_id, -1, last.partition, 0, tuple(chunk_ids))

    def to_proto(self) -> MessageIdData:
        data = MessageId.to_proto(self)
        if self.chunk_ids:
            first = self.chunk_ids[0]
            data.first_chunk_message_id.CopyFrom(MessageId(first.ledger_id, first.entry_id, -1,
                                                           first.partition).to_proto())
        return data


def chunk_entries(message_id: MessageId) -> tuple[MessageId, ...]:
    """The entries to acknowledge (or redeliver) for `message_id`: every chunk of a chunked one."""
    if isinstance(message_id, ChunkMessageId) and message_id.chunk_ids:
        return message_id.chunk_ids
    return (message_id,)


class _Context:
    __slots__ = ("total_chunks", "total_size", "ids", "parts", "received_ms")

    def __init__(self, total_chunks: int, total_size: int) -> None:
        self.total_chunks = total_chunks
        self.total_size = total_size
        self.ids: list[MessageId] = []
        self.parts: list[bytes] = []
        self.received_ms = 0

    def append(self, message_id: MessageId, payload: bytes, now_ms: int) -> None:
        self.ids.append(message_id)
        self.parts.append(payload)
        self.received_ms = now_ms          # as the C++ ChunkedMessageCtx: the last chunk's arrival

    def holds(self, message_id: MessageId) -> bool:
        return any(i.ledger_id == message_id.ledger_id and i.entry_id == message_id.entry_id for i in self.ids)


@dataclass(slots=True)
class ChunkOutcome:
    """What one chunk leads to: the whole message (payload as sent, still compressed, and its
    id) once the last chunk is in, the chunk entries to acknowledge now (dropped ones), and
    those dropped but left unacknowledged, for the ack-timeout tracker to ask for again (the
    C++ client's trackMessage: without it a Shared consumer would hold them until it reconnects)."""

    payload: bytes | None = None
    message_id: ChunkMessageId | None = None
    ack: list[MessageId] = field(default_factory=list)
    track: list[MessageId] = field(default_factory=list)


class ChunkAssembler:
    """The incomplete chunked messages of one consumer (per partition), by uuid, oldest first."""

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING_CHUNKED_MESSAGE,
                 auto_ack_oldest_on_queue_full: bool = False,
                 expire_ms: int = DEFAULT_EXPIRE_TIME_OF_INCOMPLETE_CHUNKED_MESSAGE_MS) -> None:
        self.max_pending = max_pending
        self.auto_ack_oldest = auto_ack_oldest_on_queue_full
        self.expire_ms = expire_ms
        self._contexts: dict[str, _Context] = {}

    def __len__(self) -> int:
        return len(self._contexts)

    def clear(self) -> None:
        """Forget everything (the broker redelivers the unacknowledged chunks)."""
        self._contexts.clear()

    def first_chunk(self) -> MessageId | None:
        """The first chunk of the oldest incomplete message (None: none is incomplete)."""
        return min((context.ids[0] for context in self._contexts.values() if context.ids), default=None)

    def process(self, uuid: str, chunk_id: int, num_chunks: int, total_size: int, publish_time: int,
                message_id: MessageId, payload: bytes, now_ms: int) -> ChunkOutcome:
        outcome = ChunkOutcome()
        contexts = self._contexts
        context = contexts.get(uuid)
        if chunk_id == 0:
            if context is not None:
                # A first chunk again: redelivered (the old chunks come again: no ack), or a new
                # message under the same uuid (the old chunks would be an ack hole: ack them).
                if not context.holds(message_id):
                    outcome.ack.extend(context.ids)
                del contexts[uuid]
            if self.max_pending > 0 and len(contexts) >= self.max_pending:
                for old in list(contexts)[:len(contexts) - self.max_pending + 1]:
                    dropped = contexts.pop(old)
                    (outcome.ack if self.auto_ack_oldest else outcome.track).extend(dropped.ids)
            context = contexts[uuid] = _Context(num_chunks, total_size)
            context.append(message_id, payload, now_ms)
            return outcome
        expired = self.expire_ms > 0 and now_ms > publish_time + self.expire_ms
        if context is None:
            # Its first chunk was not seen (a seek, a start in the middle, an evicted context).
            (outcome.ack if expired else outcome.track).append(message_id)
            return outcome
        if chunk_id != len(context.ids):
            if chunk_id < len(context.ids):
                # A duplicate: redelivered (dropped), or another entry with an old chunk id (acked).
                if not context.holds(message_id):
                    outcome.ack.append(message_id)
                return outcome
            # A gap: the message cannot be assembled. Unlike the C++ client, which leaves the
            # chunks already in untracked, they go with this one (same message, same expiry).
            dropped_ids = contexts.pop(uuid).ids
            (outcome.ack if expired else outcome.track).extend([*dropped_ids, message_id])
            return outcome
        context.append(message_id, payload, now_ms)
        if len(context.ids) < context.total_chunks:
            return outcome
        del contexts[uuid]
        outcome.payload = b"".join(context.parts)
        outcome.message_id = ChunkMessageId.of(context.ids)
        return outcome

    def expire(self, now_ms: int) -> list[MessageId]:
        """Drop the incomplete messages whose last chunk came over `expire_ms` ago: their
        chunk entries, to acknowledge (as the C++ client's checkExpiredChunkedTimer)."""
        acks: list[MessageId] = []
        if self.expire_ms <= 0:
            return acks
        for uuid in [u for u, c in self._contexts.items() if now_ms > c.received_ms + self.expire_ms]:
            acks.extend(self._contexts.pop(uuid).ids)
        return acks
