"""Trimming a terminated managed ledger: like Pulsar, which never trims its current ledger,
the ledger that holds the terminated position stays, so the LAC is still the terminated
position after a restart and cursors stay consistent with it."""

import pytest

from pyengine.storage import ManagedLedger, ManagedLedgerConfig
from pyengine_kernels import Position

TOPIC = "persistent://public/default/t"
TRIM_EVERYTHING = ManagedLedgerConfig(max_entries_per_ledger=2, retention_ms=0, retention_bytes=0)


@pytest.mark.parametrize("entries", [0, 1, 5])
async def test_a_consumed_terminated_ledger_keeps_its_last_position_across_a_restart(env, reopen, entries):
    ml = await ManagedLedger.open(env, TOPIC, TRIM_EVERYTHING)
    cursor = await ml.open_cursor("sub", "earliest")
    positions = [await ml.append(b"m%d" % i) for i in range(entries)]
    if positions:
        await cursor.ack_cumulative(positions[-1])
    last = await ml.terminate()
    await ml.trim()
    if positions:
        assert ml.first_position() <= positions[-1]
    await ml.close()

    env = reopen(env)
    ml = await ManagedLedger.open(env, TOPIC, TRIM_EVERYTHING)
    assert ml.terminated_at == last
    assert ml.lac == last
    cursor = await ml.open_cursor("sub", "earliest")
    assert cursor.read_position > cursor.mark_delete
    assert cursor.backlog() == 0
    assert ml.read_entries(cursor.read_position, 10) == []
    await ml.trim()
    await ml.close()
    ml = await ManagedLedger.open(reopen(env), TOPIC, TRIM_EVERYTHING)
    assert ml.lac == last
    if entries == 5:
        # Only what lies before the last ledger went: ledgers of 2 entries, the last one kept.
        assert list(ml.ledgers)[0] == last.ledger_id
        assert ml.first_position() == Position(last.ledger_id, 0)
