"""Message de-duplication (Pulsar's MessageDeduplication): a retried send is stored once.

Per producer name the topic remembers the highest sequence id stored ("persisted") and the
highest one accepted and still being written ("pushed"). A send whose sequence id is not above
what was pushed is a duplicate: if the original is durable it is answered without storing
anything, if it is still being written the duplicate waits for it and gets its answer.

The highest persisted sequence id is written in the same LMDB transaction as the entry (the
write is submitted right after the append, in the same event-loop turn, so group commit puts
both in one batch), and only with it: the record is conditional on the entry's write, so a send
whose entry is not written (its commit failed, it queued behind one that failed, its txn's
registration failed) is never recorded as published - after a restart its retry is stored, not
dropped. An entry appended later than the send (a transaction buffer still recovering, a v5
buffer) is recorded once it is durable. After a crash the stored entries and the
de-duplication state agree (but for that last case, where a retry may then be stored twice).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from pyengine.storage import ManagedLedger
from pyengine.transaction.outcome import mark_retrieved
from pyengine_kernels import Position

_SEQ = struct.Struct(">q")


class MessageDeduplication:
    def __init__(self, ledger: ManagedLedger, enabled: bool) -> None:
        self.ledger = ledger
        self._enabled = enabled
        self._db = ledger.env.db("dedup")
        self._persisted: dict[str, int] = {}
        self._pushed: dict[str, int] = {}
        self._in_flight: dict[tuple[str, int], asyncio.Future[Position]] = {}
        self._unsealed: dict[tuple[Any, ...], int] = {}     # queued record writes: their value
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
        if not self._enabled:
            # Disabled since those were written (the policy changed while the topic was
            # unloaded): stale, as when it is switched off at run time.
            if stored:
                self._forget()
            return
        self._persisted = stored
        self._pushed = dict(self._persisted)

    def _stored_names(self) -> dict[str, int]:
        prefix = self.ledger._prefix
        stored: dict[str, int] = {}
        with self.ledger.env.read() as txn:
            cursor = txn.cursor(db=self._db)
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    stored[key[len(prefix):].decode()] = _SEQ.unpack(value)[0]
        return stored

    def _forget(self) -> None:
        """Drop every producer's sequence id, in memory and stored (the deletion is written
        after any record still queued, which it thus overrides)."""
        self._persisted.clear()
        self._pushed.clear()
        self._unsealed.clear()      # a record queued before is replaced, not merged, by a later one
        prefix, db = self.ledger._prefix, self._db

        def delete(txn: Any) -> None:
            cursor = txn.cursor(db=db)
            if cursor.set_range(prefix):
                while cursor.key().startswith(prefix):
                    if not cursor.delete():
                        break
        self.ledger.env.submit(delete, key=("dedup-forget", prefix), lazy=True).add_done_callback(mark_retrieved)

    def last_sequence_id(self, producer_name: str) -> int:
        """What a re-attaching producer continues after (-1 when unknown or disabled)."""
        if not self.enabled:
            return -1
        return self._persisted.get(producer_name, -1)

    def duplicate_of(self, producer_name: str, sequence_id: int) -> asyncio.Future[Position | None] | None:
        """None if the send is new; else a future with the original's position (None when the
        original's position is no longer known: it was stored before, answer it as stored)."""
        if not self.enabled or sequence_id > self._pushed.get(producer_name, -1):
            return None
        original = self._in_flight.get((producer_name, sequence_id))
        if original is not None:
            return original       # type: ignore[return-value]
        done: asyncio.Future[Position | None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def record(self, producer_name: str, highest_sequence_id: int, stored: asyncio.Future[Position]) -> None:
        """A send was accepted (its entry append just submitted)."""
        if not self.enabled:
            return
        if stored.done() and (stored.cancelled() or stored.exception() is not None):
            return                  # refused at once: nothing was pushed
        self._pushed[producer_name] = max(self._pushed.get(producer_name, -1), highest_sequence_id)
        queued = self.ledger.queued_write_of(stored)
        if queued is not None:
            # Durable with the entry or not at all.
            self._persist(producer_name, highest_sequence_id, queued)
        flight_key = (producer_name, highest_sequence_id)
        self._in_flight[flight_key] = stored

        def settled(future: asyncio.Future[Position]) -> None:
            self._in_flight.pop(flight_key, None)
            if not self._enabled:
                return              # switched off meanwhile: it forgot everything
            if not future.cancelled() and future.exception() is None:
                self._persisted[producer_name] = max(self._persisted.get(producer_name, -1), highest_sequence_id)
                if queued is None and not self.ledger.env.closed:
                    self._persist(producer_name, highest_sequence_id, None)     # appended later: now durable
            else:
                # Not stored: a retry of this sequence id must be accepted again.
                self._pushed[producer_name] = self._persisted.get(producer_name, -1)

        stored.add_done_callback(settled)

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

