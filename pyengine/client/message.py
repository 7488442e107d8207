"""Messages and message ids, shared by the embedded client and the network client.

A stored entry is one message, or a batch of them; `decode_entry` turns an entry's bytes
("headers and payload": Pulsar MessageMetadata + payload) into the messages a consumer sees,
skipping batch indexes already acknowledged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import total_ordering
from typing import ClassVar

from core_ext.batch import decode_batch
from core_ext.records import RecordFormatError, decompress
from pyengine.protocol.commands import parse_message_metadata
from pyengine.protocol.pulsar_api_pb2 import MessageIdData
from pyengine.schema import decode_version
from pyengine.storage.entry import split_headers_and_payload
from pyengine_kernels import Position, ackset_acked_indexes

_U64 = 1 << 64


def _to_u64(value: int) -> int:
    return value % _U64


def _from_u64(value: int) -> int:
    return value - _U64 if value >= 1 << 63 else value


@total_ordering
@dataclass(frozen=True, slots=True)
class MessageId:
    """Where a message is: entry position, index in its batch (-1 if not batched), partition.
    A received message's id also names the topic (or partition) it came from, as
    pulsar-client-cpp's getTopicName: not part of equality, hashing or serialize()."""

    ledger_id: int
    entry_id: int
    batch_index: int = -1
    partition: int = -1
    batch_size: int = field(default=0, compare=False)
    # Keyword-only: subclasses (ChunkMessageId) keep their positional fields.
    topic_name: str = field(default="", compare=False, repr=False, kw_only=True)

    earliest: ClassVar[MessageId]
    latest: ClassVar[MessageId]

    @property
    def position(self) -> Position:
        return Position(self.ledger_id, self.entry_id)

    def _key(self) -> tuple[int, int, int]:
        return (self.ledger_id, self.entry_id, self.batch_index)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() < other._key()

    def to_proto(self) -> MessageIdData:
        """The MessageIdData of this id (as the network client puts it into commands)."""
        data = MessageIdData(ledgerId=_to_u64(self.ledger_id), entryId=_to_u64(self.entry_id),
                             partition=self.partition, batch_index=self.batch_index)
        if self.batch_size:
            data.batch_size = self.batch_size
        return data

    def serialize(self) -> bytes:
        """The wire form (MessageIdData), compatible with pulsar-client's MessageId.serialize."""
        return self.to_proto().SerializeToString()

    @classmethod
    def deserialize(cls, data: bytes) -> MessageId:
        try:
            msg = MessageIdData.FromString(data)
        except Exception as exc:  # protobuf's DecodeError and friends
            raise ValueError(f"not a serialized message id: {exc}") from exc
        return cls.from_proto(msg)

    @classmethod
    def from_proto(cls, msg: MessageIdData) -> MessageId:
        """The id in `msg`; a chunked message's (one with `first_chunk_message_id`) is a
        ChunkMessageId of its first and last chunks, as pulsar-client-cpp's MessageId::deserialize."""
        plain = MessageId(_from_u64(msg.ledgerId), _from_u64(msg.entryId), msg.batch_index, msg.partition,
                          msg.batch_size if msg.HasField("batch_size") else 0)
        if msg.HasField("first_chunk_message_id"):
            from pyengine.client.chunks import ChunkMessageId     # chunks imports this module
            first = msg.first_chunk_message_id
            return ChunkMessageId.of([MessageId(_from_u64(first.ledgerId), _from_u64(first.entryId), -1,
                                                first.partition), plain])
        return plain

    def __str__(self) -> str:
        return f"({self.ledger_id},{self.entry_id},{self.partition},{self.batch_index})"


MessageId.earliest = MessageId(-1, -1)
MessageId.latest = MessageId((1 << 63) - 1, (1 << 63) - 1)


@dataclass(slots=True)
class Message:
    """A received message."""

    topic: str
    message_id: MessageId
    data: bytes
    properties: dict[str, str]
    partition_key: str | None
    ordering_key: bytes | None
    event_time: int
    publish_time: int
    producer_name: str
    sequence_id: int
    redelivery_count: int = 0
    schema_version: int | None = None      # of the schema its producer declared (None: none)

    def value(self) -> bytes:
        return self.data

    @property
    def key(self) -> str | None:
        return self.partition_key


def unacked_from(first: int, size: int) -> list[int]:
    """An ack set (Pulsar's long[] words) with the indexes `first .. size - 1` of a batch of
    `size` unacknowledged (bits set) and those before them acknowledged."""
    words = [0] * ((size + 63) // 64)
    for index in range(first, size):
        words[index // 64] |= 1 << (index % 64)
    return [_from_u64(w) for w in words]


def seek_ack_set(message_id: MessageId) -> list[int] | None:
    """What a seek to `message_id` tells the broker besides its entry (as the Java client):
    for a message inside a batch, the ack set of its index and those after it, so the
    subscription holds the earlier indexes acknowledged. None outside a batch (or when the
    batch's size is not known)."""
    size, index = message_id.batch_size, message_id.batch_index
    return unacked_from(index, size) if 0 < index < size else None


class DecodeError(ValueError):
    """An entry's bytes are not a valid Pulsar message."""


def _decompress(codec: int, payload: bytes, uncompressed_size: int) -> bytes:
    """The payload as produced (the compiled decompressor the Spark decoder uses too)."""
    try:
        return decompress(codec, payload, uncompressed_size)
    except RecordFormatError as exc:
        raise DecodeError(str(exc)) from None


def _schema_version(raw: bytes) -> int | None:
    # Apache's are 8 bytes big-endian; anything else is opaque to the client (None).
    return decode_version(raw) if len(raw) == 8 else None


def decode_entry(topic: str, position: Position, data: bytes, *, partition: int = -1,
                 redelivery_count: int = 0, ack_set: list[int] | None = None) -> list[Message]:
    """The messages of one stored entry; batch indexes acknowledged in `ack_set` are left out."""
    try:
        raw_metadata, payload = split_headers_and_payload(data)
        md = parse_message_metadata(raw_metadata)
    except ValueError as exc:
        raise DecodeError(f"entry {position} of {topic}: {exc}") from exc
    payload = _decompress(md.compression, payload, md.uncompressed_size)
    common = dict(topic=topic, publish_time=md.publish_time, producer_name=md.producer_name,
                  redelivery_count=redelivery_count,
                  schema_version=_schema_version(md.schema_version) if md.HasField("schema_version") else None)
    if not md.HasField("num_messages_in_batch"):
        return [Message(message_id=MessageId(position.ledger_id, position.entry_id, -1, partition, topic_name=topic),
                        data=payload, properties={kv.key: kv.value for kv in md.properties},
                        partition_key=md.partition_key if md.HasField("partition_key") else None,
                        ordering_key=md.ordering_key if md.HasField("ordering_key") else None,
                        event_time=md.event_time, sequence_id=md.sequence_id, **common)]
    count = md.num_messages_in_batch
    if count <= 0:
        # Nothing to hand out, yet the broker took a permit for the entry and keeps it in the
        # backlog: undecodable, so the consumer acknowledges it and gives the permit back.
        raise DecodeError(f"entry {position} of {topic}: a batch of no message")
    try:
        pieces = decode_batch(payload, count)       # compiled: each message's fields, no protobuf object
    except ValueError as exc:
        raise DecodeError(f"entry {position} of {topic}: {exc}") from exc
    skipped = set(ackset_acked_indexes(ack_set, count)) if ack_set is not None else ()
    messages = []
    ledger_id, entry_id, first_sequence = position.ledger_id, position.entry_id, md.sequence_id
    for index, (body, properties, partition_key, ordering_key, event_time, sequence_id) in enumerate(pieces):
        if index in skipped:
            continue
        messages.append(Message(
            message_id=MessageId(ledger_id, entry_id, index, partition, count, topic_name=topic),
            data=body, properties=properties, partition_key=partition_key, ordering_key=ordering_key,
            event_time=event_time, sequence_id=first_sequence + index if sequence_id is None else sequence_id,
            **common))
    return messages
