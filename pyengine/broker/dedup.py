"""Message de-duplication (Pulsar's MessageDeduplication): a retried send is stored once.

Per producer name the topic remembers the highest sequence id stored ("persisted") and the
highest one accepted and still being written ("pushed"). A send whose sequence id is not above
what was pushed is a duplicate: if the original is durable it is answered without storing
anything, if it is still being written the duplicate waits for it and gets its answer.

The highest persisted sequence id is written in the same LMDB transaction as the entry (the
write is submitted right after the append, in the same event-loop turn, so group commit puts
both in one batch): after a crash the stored entries and the de-duplication state agree.
"""

from __future__ import annotations

import asyncio
import struct

from pyengine.storage import ManagedLedger
from pyengine_kernels import Position

_SEQ = struct.Struct(">q")


class MessageDeduplication:
    def __init__(self, ledger: ManagedLedger, enabled: bool) -> None:
        self.ledger = ledger
        self.enabled = enabled
        self._db = ledger.env.db("dedup")
        self._persisted: dict[str, int] = {}
        self._pushed: dict[str, int] = {}
        self._in_flight: dict[tuple[str, int], asyncio.Future[Position]] = {}
        self._load()

    def _load(self) -> None:
        prefix = self.ledger._prefix
        with self.ledger.env.read() as txn:
            cursor = txn.cursor(db=self._db)
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    self._persisted[key[len(prefix):].decode()] = _SEQ.unpack(value)[0]
        self._pushed = dict(self._persisted)

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
        self._pushed[producer_name] = max(self._pushed.get(producer_name, -1), highest_sequence_id)
        key = self.ledger._prefix + producer_name.encode()
        value = _SEQ.pack(highest_sequence_id)
        db = self._db
        self.ledger.env.submit(lambda txn: txn.put(key, value, db=db), key=("dedup", key))
        flight_key = (producer_name, highest_sequence_id)
        self._in_flight[flight_key] = stored

        def settled(future: asyncio.Future[Position]) -> None:
            self._in_flight.pop(flight_key, None)
            if future.exception() is None:
                self._persisted[producer_name] = max(self._persisted.get(producer_name, -1), highest_sequence_id)
            else:
                # Not stored: a retry of this sequence id must be accepted again.
                self._pushed[producer_name] = self._persisted.get(producer_name, -1)

        stored.add_done_callback(settled)
