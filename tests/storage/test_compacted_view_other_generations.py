"""`CompactedView.has_other_generations`: the read that lets compaction skip its cleanup write
(a group commit) when no generation but the current one has rows; `read_entries_backward`, the
view read from its end (a read-compacted reader's last message id)."""

from __future__ import annotations

from pyengine.storage.compacted import LEGACY, CompactedView
from pyengine.storage.entry import Entry
from pyengine.storage.environment import StorageEnvironment
from pyengine_kernels import Position

TOPIC_ID = 7


def entries(*entry_ids: int) -> list[Entry]:
    return [Entry(Position(3, i), f"e{i}".encode(), -1, -1, 0, 1, 0) for i in entry_ids]


async def staged(env: StorageEnvironment, view: CompactedView, generation: int, *entry_ids: int) -> None:
    await env.submit(view.stage_write(generation, entries(*entry_ids)))


async def test_other_generations_are_found_before_and_after_the_kept_one(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    try:
        view = CompactedView(env, TOPIC_ID)
        assert not view.has_other_generations(0)
        # The neighbours' views, on either side of this topic's keys, are not this view's.
        for neighbour_id in (TOPIC_ID - 1, TOPIC_ID + 1):
            await staged(env, CompactedView(env, neighbour_id), 1, 9)
        assert not view.has_other_generations(0)
        await staged(env, view, 2, 0, 1)
        view.use(2)
        assert not view.has_other_generations(2)
        assert view.has_other_generations(LEGACY) and view.has_other_generations(1)
        await staged(env, view, 3, 5)                   # staged after the kept one
        assert view.has_other_generations(2)
        await env.submit(view.delete_others_write(2))
        assert not view.has_other_generations(2)
        await staged(env, view, 1, 4)                   # before the kept one
        assert view.has_other_generations(2)
        assert await env.submit(view.delete_others_write(2)) == 1
        assert not view.has_other_generations(2)
        assert [e.position.entry_id for e in view.iter_entries()] == [0, 1]
    finally:
        env.close()


async def test_entries_are_read_backward_within_the_current_generation(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    try:
        view = CompactedView(env, TOPIC_ID)
        assert view.read_entries_backward(None, 5) == []
        await staged(env, CompactedView(env, TOPIC_ID + 1), 1, 9)       # a neighbour after
        await staged(env, view, 1, 8)                                    # a generation before
        await staged(env, view, 2, 0, 1, 2, 3)
        await staged(env, view, 3, 7)                                    # and one after
        view.use(2)

        def backward(before, count):
            return [e.position.entry_id for e in view.read_entries_backward(before, count)]
        assert backward(None, 3) == [3, 2, 1]
        assert backward(Position(3, 1), 5) == [0]
        assert backward(Position(3, 0), 5) == []
        assert backward(Position(3, 10), 2) == [3, 2]
        assert backward(Position(2, 10), 2) == []
        assert backward(None, 0) == []
        assert view.read_entries_backward(Position(3, 3), 1)[0].data == b"e2"
    finally:
        env.close()
