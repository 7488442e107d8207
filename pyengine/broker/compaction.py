"""Topic compaction (Pulsar's TwoPhaseCompactor / PublishingOrderCompactor, CompactedTopicImpl).

Compaction keeps, for every key, the latest message published up to the compaction horizon:

* it reads the topic READ_COMMITTED and never past the read horizon (the transaction buffer's
  max read position): markers are skipped, entries of aborted transactions are left out, and
  an open transaction's entries are beyond the horizon (Pulsar #21718/#21951: the compaction
  reader must neither wait for a marker it never receives nor read past an open transaction);
* the horizon is that max read position itself, not the last visible message, so a horizon
  that is a marker is fine: the next compaction, and read-compacted readers, go on after it;
* a message without a key is not kept (Pulsar's default topicCompactionRetainNullKey=false);
* an empty payload (or `null_value`) is a tombstone: it deletes its key;
* a batch is split by key: it is kept with its retained messages, the others written as
  `compacted_out` with an empty payload, so batch indexes (message ids) stay the original
  ones (Pulsar's RawBatchConverter.rebatchMessage); the rebuilt batch is stored uncompressed;
* a chunked message (its chunks are entries of their own, with the message's key) is one
  message: kept whole, every chunk, when it is the latest of its key, the time it takes its
  key's value being that of its last chunk (when a consumer gets it). Pulsar's compactor takes
  each chunk as a message of the key, so it keeps only the last chunk, a message no consumer
  can assemble. A chunked message that cannot be assembled (a gap in its chunk ids, chunks
  without their first) is never kept; one incomplete at the horizon is kept as it is, without
  taking its key's value, since its other chunks may follow the horizon (a read-compacted
  consumer gets them from the ledger, the next compaction sees it whole), unless abandoned:
  its last chunk published more than the clients' expiry of incomplete chunked messages
  (60 s) before the newest message compacted;
* compaction is incremental, as Pulsar's (its compactor reads through the `__compaction`
  subscription, which itself reads compacted): the previous view, then the ledger after the
  previous horizon.

The result (`pyengine.storage.compacted.CompactedView`) is a new generation of the view,
staged in bounded writes (memory holds phase one's map of keys and one write's entries, not
the view), then made current in one LMDB transaction with the move of the `__compaction`
cursor to the horizon and the cursor property `CompactedTopicLedger` (Pulsar's
COMPACTED_TOPIC_LEDGER_PROPERTY; here the generation number); the previous generation is
removed after. So the view survives restarts, a crash while staging leaves the previous view
and horizon, and the ledger is never trimmed under what compaction has not read yet: that
durable cursor holds the ledger like any subscription.

Status is Pulsar's LongRunningProcessStatus (NOT_RUN, RUNNING, SUCCESS, ERROR + lastError),
in memory as in Pulsar (a restarted broker reports NOT_RUN until compaction runs again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from core_ext.records import decompress
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import parse_message_metadata
from pyengine.storage.compacted import LEGACY, CompactedView
from pyengine.storage.environment import WriteFn
from pyengine.storage.entry import NO_TXN, Entry, headers_and_payload, split_headers_and_payload
from pyengine_kernels import Position, ackset_new

if TYPE_CHECKING:
    from pyengine.broker.topic import Topic

log = logging.getLogger(__name__)

COMPACTION_SUBSCRIPTION = "__compaction"
COMPACTED_TOPIC_LEDGER_PROPERTY = "CompactedTopicLedger"
NOT_RUN, RUNNING, SUCCESS, ERROR = "NOT_RUN", "RUNNING", "SUCCESS", "ERROR"
READ_CHUNK = 500
# The clients' default expireTimeOfIncompleteChunkedMessage: an incomplete chunked message with
# no chunk for that long is dropped by consumers, and left out of the view.
INCOMPLETE_CHUNKED_MESSAGE_EXPIRY_MS = 60_000
# Phase two stages the view in writes of at most so many entries or bytes (memory is bounded
# by them and by phase one's map of keys); old generations are removed so many rows a write.
STAGE_CHUNK_ENTRIES = 500
STAGE_CHUNK_BYTES = 4 << 20
DELETE_CHUNK = 1000
# The last message id of a read-compacted reader scans the view back in reads of so many
# entries (chunks can be large).
LAST_MESSAGE_SCAN_CHUNK = 16
_SIZE = struct.Struct(">I")


class CompactionAlreadyRunningError(Exception):
    """Pulsar's AlreadyRunningException ("Compaction already in progress"): HTTP 409."""


class _Message:
    """One message of an entry, as compaction sees it."""

    __slots__ = ("index", "key", "tombstone", "metadata", "payload")

    def __init__(self, index: int, key: str | None, tombstone: bool, metadata: bytes | None,
                 payload: bytes) -> None:
        self.index = index                 # batch index, -1 for a message that is not batched
        self.key = key
        self.tombstone = tombstone
        self.metadata = metadata           # serialised SingleMessageMetadata (batches)
        self.payload = payload


# What splitting a batch raises on bytes that are not one (a malformed or foreign payload).
_UNSPLITTABLE = (ValueError, struct.error, DecodeError)


def _split_batch(payload: bytes, count: int) -> list[tuple[bytes, pb.SingleMessageMetadata, bytes]]:
    out = []
    view = memoryview(payload)
    offset = 0
    for _ in range(count):
        size = _SIZE.unpack_from(view, offset)[0]
        offset += 4
        raw = bytes(view[offset:offset + size])
        offset += size
        smd = pb.SingleMessageMetadata()
        smd.ParseFromString(raw)
        body = bytes(view[offset:offset + smd.payload_size])
        offset += smd.payload_size
        out.append((raw, smd, body))
    return out


def entry_messages(entry: Entry) -> tuple[pb.MessageMetadata, list[_Message]] | None:
    """The metadata and messages of `entry`; None for what compaction never keeps (markers,
    undecodable entries)."""
    if entry.is_marker:
        return None
    try:
        raw, payload = split_headers_and_payload(entry.data)
        md = parse_message_metadata(raw)
    except ValueError:
        log.warning("compaction: entry %s is undecodable: left out", entry.position)
        return None
    if md.HasField("marker_type") and md.marker_type != 0:
        return None                                     # server-only markers (Markers.isServerOnlyMarker)
    if not md.HasField("num_messages_in_batch") or md.encryption_keys:
        # A message alone, or an encrypted batch, which the broker cannot split (Pulsar's
        # RawBatchConverter.isReadableBatch): one message, by its metadata's key, kept whole.
        key = md.partition_key if md.HasField("partition_key") else None
        size = md.uncompressed_size if md.compression != pb.NONE else len(payload)
        return md, [_Message(-1, key, size <= 0 or md.null_value, None, payload)]
    try:
        if md.compression != pb.NONE:
            payload = decompress(md.compression, payload, md.uncompressed_size)
        batch = _split_batch(payload, md.num_messages_in_batch)
    except _UNSPLITTABLE as exc:
        # Left out, as an undecodable entry: failing would stop every later compaction here.
        log.warning("compaction: the batch of entry %s does not decode (%s): left out", entry.position, exc)
        return None
    messages = []
    for index, (smd_raw, smd, body) in enumerate(batch):
        if smd.compacted_out:
            continue
        key = smd.partition_key if smd.HasField("partition_key") else None
        messages.append(_Message(index, key, smd.payload_size <= 0 or smd.null_value, smd_raw, body))
    return md, messages


def _chunk_fields(md: pb.MessageMetadata) -> tuple[str, int, int] | None:
    """(uuid, chunk id, number of chunks) of a chunk of a chunked message; None otherwise."""
    if md.num_chunks_from_msg > 1 and not md.HasField("num_messages_in_batch"):
        return md.uuid, md.chunk_id, md.num_chunks_from_msg
    return None


class _ChunkRuns:
    """The chunked messages being put together in phase one, by uuid, with the rules of the
    consumers' assembler: a first chunk starts a message (again), a chunk with the next id
    adds to it, a repeated one is a duplicate (not kept), a gap breaks it (never kept)."""

    def __init__(self) -> None:
        self._runs: dict[str, tuple[str | None, int, list[Position], int]] = {}

    def add(self, entry: Entry, key: str | None, uuid: str, chunk_id: int,
            num_chunks: int) -> list[Position] | None:
        """Take one chunk; the positions of every chunk once its message is complete."""
        run = self._runs.get(uuid)
        if chunk_id == 0:
            run = self._runs[uuid] = (key, num_chunks, [], 0)
        elif run is None or chunk_id < len(run[2]):
            return None                                 # no first chunk, or a duplicate
        elif chunk_id > len(run[2]) or run[1] != num_chunks:
            del self._runs[uuid]                        # cannot be assembled
            return None
        positions = run[2]
        positions.append(entry.position)
        self._runs[uuid] = (run[0], run[1], positions, entry.publish_time)
        if len(positions) < num_chunks:
            return None
        del self._runs[uuid]
        return positions

    def incomplete(self, abandoned_before_ms: int) -> set[Position]:
        """The chunks of the keyed messages still incomplete, unless abandoned (their last
        chunk published before `abandoned_before_ms`)."""
        return {position for key, _, positions, last_publish in self._runs.values()
                if key is not None and last_publish >= abandoned_before_ms for position in positions}


def _compacted_entry(entry: Entry, md: pb.MessageMetadata, kept: list[_Message]) -> Entry:
    """`entry` with only the messages in `kept` (a batch keeps its size: the others are
    compacted out, with an empty payload). Transaction fields are cleared: what is in the
    view is committed."""
    if not md.HasField("num_messages_in_batch") or any(m.index < 0 for m in kept):
        data = entry.data                   # a message alone, or a batch kept whole (encrypted)
    else:
        kept_by_index = {m.index: m for m in kept}
        empty = pb.SingleMessageMetadata(payload_size=0, compacted_out=True).SerializeToString()
        parts = []
        for index in range(md.num_messages_in_batch):
            message = kept_by_index.get(index)
            raw, body = (message.metadata, message.payload) if message is not None else (empty, b"")
            parts.append(_SIZE.pack(len(raw)) + raw + body)
        payload = b"".join(parts)
        new_md = pb.MessageMetadata()
        new_md.CopyFrom(md)
        new_md.compression = pb.NONE
        new_md.uncompressed_size = len(payload)
        data = headers_and_payload(new_md.SerializeToString(), payload)
    return Entry(entry.position, data, NO_TXN, NO_TXN, 0, entry.num_messages, entry.publish_time)


class TopicCompaction:
    """The compaction state of one topic: its compacted view, horizon and last run's status."""

    def __init__(self, topic: Topic) -> None:
        self.topic = topic
        self.view = CompactedView(topic.ledger.env, topic.ledger.topic_id)
        self.horizon: Position | None = None
        self.status = NOT_RUN
        self.last_error = ""
        self._task: asyncio.Task[None] | None = None
        self._masks: dict[Position, list[int]] = {}      # compacted_out_mask per view entry

    def load(self) -> None:
        """Take up the horizon of the last compaction (the `__compaction` cursor's position)."""
        cursor = self.topic.ledger.cursors.get(COMPACTION_SUBSCRIPTION)
        if cursor is not None and COMPACTED_TOPIC_LEDGER_PROPERTY in cursor.properties:
            self.view.take_up(cursor.properties[COMPACTED_TOPIC_LEDGER_PROPERTY])
            self.horizon = cursor.mark_delete

    # --- running --------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def trigger(self) -> asyncio.Task[None]:
        """Start a compaction; CompactionAlreadyRunningError if one is running."""
        if self.running:
            raise CompactionAlreadyRunningError("Compaction already in progress")
        self.status, self.last_error = RUNNING, ""
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"compaction-{self.topic.name}")
        return self._task

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    def status_json(self) -> dict[str, str]:
        """Pulsar's LongRunningProcessStatus."""
        return {"status": self.status, "lastError": self.last_error}

    async def _run(self) -> None:
        try:
            await self.compact()
        except asyncio.CancelledError:
            self.status, self.last_error = ERROR, "compaction cancelled"
            raise
        except Exception as exc:              # reported through the status
            log.warning("compaction of %s failed: %s", self.topic.name, exc, exc_info=True)
            self.status, self.last_error = ERROR, str(exc) or type(exc).__name__
        else:
            self.status = SUCCESS

    async def compact(self) -> Position | None:
        """Compact up to the read horizon now; the new horizon (None: nothing to compact)."""
        topic = self.topic
        ledger = topic.ledger
        # The compaction subscription first: from now on it holds what compaction will read.
        subscription = await topic.open_subscription(COMPACTION_SUBSCRIPTION, "earliest")
        cursor = subscription.cursor
        horizon = topic.buffer.max_read_position()
        previous = self.horizon
        if horizon.entry_id < 0 or (previous is not None and horizon <= previous):
            return None                       # empty topic, or nothing since the last compaction
        # Phase one: the latest message of each key: (position, batch index), or every chunk
        # of a chunked message.
        latest: dict[str, tuple[Position, int] | list[Position]] = {}
        chunks = _ChunkRuns()
        newest_publish_time = 0
        async for entry, (md, messages) in self._entries(previous, horizon):
            newest_publish_time = max(newest_publish_time, entry.publish_time)
            chunk = _chunk_fields(md)
            if chunk is not None:
                key = messages[0].key if messages else None
                complete = chunks.add(entry, key, *chunk)
                if complete is not None and key is not None:
                    latest[key] = complete
                continue
            for message in messages:
                if message.key is None:
                    continue
                if message.tombstone:
                    latest.pop(message.key, None)
                else:
                    latest[message.key] = (entry.position, message.index)
        # What phase two keeps: the (position, batch index) of each key's latest message, and
        # the chunks of the chunked messages incomplete at the horizon.
        wanted: set[tuple[Position, int]] = set()
        for value in latest.values():
            if isinstance(value, list):
                wanted.update((position, -1) for position in value)
            else:
                wanted.add(value)
        abandoned_before = newest_publish_time - INCOMPLETE_CHUNKED_MESSAGE_EXPIRY_MS
        wanted.update((position, -1) for position in chunks.incomplete(abandoned_before))
        # Phase two: the entries holding them, staged in bounded writes into a new generation
        # of the view, which readers do not see until the switch below. What a failed or
        # killed compaction staged is removed by the next one.
        generation = cursor.properties.get(COMPACTED_TOPIC_LEDGER_PROPERTY, 0) + 1
        if generation == self.view.generation:
            generation += 1                   # never staged into the view being read
        await self._delete_other_generations()
        staged: list[Entry] = []
        staged_bytes = kept_entries = 0
        async for entry, (md, messages) in self._entries(previous, horizon):
            kept = [m for m in messages if m.key is not None and (entry.position, m.index) in wanted]
            if kept:
                compacted = _compacted_entry(entry, md, kept)
                staged.append(compacted)
                staged_bytes += len(compacted.data)
                kept_entries += 1
                if len(staged) >= STAGE_CHUNK_ENTRIES or staged_bytes >= STAGE_CHUNK_BYTES:
                    await ledger.env.submit(self.view.stage_write(generation, staged))
                    staged, staged_bytes = [], 0
        if staged:
            await ledger.env.submit(self.view.stage_write(generation, staged))
            staged = []
        if topic.subscriptions.get(COMPACTION_SUBSCRIPTION) is not subscription or topic.closed:
            # Its subscription was deleted meanwhile (the view goes with it), or the topic closed.
            raise RuntimeError("the compaction subscription was deleted during the compaction")
        # The switch: the cursor records the new generation and moves to the horizon in one
        # group commit (one LMDB transaction) with the view's part of it: no await between the
        # submissions. The cursor is moved without asking the ledger to trim: what it covers
        # may be trimmed only once the view holding it is durable.
        old_properties = dict(cursor.properties)
        old_mark_delete, old_read = cursor.mark_delete, cursor.read_position
        old_generation = self.view.generation
        writes = [ledger.env.submit(self.view.switch_write())] if old_generation == LEGACY else []
        cursor.properties[COMPACTED_TOPIC_LEDGER_PROPERTY] = generation
        if horizon > cursor.mark_delete:
            cursor.mark_delete = horizon
            if cursor.read_position <= horizon:
                cursor.read_position = ledger.next_position(horizon)
        writes.append(cursor.persist())
        outcome = asyncio.gather(*writes)
        try:
            try:
                await asyncio.shield(outcome)
            except asyncio.CancelledError:
                # The writes are queued and will land (or fail) together: the state in memory
                # must be what is on disk, also when the topic closes meanwhile.
                with contextlib.suppress(BaseException):
                    await outcome
                if outcome.cancelled() or outcome.exception() is not None:
                    raise
                self._written(horizon, generation)
                raise
        except BaseException:
            if not (outcome.done() and not outcome.cancelled() and outcome.exception() is None):
                cursor.properties.clear()
                cursor.properties.update(old_properties)
                cursor.mark_delete, cursor.read_position = old_mark_delete, old_read
            raise
        self._written(horizon, generation)
        if horizon > old_mark_delete:
            ledger.trim_soon()                 # the slowest cursor may have moved on
        try:
            await self._delete_other_generations()
        except Exception as exc:               # the next compaction removes it
            log.warning("compaction of %s: the previous view is not removed yet: %s", topic.name, exc)
        log.info("compacted %s up to %s: %d keys in %d entries", topic.name, horizon, len(latest),
                 kept_entries)
        return horizon

    async def _delete_other_generations(self) -> None:
        """Remove, in bounded writes, the rows of every generation of the view but the current.
        A read first: most runs have nothing to remove, and a write costs a group commit."""
        if not self.view.has_other_generations(self.view.generation):
            return
        env = self.topic.ledger.env
        while await env.submit(self.view.delete_others_write(self.view.generation, DELETE_CHUNK)) >= DELETE_CHUNK:
            pass

    def _written(self, horizon: Position, generation: int) -> None:
        self.view.use(generation)
        self.horizon = horizon
        self._masks.clear()

    async def _entries(self, previous: Position | None, horizon: Position):
        """The visible entries up to `horizon` with their messages: the compacted view (up to
        `previous`), then the ledger after `previous`; markers and aborted entries skipped."""
        if previous is not None:
            for count, entry in enumerate(self.view.iter_entries()):
                parsed = entry_messages(entry)
                if parsed is not None:
                    yield entry, parsed
                if count % READ_CHUNK == READ_CHUNK - 1:
                    await asyncio.sleep(0)
        ledger, buffer = self.topic.ledger, self.topic.buffer
        start = ledger.next_position(previous) if previous is not None else ledger.first_position()
        while start <= horizon:
            entries = ledger.read_entries(start, READ_CHUNK, horizon)
            if not entries:
                break
            for entry in entries:
                if entry.is_marker or (entry.txn_most >= 0 and buffer.hides(entry)):
                    continue
                parsed = entry_messages(entry)
                if parsed is not None:
                    yield entry, parsed
            start = ledger.next_position(entries[-1].position)
            await asyncio.sleep(0)

    # --- reading --------------------------------------------------------------------------

    def read_entries(self, start: Position, max_entries: int) -> list[Entry]:
        """Entries of the view from `start` on, up to the horizon."""
        if self.horizon is None:
            return []
        return self.view.read_entries(start, max_entries, self.horizon)

    def read_entry(self, position: Position) -> Entry | None:
        return self.view.read_entry(position)

    def compacted_out_mask(self, entry: Entry) -> list[int] | None:
        """For a batch of the view: an ack set (set bit = not acknowledged) with its compacted
        out indexes cleared, so that they are never delivered nor wait for an ack; None
        when the entry has none."""
        if entry.num_messages <= 1:
            return None
        cached = self._masks.get(entry.position)
        if cached is not None:
            return cached or None
        mask: list[int] = []
        try:
            md = parse_message_metadata(split_headers_and_payload(entry.data)[0])
            if md.HasField("num_messages_in_batch") and md.compression == pb.NONE and not md.encryption_keys:
                _, payload = split_headers_and_payload(entry.data)
                out = [i for i, (_, smd, _) in enumerate(_split_batch(payload, md.num_messages_in_batch))
                       if smd.compacted_out]
                if out:
                    mask = ackset_new(md.num_messages_in_batch)
                    for index in out:
                        word = (mask[index // 64] & ~(1 << (index % 64))) & 0xFFFF_FFFF_FFFF_FFFF
                        mask[index // 64] = word - (1 << 64) if word >= 1 << 63 else word
        except _UNSPLITTABLE:
            mask = []
        if len(self._masks) > 10_000:
            self._masks.clear()
        self._masks[entry.position] = mask
        return mask or None

    def last_message_position(self, position: Position, batch_index: int) -> tuple[Position, int]:
        """For a read-compacted consumer: the last message id, given the topic's last visible
        message (`position`, `batch_index`): that one when it is after the compaction horizon,
        else the last message of the compacted view a consumer can receive ((ledger, -1) when
        there is none). Pulsar answers the compacted ledger's last entry, always a whole
        message there; here the view may end with the chunks of a chunked message incomplete
        at the horizon, which no reader receives until the rest of it follows the horizon:
        naming one would keep `hasMessageAvailable` true with nothing to read."""
        horizon = self.horizon
        if horizon is None or position > horizon:
            return position, batch_index
        found = self._last_receivable()
        if found is None:
            return Position(horizon.ledger_id, -1), -1
        entry, parsed = found
        last_index = -1
        if parsed is not None and parsed[0].HasField("num_messages_in_batch") and parsed[1]:
            last_index = parsed[1][-1].index
        return entry.position, last_index

    def _last_receivable(self) -> tuple[Entry, tuple[pb.MessageMetadata, list[_Message]] | None] | None:
        """The view's last entry (and its messages) that is not a chunk of an incomplete
        chunked message. Scanning back, a chunk other than a last one is always such a chunk:
        a whole message's last chunk comes after its others, and ends the scan first."""
        before: Position | None = None
        while True:
            entries = self.view.read_entries_backward(before, LAST_MESSAGE_SCAN_CHUNK)
            for entry in entries:
                parsed = entry_messages(entry)
                chunk = _chunk_fields(parsed[0]) if parsed is not None else None
                if chunk is None or chunk[1] == chunk[2] - 1:
                    return entry, parsed
            if len(entries) < LAST_MESSAGE_SCAN_CHUNK:
                return None
            before = entries[-1].position

    def rewind_to_view(self, cursor, target: Position | None = None) -> Position | None:
        """Put a read-compacted cursor on the first entry of the view at or after `target`
        (None: the view's first entry) when that entry lies before the cursor's read
        position: the view keeps entries of ledgers trimmed since, which the cursor's moves
        (clamped to the stored ledgers) would pass over. Used for a subscription created at
        'earliest', a reader from MessageId.earliest, a seek (Pulsar #11159), and a
        subscription taken up again after a restart (Pulsar #21187: a read-compacted cursor
        rewinds to its mark-delete's next position, not the next valid one). The entries'
        positions are the original ones; returns the new read position (None: unchanged)."""
        horizon = self.horizon
        if horizon is None:
            return None
        start = target if target is not None else Position(-1, -1)
        if start > horizon:
            return None
        first = self.view.read_entries(start, 1, horizon)
        if not first:
            return None
        position = first[0].position
        if position >= cursor.read_position:
            return None
        if cursor.mark_delete >= position:
            cursor.mark_delete = position.prev()
        cursor.read_position = position
        cursor.persist()
        return position

    def find_by_publish_time(self, timestamp_ms: int, found: Position) -> Position:
        """A read-compacted seek by publish time: the first entry of the view published at
        or after `timestamp_ms` when it comes before `found`, the stored ledger's answer (the
        view may hold entries of ledgers trimmed since)."""
        horizon = self.horizon
        if horizon is None:
            return found
        position = self.view.find_by_publish_time(timestamp_ms, min(found, horizon.next()))
        return position if position is not None else found

    def resume_in_view(self, cursor) -> Position | None:
        """A read-compacted subscription taken up with its cursor rewound (its read position
        the next stored entry after its mark-delete): go on with the view's entries between
        the two, if any (they are in ledgers trimmed since)."""
        if self.horizon is None or cursor.mark_delete >= self.horizon:
            return None
        if cursor.read_position != self.topic.ledger.next_position(cursor.mark_delete):
            return None
        return self.rewind_to_view(cursor, cursor.mark_delete.next())

    def compacted_out_mask_at(self, position: Position) -> list[int] | None:
        if self.horizon is None or position > self.horizon:
            return None
        entry = self.view.read_entry(position)
        return self.compacted_out_mask(entry) if entry is not None else None

    def iter_view(self) -> Iterator[Entry]:
        return self.view.iter_entries()

    async def delete(self) -> None:
        await self.topic.ledger.env.submit(self.delete_write())
        self.forget()

    def delete_write(self) -> WriteFn:
        """The write removing the compacted view, for a deletion that removes more with it."""
        return self.view.delete_write()

    def forget(self) -> None:
        """The view was deleted: nothing is compacted any more."""
        self.view.use(0)
        self.horizon = None
        self._masks.clear()

    async def close(self) -> None:
        if self.running:
            assert self._task is not None
            self._task.cancel()
            # Waited for, not awaited: a cancellation of the caller must reach the caller (not
            # be taken for the compaction's own), and must not cancel the compaction again
            # while its switch, already written, is being taken up in memory.
            await asyncio.wait([self._task])


__all__ = ["COMPACTION_SUBSCRIPTION", "COMPACTED_TOPIC_LEDGER_PROPERTY", "CompactionAlreadyRunningError",
           "TopicCompaction", "entry_messages"]
