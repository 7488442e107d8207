"""A cursor's string properties (its subscription's, PIP-105): given when the cursor is
created, kept across a restart, replaced as a whole; a cursor record written before they
existed opens with none."""

import pytest

from pyengine.storage import ManagedLedger, StorageError
from pyengine.storage.records_pb2 import CursorRecord, PositionRecord
from tests.storage.helpers import fail_next_save

TOPIC = "persistent://public/default/cursor-properties"


async def test_properties_given_at_creation_survive_a_restart(env, reopen):
    ml = await ManagedLedger.open(env, TOPIC)
    cursor = await ml.open_cursor("s", "earliest", {"owner": "billing", "": "empty key"})
    assert cursor.cursor_properties == {"owner": "billing", "": "empty key"}
    await ml.close()
    env2 = reopen(env)
    ml2 = await ManagedLedger.open(env2, TOPIC)
    assert (await ml2.open_cursor("s")).cursor_properties == {"owner": "billing", "": "empty key"}


async def test_an_existing_cursor_keeps_its_properties_when_opened_with_others(env, reopen):
    ml = await ManagedLedger.open(env, TOPIC)
    await ml.open_cursor("s", "latest", {"a": "1"})
    assert (await ml.open_cursor("s", "latest", {"b": "2"})).cursor_properties == {"a": "1"}
    await ml.close()
    env2 = reopen(env)
    ml2 = await ManagedLedger.open(env2, TOPIC)
    assert (await ml2.open_cursor("s", "latest", {"b": "2"})).cursor_properties == {"a": "1"}


async def test_replaced_properties_are_durable_and_replace_the_old_ones_whole(env, reopen):
    ml = await ManagedLedger.open(env, TOPIC)
    position = await ml.append(b"x")
    cursor = await ml.open_cursor("s", "earliest", {"a": "1", "b": "2"})
    await cursor.set_cursor_properties({"c": "3"})
    await cursor.ack([position])            # a later save of the cursor keeps them
    await ml.close()
    env2 = reopen(env)
    ml2 = await ManagedLedger.open(env2, TOPIC)
    reopened = await ml2.open_cursor("s")
    assert reopened.cursor_properties == {"c": "3"} and reopened.mark_delete == position
    await reopened.set_cursor_properties({})
    await ml2.close()
    env3 = reopen(env2)
    assert (await (await ManagedLedger.open(env3, TOPIC)).open_cursor("s")).cursor_properties == {}


async def test_a_cursor_record_written_before_properties_existed_opens_with_none(env, reopen):
    ml = await ManagedLedger.open(env, TOPIC)
    position = await ml.append(b"x")
    cursor = await ml.open_cursor("old", "earliest")
    await cursor.ack([position])
    await ml.close()
    # The record as the code before subscription properties wrote it (fields 1 to 6 only).
    key = ml._prefix + b"old"
    old_record = CursorRecord(name="old", mark_delete=PositionRecord(ledger_id=position.ledger_id,
                                                                    entry_id=position.entry_id),
                              properties={"counter": 7})
    assert not old_record.cursor_properties
    raw = old_record.SerializeToString()
    await env.submit(lambda txn: txn.put(key, raw, db=env.db("cursors")))
    env2 = reopen(env)
    ml2 = await ManagedLedger.open(env2, TOPIC)
    reopened = await ml2.open_cursor("old")
    assert reopened.cursor_properties == {} and reopened.properties == {"counter": 7}
    assert reopened.mark_delete == position


async def test_a_failed_save_of_new_properties_is_repeated_by_the_next_save(env, reopen):
    ml = await ManagedLedger.open(env, TOPIC)
    position = await ml.append(b"x")
    cursor = await ml.open_cursor("s", "earliest", {"a": "1"})
    failed = fail_next_save(env, "cursor")
    with pytest.raises(StorageError, match="injected"):
        await cursor.set_cursor_properties({"b": "2"})
    assert failed
    await cursor.ack([position])
    await ml.close()
    env2 = reopen(env)
    assert (await (await ManagedLedger.open(env2, TOPIC)).open_cursor("s")).cursor_properties == {"b": "2"}


async def test_a_non_durable_cursor_holds_properties_in_memory_only(env):
    ml = await ManagedLedger.open(env, TOPIC)
    reader = ml.new_non_durable_cursor(ml.lac.next())
    writes = []
    original = env._write_batch
    env._write_batch = lambda batch: writes.append(batch) or original(batch)
    await reader.set_cursor_properties({"k": "v"})
    assert reader.cursor_properties == {"k": "v"} and writes == []
