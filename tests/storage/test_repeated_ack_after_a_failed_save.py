"""An acknowledgement is applied to the cursor in memory at once and saved with the next group
commit. When that save fails (a full map, a failing disk), the ack is answered with the error
and the client repeats it; the repeat changes nothing in memory, yet must still be written:
answered "done" without a write, a restart (or a crash) would deliver the message again."""

import pytest

from pyengine.storage import ManagedLedger, StorageEnvironment, StorageError
from pyengine_kernels import Position, ackset_new
from tests.storage.helpers import fail_next_save

TOPIC = "persistent://public/default/acks"


def fail_next_cursor_save(env) -> list:
    """The next group commit that writes a cursor record fails as a whole."""
    return fail_next_save(env, "cursor")


async def crash_and_reopen(tmp_path, env):
    """What a kill -9 leaves: nothing is flushed on the way out."""
    env.close()
    env = StorageEnvironment(tmp_path / "data")
    ml = await ManagedLedger.open(env, TOPIC)
    return env, await ml.open_cursor("s", "earliest")


@pytest.mark.parametrize("how", ["individual", "cumulative", "batch_indexes"])
async def test_an_ack_repeated_after_its_save_failed_is_durable(tmp_path, how):
    env = StorageEnvironment(tmp_path / "data")
    try:
        ml = await ManagedLedger.open(env, TOPIC)
        first = await ml.append(b"m0")
        await ml.append(b"m1")
        cursor = await ml.open_cursor("s", "earliest")
        some_indexes = [ackset_new(4)[0] & ~0b11]          # indexes 0 and 1 acknowledged

        def ack():
            if how == "individual":
                return cursor.ack([first])
            if how == "cumulative":
                return cursor.ack_cumulative(first)
            return cursor.ack_batch_indexes(first, some_indexes, 4)

        assert fail_next_cursor_save(env) == []
        with pytest.raises(StorageError, match="injected"):
            await ack()
        await ack()                     # the client's retry: answered once it is durable
        env, cursor = await crash_and_reopen(tmp_path, env)
        if how == "batch_indexes":
            assert cursor.batch_ack_set(first) == some_indexes
        else:
            assert cursor.is_acked(first)
            assert cursor.mark_delete == first
    finally:
        env.close()


async def test_a_repeated_ack_writes_nothing_once_the_state_is_durable(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    try:
        ml = await ManagedLedger.open(env, TOPIC)
        first = await ml.append(b"m0")
        cursor = await ml.open_cursor("s", "earliest")
        fail_next_cursor_save(env)
        with pytest.raises(StorageError, match="injected"):
            await cursor.ack([first])
        await cursor.ack([first])
        writes = []
        original = env._write_batch
        env._write_batch = lambda batch: writes.append(batch) or original(batch)
        await cursor.ack([first])
        await cursor.ack_cumulative(Position(first.ledger_id, first.entry_id))
        assert writes == []
    finally:
        env.close()
