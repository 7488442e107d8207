"""A producer's open batch: messages collected until it is full or its delay has passed, then
sent as one entry (N x [size][SingleMessageMetadata][payload], built by core_ext.batch)."""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

from core_ext.batch import build_batch
from pyengine.client.message import MessageId
from pyengine.protocol import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from pyengine.client.transaction import Transaction


def _varint(value: int) -> bytes:
    if value < 0x4000:                           # sequence ids and sizes mostly fit in two bytes
        return bytes((value,)) if value < 0x80 else bytes((value & 0x7F | 0x80, value >> 7))
    if value < 0x200000:
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def plain_single_metadata(payload_size: int, sequence_id: int) -> bytes:
    """The serialised SingleMessageMetadata of a message with no key, properties or event
    time: payload_size (field 3) and sequence_id (field 8), as protobuf writes them, built
    directly because protobuf's message object costs more than the rest of a batched send."""
    return _size_field(payload_size) + _varint(sequence_id)


@functools.lru_cache(maxsize=64)
def _size_field(payload_size: int) -> bytes:
    """payload_size and the tag of sequence_id (producers mostly send one size)."""
    return b"\x18" + _varint(payload_size) + b"\x40"


class BatchContainer:
    def __init__(self, max_messages: int, max_bytes: int, txn: Transaction | None) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.txn = txn
        # the txn's registration of the partition its SEND waits for (None: none to wait for)
        self.gate: asyncio.Future[None] | None = None
        self._singles: list[tuple[bytes, bytes]] = []
        self.futures: list[asyncio.Future[MessageId]] = []
        self.first_sequence_id = -1
        self.last_sequence_id = -1
        self.size = 0
        self.count = 0                    # messages (an attribute: the producer reads it per send)

    def __len__(self) -> int:
        return self.count

    def add(self, single_metadata: bytes, payload: bytes, sequence_id: int,
            future: asyncio.Future[MessageId]) -> bool:
        """Add a message; True when the batch is full with it."""
        singles = self._singles
        if not singles:
            self.first_sequence_id = sequence_id
        self.last_sequence_id = sequence_id
        singles.append((single_metadata, payload))
        self.futures.append(future)
        self.count = count = self.count + 1
        self.size = size = self.size + len(payload)
        return count >= self.max_messages or size >= self.max_bytes

    def payload(self) -> bytes:
        return build_batch(self._singles)

    def without_settled(self) -> BatchContainer:
        """A batch of the messages of this one whose futures are not settled yet (their
        senders gave the others up before the batch was sent)."""
        kept = BatchContainer(self.max_messages, self.max_bytes, self.txn)
        kept.gate = self.gate
        for (single, payload), future in zip(self._singles, self.futures):
            if not future.done():
                kept.add(single, payload, pb.SingleMessageMetadata.FromString(single).sequence_id, future)
        return kept
