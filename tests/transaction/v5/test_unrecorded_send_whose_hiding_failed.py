"""A v5 send whose op record failed, and whose hiding then failed to save too, is not exposed
by a restart.

The entry landed without the record that ties it to its txn (the sender was told the send
failed), so the buffer hides its position; when saving that fails, the position was hidden in
memory only, saved again by the next materialisation of a decision on the segment. A restart
before that lost it: on LMDB the entry of a txn still OPEN was delivered at once; on a
separate store its txn's commit delivered it."""

from __future__ import annotations

import pytest

from pyengine.errors import PersistenceError
from pyengine.metadata import MetadataStoreError
from pyengine.storage import StorageError
from pyengine.storage.records_pb2 import TopicRecord
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer.metadata_buffer import HIDDEN_PROPERTY
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID

from .conftest import eventually
from .test_failed_writes import fail_once, op_record_of, visible


async def test_an_unrecorded_send_whose_hiding_failed_stays_hidden_after_a_restart(v5):
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"sent")
    fail_once(v5.store, "put", MetadataStoreError("the store is unreachable for a moment"), op_record_of(txn))
    failed = fail_once(ledger, "_put_topic_record", StorageError("the group commit failed"))
    with pytest.raises(PersistenceError, match="op record"):
        await buffer.append(txn, b"failed")
    assert failed
    await ledger.append(b"plain")
    await v5.restart()                                  # no decision materialised meanwhile
    ledger, buffer = await v5.buffer()
    assert b"failed" not in [bytes(e.data) for e in ledger.read_entries(ledger.first_position(), 10)
                             if e.position <= buffer.max_read_position() and not buffer.hides(e)]
    await v5.coordinator.end_transaction(txn, TxnAction.COMMIT)
    await eventually(lambda: buffer.max_read_position() == ledger.lac)
    await buffer.wait_materialised()
    assert visible(ledger, buffer) == [b"sent", b"plain"]


async def test_an_unrecorded_sends_hiding_that_failed_is_saved_again_without_waiting_for_a_decision(v5):
    """A crash is no graceful close: the save is redone in the background at once."""
    ledger, buffer = await v5.buffer()
    txn = await v5.coordinator.new_transaction(V5_COORDINATOR_ID, 60_000)
    await buffer.append(txn, b"sent")
    fail_once(v5.store, "put", MetadataStoreError("the store is unreachable for a moment"), op_record_of(txn))
    fail_once(ledger, "_put_topic_record", StorageError("the group commit failed"))
    with pytest.raises(PersistenceError, match="op record"):
        await buffer.append(txn, b"failed")
    failed_at = ledger.lac
    await eventually(lambda: stored_property(ledger) == f"{failed_at.ledger_id}:{failed_at.entry_id}", timeout=2)


def stored_property(ledger) -> str | None:
    """The hidden positions as the data dir holds them (what a crash leaves)."""
    with ledger.env.read() as txn:
        raw = txn.get(ledger.name.encode(), db=ledger.env.db("topics"))
    return TopicRecord.FromString(raw).properties.get(HIDDEN_PROPERTY)
