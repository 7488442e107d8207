"""Known risks of Pulsar's v5 (PIP-471 / PIP-473) transaction design this implementation avoids,
one test each (reference/anchors-and-failure-modes.md, section B1).

Also covering the vote thread's lost notification, elsewhere: a notification dropped without
the watch failing is made up for by the deadline re-read
(test_buffer.py::test_dropped_notifications_are_recovered_by_the_deadline_reread), and one
missed while the participant was down by its recovery
(test_buffer.py::test_restart_mid_materialisation_finishes_it)."""

from __future__ import annotations

import asyncio

from pyengine.metadata import MetadataStoreError
from pyengine.protocol.pulsar_api_pb2 import CommandSubscribe
from pyengine.storage import ManagedLedger
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID
from pyengine.transaction.pendingack import IndividualAck
from pyengine.transaction.pendingack.metadata_store import MetadataPendingAckHandle, MetadataPendingAckStore
from pyengine_kernels import Position

from .conftest import eventually

OUT = "segment://public/default/v5-out/0000-ffff-0"
IN = "segment://public/default/v5-in/0000-ffff-0"


async def test_pip_473_vote_a_decision_missed_while_the_header_watch_was_down_is_materialised(v5, monkeypatch):
    """dev@pulsar, PIP-471/473 vote thread (msg20559): a participant that misses the metadata
    store's notification of a decision "may" leave MAX-POSITION stuck. Here the header watch
    breaks, the txn commits before the watch is back, and the participants (a transaction
    buffer holding its write, a subscription holding its ack) still apply the commit as soon as
    the watch is reopened: they re-read the headers they wait on, long before the txn's
    deadline (60 s) could make the deadline re-read find it."""
    ledger, buffer = await v5.buffer(OUT)
    source = await ManagedLedger.open(v5.env, IN)
    v5.ledgers.append(source)
    consumed = await source.append(b"input")
    cursor = await source.open_cursor("sub", "earliest")
    store = MetadataPendingAckStore(v5.store, IN, "sub", metrics=v5.metrics)
    acks = MetadataPendingAckHandle(cursor, store, v5.headers, subscription_type=CommandSubscribe.Shared)
    await acks.replay()

    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    written = await buffer.append(txn, b"output")
    await acks.individual_ack(txn, [IndividualAck(consumed)])
    assert buffer.max_read_position() < written and not cursor.is_acked(consumed)

    decided = asyncio.Event()
    reopen = v5.store.range_watch

    async def reopen_after_the_decision(*args, **kwargs):
        await decided.wait()
        return await reopen(*args, **kwargs)

    monkeypatch.setattr(v5.store, "range_watch", reopen_after_the_decision)
    v5.headers._watch._fail(MetadataStoreError("connection to the metadata store lost"))
    await v5.coordinator.end_transaction(txn, TxnAction.COMMIT)       # its notification is lost
    await asyncio.sleep(0.05)
    assert buffer.max_read_position() < written                       # nothing can tell them yet
    decided.set()
    await eventually(lambda: buffer.max_read_position() == ledger.lac and cursor.is_acked(consumed), timeout=2)
    assert [bytes(e.data) for e in ledger.read_entries(Position.EARLIEST, 10, buffer.max_read_position())
            if not buffer.hides(e)] == [b"output"]
    assert v5.headers.rechecks_resolved == 0                          # not the deadline re-read
    await acks.close()
