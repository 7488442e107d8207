"""Terminating while a trim is under way. Found by an audit: the trim chose its ledgers before
the topic was terminated and deleted the ledger of the LAC; terminate, waiting behind that
deletion, then sealed at the LAC, a position in a ledger that was gone, and after a restart
the LAC (found in the ledgers left) was another position than the terminated one. As in
test_terminated_ledger_retention, the ledger of the terminated position is kept, so the LAC
after a restart is the terminated position."""

import asyncio

import pytest

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, TopicTerminatedError
from tests.storage.helpers import settled

TOPIC = "persistent://public/default/terminated"
CONFIG = ManagedLedgerConfig(max_entries_per_ledger=100, retention_ms=0)


async def consumed_then_restarted(env, reopen):
    """Three entries consumed in a ledger closed by a restart, a new empty current ledger after it."""
    ml = await ManagedLedger.open(env, TOPIC, CONFIG)
    cursor = await ml.open_cursor("sub", "earliest")
    positions = [await ml.append(b"m%d" % i) for i in range(3)]
    await cursor.ack_cumulative(positions[-1])
    await settled(ml)
    await ml.close()
    ml = await ManagedLedger.open(reopen(env), TOPIC, CONFIG)
    await ml.open_cursor("sub", "earliest")
    await asyncio.sleep(0.005)              # retention 0: closed more than 0 ms ago
    assert ml.lac == positions[-1] and len(ml.ledgers) == 2
    return ml, positions


async def check_after_a_restart(ml, reopen, last):
    await settled(ml)
    await ml.close()
    again = await ManagedLedger.open(reopen(ml.env), TOPIC, CONFIG)
    assert again.terminated_at == last
    assert again.lac == last
    cursor = await again.open_cursor("sub", "earliest")
    assert cursor.backlog() == 0 and cursor.read_position > cursor.mark_delete
    assert again.read_entries(cursor.read_position, 10) == []
    with pytest.raises(TopicTerminatedError):
        await again.append(b"late")
    await again.trim()
    await again.close()
    assert (await ManagedLedger.open(reopen(again.env), TOPIC, CONFIG)).lac == last


async def test_terminate_while_a_trim_deletes_the_ledger_of_the_lac(env, reopen):
    ml, positions = await consumed_then_restarted(env, reopen)
    trimming = asyncio.ensure_future(ml.trim())
    await asyncio.sleep(0)                  # the trim's deletion is queued
    last = await ml.terminate()
    assert await trimming == [positions[0].ledger_id]
    assert ml.terminated_at == last == ml.lac
    await check_after_a_restart(ml, reopen, last)


async def test_terminate_after_a_trim_deleted_the_ledger_of_the_lac(env, reopen):
    ml, positions = await consumed_then_restarted(env, reopen)
    assert await ml.trim() == [positions[0].ledger_id]
    last = await ml.terminate()
    assert ml.terminated_at == last == ml.lac
    await check_after_a_restart(ml, reopen, last)


async def test_terminate_before_a_trim_keeps_the_ledger_of_the_lac(env, reopen):
    ml, positions = await consumed_then_restarted(env, reopen)
    last = await ml.terminate()
    assert last == positions[-1]
    assert await ml.trim() == []
    await check_after_a_restart(ml, reopen, last)
