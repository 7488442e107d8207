"""Chunked messages put back together by the data source, one row per message.

A producer with `chunking_enabled` sends a message larger than the broker's max_message_size
as several entries ("chunks", `pyengine.client.chunks`), compressed first and then cut, so a
chunk alone is not a message: a consumer concatenates the chunks of one uuid in order and
decompresses the result. The source gives what a READ_COMMITTED reader of its range receives:

* A message is the row of its LAST chunk (its ledger_id and entry_id, as Pulsar's
  ChunkMessageId), with that chunk's metadata (key, properties, times, txn id), so the task
  reading the entry range holding the last chunk yields it, once, even when its first chunks
  are in an earlier range, ledger or micro-batch.
* Chunks follow the rules of pyengine's consumer (`ChunkAssembler`, after pulsar-client-cpp):
  a first chunk starts the message again, a duplicate chunk is ignored, a gap drops it. Unlike
  a consumer, the source keeps any number of incomplete messages and none expires: it reads
  what is stored, not a live stream.
* The chunks read are the entries visible to the reader (READ_COMMITTED: not an aborted or
  open transaction's) at or after the read's start (`startPosition`, or a stream's first
  offset): a message whose first chunk is before the start is left out, as by a reader
  started there.

A task meets the chunks of its range in order. A message whose first chunk it did not see (it
began before the range) and whose last chunk is in the range is completed by reading back from
the range's start to that first chunk (`look_back`), chunk entries only.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from pyengine.protocol.pulsar_api_pb2 import MessageMetadata
from pyengine.storage.entry import split_headers_and_payload
from pyengine.storage.errors import CorruptRecordError

_ENTRY_HEADER = 32          # the stored entry's own header (pyengine.storage.entry.HEADER)
_U32 = struct.Struct(">I")
_CHUNK_FIELDS = ("uuid", "num_chunks_from_msg", "total_chunk_msg_size", "chunk_id")


@dataclass(slots=True)
class Chunk:
    """One chunk entry: its position, the chunk fields, and what the message is rebuilt from."""

    ledger_id: int
    entry_id: int
    uuid: str
    chunk_id: int
    num_chunks: int
    total_size: int
    publish_time: int
    header: bytes               # the stored entry header (txn id, marker type, publish time)
    metadata: MessageMetadata
    payload: bytes


def parse_chunk(ledger_id: int, entry_id: int, value: bytes) -> Chunk:
    """The chunk stored at `ledger_id:entry_id` (a stored value that `chunk_indices` selected)."""
    from core_ext.records import RecordFormatError

    try:
        metadata_bytes, payload = split_headers_and_payload(memoryview(value)[_ENTRY_HEADER:])
        metadata = MessageMetadata.FromString(metadata_bytes)
    except (CorruptRecordError, DecodeError) as exc:
        raise RecordFormatError(f"entry {ledger_id}:{entry_id}: {exc}") from None
    return Chunk(ledger_id, entry_id, metadata.uuid, metadata.chunk_id, metadata.num_chunks_from_msg,
                 metadata.total_chunk_msg_size, metadata.publish_time, bytes(value[:_ENTRY_HEADER]), metadata,
                 payload)


def message_entry(last: Chunk, payload: bytes) -> bytes:
    """A stored entry holding the whole message (the last chunk's header and metadata without
    the chunk fields, and the chunks' payloads joined): what `decode_entries` makes the row of."""
    metadata = MessageMetadata()
    metadata.CopyFrom(last.metadata)
    for name in _CHUNK_FIELDS:
        metadata.ClearField(name)
    encoded = metadata.SerializeToString()
    return last.header + _U32.pack(len(encoded)) + encoded + payload


def _assembler() -> Any:
    from pyengine.client.chunks import ChunkAssembler

    return ChunkAssembler(max_pending=0, expire_ms=0)       # no limit, no expiry: see the module doc


def _feed(assembler: Any, chunk: Chunk) -> bytes | None:
    """Pass `chunk` to a consumer's assembler; the whole payload when it completes a message."""
    from pyengine.client.message import MessageId

    outcome = assembler.process(chunk.uuid, chunk.chunk_id, chunk.num_chunks, chunk.total_size,
                                chunk.publish_time, MessageId(chunk.ledger_id, chunk.entry_id), chunk.payload, 0)
    return outcome.payload


LookBack = Callable[[set[str]], dict[str, list[Chunk]]]


class RangeChunks:
    """The chunks of one task's entry range, met in position order: `add` each one; it gives
    the entry of the message it completes, if any. `finish` completes the messages that began
    before the range."""

    def __init__(self) -> None:
        self._assembler = _assembler()
        self._seen: set[str] = set()
        # uuid -> its chunks in the range from the first one met, when that one was not a
        # first chunk: the message began before the range (or its first chunk is not readable).
        # A first chunk of the uuid met later closes the list (`_closed`): from there on the
        # assembler has all it needs.
        self._began_before: dict[str, list[Chunk]] = {}
        self._closed: set[str] = set()

    def add(self, chunk: Chunk) -> tuple[Chunk, bytes] | None:
        uuid = chunk.uuid
        if uuid not in self._seen:
            self._seen.add(uuid)
            if chunk.chunk_id != 0:
                self._began_before[uuid] = [chunk]
                return None
        elif uuid in self._began_before and uuid not in self._closed:
            if chunk.chunk_id != 0:
                self._began_before[uuid].append(chunk)
                return None
            self._closed.add(uuid)
        payload = _feed(self._assembler, chunk)
        return (chunk, message_entry(chunk, payload)) if payload is not None else None

    def finish(self, look_back: LookBack) -> list[tuple[Chunk, bytes]]:
        """The messages begun before the range and completed in it: their earlier chunks
        through `look_back(uuids)` (each uuid's chunks from its last first chunk before the
        range, in order; a uuid left out has no readable first chunk)."""
        # Only a message whose last chunk is in the range can complete here.
        candidates = {uuid: chunks for uuid, chunks in self._began_before.items()
                      if any(c.chunk_id == c.num_chunks - 1 for c in chunks)}
        if not candidates:
            return []
        earlier = look_back(set(candidates))
        completed = []
        for uuid, chunks in candidates.items():
            prefix = earlier.get(uuid)
            if not prefix:
                continue
            assembler = _assembler()
            for chunk in prefix:
                _feed(assembler, chunk)     # (a message completed before the range is not this range's)
            for chunk in chunks:
                payload = _feed(assembler, chunk)
                if payload is not None:
                    completed.append((chunk, message_entry(chunk, payload)))
        completed.sort(key=lambda done: (done[0].ledger_id, done[0].entry_id))
        return completed


def earlier_chunks(entries: Iterable[tuple[list[int], list[int], list[bytes]]],
                   visible: Callable[[list[int], list[int], list[bytes]], Any],
                   wanted: set[str]) -> dict[str, list[Chunk]]:
    """`RangeChunks.finish`'s look-back over `entries` (stored entries newest first, as
    `ReadView.iter_raw_before` yields them): for each wanted uuid, its visible chunks from its
    last first chunk on, in order; a uuid whose first chunk is not met is left out."""
    from core_ext.records import chunk_indices

    pending = set(wanted)
    found: dict[str, list[Chunk]] = {uuid: [] for uuid in wanted}
    for ledgers, entry_ids, values in entries:
        for i in chunk_indices(ledgers, entry_ids, values, visible(ledgers, entry_ids, values)):
            chunk = parse_chunk(ledgers[i], entry_ids[i], values[i])
            if chunk.uuid in pending:
                found[chunk.uuid].append(chunk)
                if chunk.chunk_id == 0:
                    pending.discard(chunk.uuid)
        if not pending:
            break
    return {uuid: chunks[::-1] for uuid, chunks in found.items() if uuid not in pending}


def chunks_of(ledgers: list[int], entry_ids: list[int], values: list[bytes],
              indices: Iterable[int]) -> Iterator[Chunk]:
    for i in indices:
        yield parse_chunk(ledgers[i], entry_ids[i], values[i])


__all__ = ["Chunk", "RangeChunks", "chunks_of", "earlier_chunks", "message_entry", "parse_chunk"]
