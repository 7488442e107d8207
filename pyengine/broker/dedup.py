"""Message de-duplication (Pulsar's MessageDeduplication): a retried send is stored once.

Per producer name the topic remembers the highest sequence id stored ("persisted") and the
highest one accepted and still being written ("pushed"). A send whose sequence id is not above
what was pushed is a duplicate: if it is not above what was persisted it is answered without
storing anything; if it is the very send still being written, it waits for it and gets its
answer; any other sequence id above the persisted one (inside a batch still in flight, whose
outcome is not known yet) fails with a retriable PersistenceError (`MessageDupUnknownError`),
as Apache's MessageDeduplication.isDuplicate answers MessageDupStatus.Unknown and its topic
completes the send with MessageDupUnknownException: the client gets a SEND_ERROR and resends
later, when the answer is known.

The highest persisted sequence id is written in the same LMDB transaction as the entry (the
write is submitted right after the append, in the same event-loop turn, so group commit puts
both in one batch), and only with it: the record is conditional on the entry's write, so a send
whose entry is not written (its commit failed, it queued behind one that failed, its txn's
registration failed) is never recorded as published - after a restart its retry is stored, not
dropped.

An entry appended later than the send (the first transactional send on a topic, which waits
for the topic to be marked transactional; a transaction buffer still recovering; a v5 buffer,
which appends from a task) cannot share its record's write: the record is written once the
entry is durable, in a later commit. For a crash in between, the topic keeps a replay start
(Pulsar's de-duplication cursor position): written before any such entry can be, it is at or
before every late entry whose record may not be durable yet, and it is deleted again once
there is none. Loading a topic with a replay start reads the entries after it and takes each
producer's sequence id from their metadata (as Pulsar replays the entries after its snapshot),
so the stored entries and the de-duplication state agree after any crash.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from typing import Any

from pyengine.errors import PersistenceError
from pyengine.protocol.commands import parse_message_metadata
from pyengine.storage import ManagedLedger
from pyengine.storage.entry import split_headers_and_payload
from pyengine.transaction.outcome import mark_retrieved
from pyengine_kernels import Position

_SEQ = struct.Struct(">Q")          # sequence ids are uint64, as on the wire
_POSITION = struct.Struct(">qq")
# After the topic's prefix, the key of its replay start: no producer name's key (UTF-8) can be it.
_REPLAY_START = b"\xff"
_REPLAY_CHUNK = 256


class MessageDupUnknownError(PersistenceError):
    """Whether the send is a duplicate cannot be told yet (Apache's MessageDupUnknownException,
    answered as a PersistenceError): a send with that sequence id is still being written.
    Retriable: resent once that write is settled, the send gets a definite answer."""


class MessageDeduplication:
    def __init__(self, ledger: ManagedLedger, enabled: bool) -> None:
        self.ledger = ledger
        self._enabled = enabled
        self._db = ledger.env.db("dedup")
        self._persisted: dict[str, int] = {}
        self._pushed: dict[str, int] = {}
        self._in_flight: dict[tuple[str, int], asyncio.Future[Position]] = {}
        self._numbering = 0             # bumped when switched off: sends of an earlier one are not ours
        self._unsealed: dict[tuple[Any, ...], int] = {}     # queued record writes: their value
        # Late sends (entry appended after the send was accepted) not settled yet: where their
        # entry can be at the earliest (after this position); in acceptance order.
        self._late: dict[int, Position] = {}
        self._late_ids = itertools.count()
        self._replay_start: Position | None = None      # as last submitted
        # Producer names with no producer attached -> when a purge round first saw them so
        # (Pulsar's inactiveProducers), for `purge_inactive`.
        self._inactive: dict[str, int] = {}
        self._load()

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, enabled: bool) -> None:
        """Switched by policy at run time. Switched off, it forgets every producer's sequence
        id, stored ones included (Apache deletes its de-duplication cursor and clears its
        maps): sent while it was off, sequence ids may start again from anywhere, and once it
        is on again, what it remembered from before must not drop them."""
        if self._enabled and not enabled:
            self._forget()
        self._enabled = enabled

    def _load(self) -> None:
        stored = self._stored_names()
        replay_start = self._stored_replay_start()
        if not self._enabled:
            # Disabled since those were written (the policy changed while the topic was
            # unloaded): stale, as when it is switched off at run time.
            if stored or replay_start is not None:
                self._forget()
            return
        if replay_start is not None:
            replayed = self._replay(replay_start)
            for name, sequence_id in replayed.items():
                stored[name] = max(stored.get(name, -1), sequence_id)
            self._write_replayed(replayed)
        self._persisted = stored
        self._pushed = dict(self._persisted)

    def _stored_replay_start(self) -> Position | None:
        with self.ledger.env.read() as txn:
            raw = txn.get(self.ledger._prefix + _REPLAY_START, db=self._db)
        return None if raw is None else Position(*_POSITION.unpack(raw))

    def _replay(self, after: Position) -> dict[str, int]:
        """Each producer's highest sequence id in the entries after `after` (Pulsar's replay of
        its de-duplication cursor: max(highest_sequence_id, sequence_id) of each entry's
        metadata; here, as the wire path records it, with a batch's messages numbered from its
        sequence id). Markers and chunks before a message's last count for nothing."""
        found: dict[str, int] = {}
        start = after.next()
        while True:
            entries = self.ledger.read_entries(start, _REPLAY_CHUNK)
            for entry in entries:
                if entry.is_marker:
                    continue
                try:
                    metadata = parse_message_metadata(split_headers_and_payload(entry.data)[0])
                except Exception:
                    continue            # not a producer's message: nothing to recover from it
                name = metadata.producer_name
                if not name or type(name) is not str or metadata.chunk_id < metadata.num_chunks_from_msg - 1:
                    continue            # (a name that is not UTF-8 is no producer's: PRODUCER refuses it)
                highest = max(metadata.highest_sequence_id, metadata.sequence_id + entry.num_messages - 1)
                found[name] = max(found.get(name, -1), highest)
            if len(entries) < _REPLAY_CHUNK:
                return found
            start = entries[-1].position.next()

    def _write_replayed(self, replayed: dict[str, int]) -> None:
        """Store what the replay found and drop the replay start (the entries it covered are
        durable, so this needs no condition; lost in a crash, the next load replays again)."""
        prefix, db = self.ledger._prefix, self._db
        records = [(prefix + name.encode(), sequence_id) for name, sequence_id in replayed.items()]

        def write(txn: Any) -> None:
            for key, sequence_id in records:
                old = txn.get(key, db=db)
                if old is None or _SEQ.unpack(old)[0] < sequence_id:
                    txn.put(key, _SEQ.pack(sequence_id), db=db)
            txn.delete(prefix + _REPLAY_START, db=db)
        self.ledger.env.submit(write, key=("dedup-replayed", prefix), lazy=True).add_done_callback(mark_retrieved)

    def _stored_names(self) -> dict[str, int]:
        prefix = self.ledger._prefix
        stored: dict[str, int] = {}
        with self.ledger.env.read() as txn:
            cursor = txn.cursor(db=self._db)
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    name = key[len(prefix):]
                    if name != _REPLAY_START:
                        stored[name.decode()] = _SEQ.unpack(value)[0]
        return stored

    def _forget(self) -> None:
        """Drop every producer's sequence id, in memory and stored (the deletion is written
        after any record still queued, which it thus overrides)."""
        self._persisted.clear()
        self._pushed.clear()
        self._in_flight.clear()
        self._numbering += 1
        self._inactive.clear()
        self._unsealed.clear()      # a record queued before is replaced, not merged, by a later one
        self._late.clear()
        self._replay_start = None   # (deleted with the records)
        prefix, db = self.ledger._prefix, self._db

        def delete(txn: Any) -> None:
            cursor = txn.cursor(db=db)
            if cursor.set_range(prefix):
                while cursor.key().startswith(prefix):
                    if not cursor.delete():
                        break
        self.ledger.env.submit(delete, key=("dedup-forget", prefix), lazy=True).add_done_callback(mark_retrieved)

    def purge_inactive(self, now_ms: int, timeout_ms: int, attached: Any) -> list[str]:
        """Forget, in memory and stored, the producers not attached (`attached`: the names
        attached now) for `timeout_ms` (Pulsar's purgeInactiveProducers, after
        brokerDeduplicationProducerInactivityTimeoutMinutes): without it every producer name
        ever seen, generated ones included, stays for the topic's life. Inactivity counts from
        the first round that saw the producer gone. Returns the names forgotten."""
        if not self._enabled:
            return []
        writing = {name for name, _ in self._in_flight}
        purged = []
        for name in self._pushed:
            if name in attached or name in writing:
                self._inactive.pop(name, None)
            elif name not in self._inactive:
                self._inactive[name] = now_ms
            elif now_ms - self._inactive[name] >= timeout_ms:
                purged.append(name)
        for name in [n for n in self._inactive if n not in self._pushed]:
            del self._inactive[name]
        if not purged:
            return []
        prefix, db = self.ledger._prefix, self._db
        keys = [prefix + name.encode() for name in purged]
        for name in purged:
            del self._inactive[name]
            self._pushed.pop(name, None)
            self._persisted.pop(name, None)

        def delete(txn: Any) -> None:
            for key in keys:
                txn.delete(key, db=db)
        self.ledger.env.submit(delete, lazy=True).add_done_callback(mark_retrieved)
        return purged

    def last_sequence_id(self, producer_name: str) -> int:
        """What a re-attaching producer continues after (-1 when unknown or disabled): the
        highest sequence id accepted, also while it is being written, as Pulsar's
        getLastPublishedSequenceId (highestSequencedPushed). The stored one could be lower: a
        client continuing after it gives its next message a sequence id still being written,
        and that message is dropped as a duplicate."""
        if not self.enabled:
            return -1
        return self._pushed.get(producer_name, -1)

    def duplicate_of(self, producer_name: str, sequence_id: int,
                     highest_sequence_id: int) -> asyncio.Future[Position | None] | None:
        """None if the send (a batch: `sequence_id` to `highest_sequence_id`) is new; else a
        future with the original's position (None when the original's position is no longer
        known: it was stored before, answer it as stored), or failed with
        MessageDupUnknownError when that cannot be told yet. As Apache's isDuplicateNormal, a
        send is new only when its first sequence id is above every one pushed: a batch that
        starts at or below them is not stored again, whatever its highest id."""
        if not self.enabled or sequence_id > self._pushed.get(producer_name, -1):
            return None
        original = self._in_flight.get((producer_name, highest_sequence_id))
        if original is not None:
            return original       # type: ignore[return-value]
        done: asyncio.Future[Position | None] = asyncio.get_running_loop().create_future()
        if sequence_id <= self._persisted.get(producer_name, -1):
            done.set_result(None)
        else:
            # Above what is stored, not above what is being written (Apache: MessageDupStatus
            # Unknown): stored or not depends on writes still in flight.
            done.set_exception(MessageDupUnknownError(
                f"[{self.ledger.name}][{producer_name}] Cannot determine whether the message is a duplicate "
                f"at this time"))
        return done

    def record(self, producer_name: str, highest_sequence_id: int, stored: asyncio.Future[Position]) -> None:
        """A send was accepted (its entry append just submitted)."""
        if not self.enabled:
            return
        if stored.done() and (stored.cancelled() or stored.exception() is not None):
            return                  # refused at once: nothing was pushed
        self._pushed[producer_name] = max(self._pushed.get(producer_name, -1), highest_sequence_id)
        queued = self.ledger.queued_write_of(stored)
        late: int | None = None
        if queued is not None:
            # Durable with the entry or not at all.
            self._persist(producer_name, highest_sequence_id, queued)
        else:
            late = self._late_accepted()
        flight_key = (producer_name, highest_sequence_id)
        self._in_flight[flight_key] = stored
        numbering = self._numbering

        def settled(future: asyncio.Future[Position]) -> None:
            if self._in_flight.get(flight_key) is stored:
                del self._in_flight[flight_key]
            if late is not None:
                self._late.pop(late, None)
            if not self._enabled or numbering != self._numbering:
                return              # switched off meanwhile: it forgot everything, this send too
            if not future.cancelled() and future.exception() is None:
                self._persisted[producer_name] = max(self._persisted.get(producer_name, -1), highest_sequence_id)
                if queued is None and not self.ledger.env.closed:
                    self._persist(producer_name, highest_sequence_id, None)     # appended later: now durable
            else:
                # Not stored: a retry of this sequence id must be accepted again, but not one of
                # a later send still being written (it would be stored twice).
                writing = [seq for name, seq in self._in_flight if name == producer_name]
                self._pushed[producer_name] = max([self._persisted.get(producer_name, -1), *writing])
            if late is not None and not self.ledger.env.closed:
                self._move_replay_start()   # submitted after the record: never durable before it

        stored.add_done_callback(settled)

    def _late_accepted(self) -> int:
        """A send whose entry is not appended yet: its entry will follow the LAC, so a replay
        start there (written now, before the entry can be) covers it until its record is
        written."""
        late = next(self._late_ids)
        self._late[late] = self.ledger.lac
        if self._replay_start is None:
            self._move_replay_start()
        return late

    def _move_replay_start(self) -> None:
        """Store the replay start the late sends not settled yet need (none: delete it). Late
        sends are accepted in order and the LAC only grows: the first one's is the lowest."""
        start = next(iter(self._late.values()), None)
        if start == self._replay_start:
            return
        self._replay_start = start
        key, db = self.ledger._prefix + _REPLAY_START, self._db
        if start is None:
            def write(txn: Any) -> None:
                txn.delete(key, db=db)
        else:
            packed = _POSITION.pack(start.ledger_id, start.entry_id)

            def write(txn: Any) -> None:
                txn.put(key, packed, db=db)
        done = self.ledger.env.submit(write, key=("dedup-replay", self.ledger._prefix), lazy=True)
        done.add_done_callback(self._replay_start_written)

    def _replay_start_written(self, done: asyncio.Future[Any]) -> None:
        if done.cancelled() or done.exception() is not None:
            # Not stored (a failed commit): write it again while late sends still need it.
            self._replay_start = None
            if self._late and not self.ledger.env.closed:
                self._move_replay_start()

    def _persist(self, producer_name: str, highest_sequence_id: int,
                 entry_write: tuple[object, asyncio.Future[Any]] | None) -> None:
        """Write the producer's highest sequence id (never lowering the stored one), with the
        entry's queued write (`ManagedLedger.queued_write_of`: conditional on it) or, when
        None, on its own."""
        key = self.ledger._prefix + producer_name.encode()
        db = self._db
        # One write per producer and entry batch: a failed batch takes only its own records.
        batch_key, written = entry_write if entry_write is not None else (None, None)
        write_key = ("dedup", key, batch_key)
        value = max(highest_sequence_id, self._unsealed.get(write_key, -1))
        self._unsealed[write_key] = value
        packed = _SEQ.pack(value)

        def write(txn: Any) -> None:
            old = txn.get(key, db=db)
            if old is None or _SEQ.unpack(old)[0] < value:
                txn.put(key, packed, db=db)

        def sealed() -> None:
            self._unsealed.pop(write_key, None)

        done = self.ledger.env.submit(write, key=write_key, on_seal=sealed, after=written)
        done.add_done_callback(mark_retrieved)    # its outcome is its entry's (refused: not written)

