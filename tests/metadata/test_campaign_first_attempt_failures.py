"""`LeaderElection.campaign()` reports a failure of its first attempt, whatever it is, instead
of waiting forever. Found by an audit: only `MetadataStoreError` reached the caller; anything
else (the `ValueError` of a session of another store object) ended the election's task with
the first attempt's future never set. A session of another store is now refused at once;
failures after the first attempt are retried (the election goes on)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.metadata import LeaderState
from pyengine.metadata.election import LeaderElection

TTL = 5.0


class Wrapped:
    """The store as an election sees it, `create` replaced."""

    def __init__(self, store, create):
        self._store = store
        self.create = create

    def __getattr__(self, name):
        return getattr(self._store, name)


async def test_a_session_of_another_store_is_refused_at_once(backend):
    store = await backend.new().start()
    other = await backend.new().start()
    session = await other.create_session(TTL)
    with pytest.raises(ValueError, match="another metadata store"):
        store.leader_election("/election", "a", session)
    with pytest.raises(ValueError, match="another metadata store"):
        LeaderElection(store, "/election", "a", session=session)
    assert await store.get("/election") is None
    await session.close()


async def test_a_session_of_another_store_behind_a_wrapper_fails_the_campaign(backend):
    store = await backend.new().start()
    other = await backend.new().start()
    session = await other.create_session(TTL)
    election = LeaderElection(Wrapped(store, store.create), "/election", "a", session=session)
    with pytest.raises(ValueError, match="another metadata store"):
        await asyncio.wait_for(election.campaign(), 5)
    with pytest.raises(ValueError):                 # later calls report it too
        await asyncio.wait_for(election.campaign(), 5)
    await election.resign()
    assert election.state is LeaderState.NO_LEADER
    await session.close()


async def test_an_unexpected_error_of_the_first_attempt_reaches_campaign(store):
    session = await store.create_session(TTL)

    async def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    election = LeaderElection(Wrapped(store, broken), "/election", "a", session=session)
    with pytest.raises(RuntimeError, match="a bug"):
        await asyncio.wait_for(election.campaign(), 5)
    await election.resign()
    assert await store.get("/election") is None
    await session.close()


async def test_an_unexpected_error_after_the_first_attempt_is_retried(store, caplog):
    session = await store.create_session(TTL)
    calls = []

    async def create(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("a bug, once")
        return await store.create(*args, **kwargs)

    election = LeaderElection(Wrapped(store, create), "/election", "a", session=session)
    assert await election.campaign() is LeaderState.LEADING
    await store.delete("/election")               # the record goes: it campaigns again
    await asyncio.wait_for(election.wait_for(LeaderState.NO_LEADER), 5)
    await asyncio.wait_for(election.wait_for(LeaderState.LEADING), 5)
    assert len(calls) == 3
    assert (await store.get("/election")).session_id == session.id
    assert "a bug, once" in caplog.text
    await election.resign()
    assert await store.get("/election") is None
    await session.close()
