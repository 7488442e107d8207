"""Review findings of the server side of scalable topics (PIP-468): layout, coordinator,
controller, DAG watch sessions."""

from __future__ import annotations

import asyncio

from pyengine.scalable.resources import ScalableTopicNotFoundError
from pyengine.scalable.service import scalable_topic_name
from pyengine.scalable.watch import DagWatchSession

T = "topic://public/default/server-review"


async def test_a_watch_whose_topic_was_deleted_and_created_again_before_its_reread_ends(services):
    """A DAG watch session re-reads the layout after a notification and pushes it only when its
    epoch (or the leader) changed. A topic deleted and created again before that re-read (of
    another shape, its epoch again 0) went unnoticed: the session lived on and its client kept
    the deleted topic's DAG. It now ends, as it does when the re-read finds no topic."""
    service = await services("a")
    await service.create_topic(T, 1)
    updates, errors = [], []
    session = DagWatchSession(service.resources, scalable_topic_name(T),
                              lambda layout, url, brokers: updates.append(layout), errors.append)
    await session.start()
    refresh, reread = session._refresh, asyncio.Event()

    async def late_refresh():
        await reread.wait()                 # a slow store: the re-read comes after the re-creation
        return await refresh()
    session._refresh = late_refresh
    await service.delete_topic(T)
    await service.create_topic(T, 4)
    reread.set()
    for _ in range(100):
        if errors:
            break
        await asyncio.sleep(0.01)
    assert len(updates) == 1 and len(errors) == 1 and isinstance(errors[0], ScalableTopicNotFoundError)
    assert session.ended
    session.close()
