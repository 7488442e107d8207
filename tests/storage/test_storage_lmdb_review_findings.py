"""Storage on LMDB, findings of a review: each test failed before its fix."""

import pytest

from pyengine.storage import ManagedLedger, ManagedLedgerConfig
from pyengine_kernels import Position

TOPIC = "persistent://public/default/t"


async def test_an_ack_after_the_last_entry_is_refused_and_later_entries_stay_unacknowledged(env):
    """The cursor took an acknowledgement of a position after the LAC (cumulative, individual,
    or of batch indexes): it then counted the entry later written there as acknowledged, and a
    cumulative one every entry up to it, so they were never delivered (and trims could delete
    them). Pulsar's ManagedCursor refuses it ("Invalid mark deleted position")."""
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=2))
    first = await ml.append(b"m")
    cursor = await ml.open_cursor("s", "earliest")
    ahead = Position(first.ledger_id, first.entry_id + 1)       # where the next entry goes
    with pytest.raises(ValueError, match="after the last entry"):
        cursor.ack_cumulative(ahead)
    with pytest.raises(ValueError, match="after the last entry"):
        cursor.ack([first, ahead])
    with pytest.raises(ValueError, match="after the last entry"):
        cursor.ack_batch_indexes(ahead, [0b10], 2)
    with pytest.raises(ValueError, match="after the last entry"):
        cursor.ack_cumulative(Position(1 << 40, 0))
    assert cursor.mark_delete == first.prev() and not cursor.is_acked(first)
    assert cursor.batch_ack_set(ahead) is None
    later = [await ml.append(b"m") for _ in range(3)]
    assert later[0] == ahead
    assert cursor.backlog() == 4 and not any(cursor.is_acked(p) for p in later)
    await cursor.ack_cumulative(later[-1])           # up to the LAC: taken
    assert cursor.backlog() == 0
