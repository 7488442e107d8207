"""The compacted view's generations: staged rows are unseen until used, a view written before
generations (legacy keys) is still read and goes at the first switch, and removing the other
generations keeps the current one whole."""

from __future__ import annotations

from core_ext.poskeys import pack_i64, pack_position
from pyengine.storage.compacted import LEGACY, CompactedView
from pyengine.storage.entry import Entry
from pyengine.storage.environment import StorageEnvironment
from pyengine_kernels import Position

TOPIC_ID = 7


def entries(*entry_ids: int) -> list[Entry]:
    return [Entry(Position(3, i), f"e{i}".encode(), -1, -1, 0, 1, 0) for i in entry_ids]


def ids(view: CompactedView) -> list[int]:
    return [e.position.entry_id for e in view.iter_entries()]


async def test_a_staged_generation_is_unseen_until_used_and_the_others_are_removed(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    try:
        view = CompactedView(env, TOPIC_ID)
        neighbour = CompactedView(env, TOPIC_ID + 1)      # another topic's view is left alone
        await env.submit(neighbour.stage_write(1, entries(9)))
        neighbour.use(1)
        await env.submit(view.stage_write(1, entries(0, 1, 2)))
        assert ids(view) == [] and view.last_entry() is None
        view.use(1)
        assert ids(view) == [0, 1, 2] and view.last_entry().position == Position(3, 2)
        await env.submit(view.stage_write(2, entries(1, 4)))
        assert ids(view) == [0, 1, 2]
        view.use(2)
        removed = [await env.submit(view.delete_others_write(2, limit=2)) for _ in range(2)]
        assert removed == [2, 1]
        assert ids(view) == [1, 4] and view.read_entry(Position(3, 4)).data == b"e4"
        view.take_up(2)
        assert view.generation == 2 and ids(view) == [1, 4]
        assert ids(neighbour) == [9]
        await env.submit(view.delete_write())
        assert ids(view) == [] and ids(neighbour) == [9]
    finally:
        env.close()


async def test_a_legacy_view_is_read_until_the_first_switch_removes_it(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    try:
        view = CompactedView(env, TOPIC_ID)

        def legacy(txn) -> None:
            for entry in entries(5, 6):
                key = pack_i64(TOPIC_ID) + pack_position(entry.position.ledger_id, entry.position.entry_id)
                txn.put(key, entry.encode(), db=env.db("compacted"))
        await env.submit(legacy)
        view.take_up(3)                     # the generation the old compactor recorded
        assert view.generation == LEGACY and ids(view) == [5, 6]
        await env.submit(view.stage_write(4, entries(6)))
        await env.submit(view.switch_write())
        view.use(4)
        assert ids(view) == [6]
        view.take_up(4)
        assert view.generation == 4 and ids(view) == [6]
        gone = CompactedView(env, TOPIC_ID)
        gone.take_up(3)                     # the legacy rows went with the switch
        assert gone.generation == 3 and ids(gone) == []
    finally:
        env.close()
