"""Leader election must not act on changes older than the state it has read: a candidate opens
its watch before it campaigns, so changes made between the two (the previous leader's record
created or deleted) are still queued when it wins. Acting on them made the new leader report
NO_LEADER or FOLLOWING for a moment (a flap its listeners see) although it never lost the lead."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.metadata import LeaderState
from pyengine.metadata.election import LeaderElection

TTL = 1.0
SETTLE = 0.5        # time for the queued notifications to be processed (nothing may change)


class Intercepting:
    """The store as the election sees it, running `before_create` once before the first create."""

    def __init__(self, store, before_create):
        self._store = store
        self._before_create = before_create

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def create(self, *args, **kwargs):
        hook, self._before_create = self._before_create, None
        if hook is not None:
            await hook()
        return await self._store.create(*args, **kwargs)


async def _previous_leader_resigns(store, old):
    await old.campaign()
    assert old.is_leader
    return old.resign          # between the new candidate's watch and its create


async def _previous_leader_comes_and_goes(store, old):
    async def come_and_go():
        await old.campaign()
        assert old.is_leader
        await old.resign()
    return come_and_go


@pytest.mark.parametrize("interleaving", [_previous_leader_resigns, _previous_leader_comes_and_goes],
                         ids=["resigned", "came-and-went"])
async def test_a_new_leader_ignores_changes_older_than_its_own_record(backend, interleaving):
    store = await backend.new().start()
    old_session = await store.create_session(TTL)
    new_session = await store.create_session(TTL)
    old = LeaderElection(store, "/election", "old", session=old_session)
    hook = await interleaving(store, old)
    new = LeaderElection(Intercepting(store, hook), "/election", "new", session=new_session)
    states = []
    new.add_listener(lambda state, leader: states.append((state, leader)))
    assert await new.campaign() is LeaderState.LEADING
    await asyncio.sleep(SETTLE)
    assert states == [(LeaderState.LEADING, "new")]
    assert new.is_leader and await new.current_leader() == "new"
    await new.resign()
    await old_session.close()
    await new_session.close()
