"""A ledger closed at a roll-over is recorded with its last entry only once that entry is
durable. Found by an audit: the record was written whatever became of the entries still in
flight; when their commit failed, the store held a closed ledger claiming entries it did not
have until the correcting record landed, and a crash in between left a topic whose last entry
could not be read."""

import asyncio

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageError
from pyengine.storage.records_pb2 import LedgerRecord
from pyengine_kernels import Position
from tests.broker.helpers import GatedWriter

TOPIC = "persistent://public/default/roll"


def stored_ledgers(ml: ManagedLedger) -> dict[int, LedgerRecord]:
    records = {}
    with ml.env.read() as txn:
        cursor = txn.cursor(db=ml.env.db("ledgers"))
        if cursor.set_range(ml._prefix):
            for key, value in cursor:
                if not key.startswith(ml._prefix):
                    break
                record = LedgerRecord.FromString(value)
                records[record.ledger_id] = record
    return records


def stored_entries(ml: ManagedLedger, ledger_id: int) -> list[int]:
    return [e.position.entry_id for e in ml.read_entries(Position(ledger_id, 0), 100)
            if e.position.ledger_id == ledger_id]


async def test_a_failed_commit_never_leaves_a_closed_record_ahead_of_the_entries(env):
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=2))
    first = await ml.append(b"e0")
    gate = GatedWriter(env)
    try:
        doomed = ml.append(b"e1")                       # its commit is held, then fails
        await gate.next_commit()
        later = ml.append(b"e2")                        # a roll-over: the first ledger is closed
        gate.let_through(OSError(5, "injected I/O error"))
        for failed in (doomed, later):
            try:
                await failed
            except StorageError:
                pass
        # every later commit (the correcting record among them) is looked at before it goes
        loop = asyncio.get_running_loop()
        quiet_until = loop.time() + 0.5
        while loop.time() < quiet_until:
            for record in stored_ledgers(ml).values():
                entries = stored_entries(ml, record.ledger_id)
                assert not record.closed or record.last_entry_id <= max(entries, default=-1), (record, entries)
            if gate.arrived.acquire(blocking=False):     # a commit is held: let it go, then look again
                gate.let_through()
                quiet_until = loop.time() + 0.5
            await asyncio.sleep(0.005)
    finally:
        gate.open()
    assert stored_entries(ml, first.ledger_id) == [0]
    await ml.close()
    again = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=2))
    assert again.lac == first                           # its last entry is one it has
    assert [e.data for e in again.read_entries(first, 10)] == [b"e0"]
    await again.append(b"e3")
    await again.close()
