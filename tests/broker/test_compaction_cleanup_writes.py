"""A compaction's removal of the view's other generations (before staging, and after the
switch) is a write, a group commit of its own: it is skipped when there is nothing to remove."""

from __future__ import annotations

from pyengine.broker import Broker
from pyengine.storage.compacted import CompactedView
from tests.broker.test_compaction import TOPIC, compact


def count_cleanup_writes(monkeypatch, env) -> list[int]:
    """A counter of the submitted writes that remove other generations of a view."""
    cleanup_writes: list = []                 # kept alive: their ids are not reused
    counted = [0]
    original_write, original_submit = CompactedView.delete_others_write, env.submit

    def delete_others_write(self, keep, limit=1000):
        write = original_write(self, keep, limit)
        cleanup_writes.append(write)
        return write

    def submit(write, **kwargs):
        if any(write is cleanup for cleanup in cleanup_writes):
            counted[0] += 1
        return original_submit(write, **kwargs)

    monkeypatch.setattr(CompactedView, "delete_others_write", delete_others_write)
    monkeypatch.setattr(env, "submit", submit)
    return counted


async def test_cleanup_is_written_only_when_another_generation_has_rows(tmp_path, monkeypatch):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"a1", key="a")
        topic = await broker.service.get_topic(TOPIC)
        view = topic.compaction.view
        counted = count_cleanup_writes(monkeypatch, topic.ledger.env)
        await compact(broker)                       # the first view: nothing to remove
        assert counted[0] == 0
        await producer.send(b"a2", key="a")
        await compact(broker)                       # the previous view goes, after the switch
        assert counted[0] == 1
        assert not view.has_other_generations(view.generation)
        # What a failed compaction left staged is removed before the next one stages.
        await topic.ledger.env.submit(view.stage_write(view.generation + 5, list(view.iter_entries())))
        await producer.send(b"a3", key="a")
        await compact(broker)
        assert counted[0] == 3
        assert not view.has_other_generations(view.generation)
        assert [e.position for e in view.iter_entries()] == [topic.ledger.lac]
