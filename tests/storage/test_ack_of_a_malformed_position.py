"""An acknowledgement naming no entry (a client's malformed message id: entry id -1 sent as
2**64-1, or past what a ledger can hold) is refused as a whole with a ValueError. Found by an
audit: it failed half-way with an OverflowError from the roaring bitmap, the positions before
it taken in memory but neither saved nor moving the mark-delete position."""

import pytest

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment
from pyengine_kernels import Position

TOPIC = "persistent://public/default/t"


@pytest.mark.parametrize("entry_id", [-1, 1 << 32, 1 << 40])
async def test_a_malformed_position_refuses_the_whole_ack(tmp_path, entry_id):
    env = StorageEnvironment(tmp_path)
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=2))
    positions = [await ml.append(b"m") for _ in range(3)]
    cursor = await ml.open_cursor("s", "earliest")
    bogus = Position(positions[2].ledger_id, entry_id)     # (in the second ledger: after the mark-delete)
    with pytest.raises(ValueError, match="not the position of an entry"):
        cursor.ack([positions[1], bogus])
    with pytest.raises(ValueError, match="not the position of an entry"):
        cursor.ack_batch_indexes(bogus, [], 2)          # fully acknowledged: the whole entry
    assert not cursor.is_acked(positions[1]) and cursor.backlog() == 3
    await cursor.ack([positions[0]])                    # the cursor goes on as before
    assert cursor.mark_delete == positions[0]
    await ml.close()
    env.close()
