"""A candidate whose session has already ended (closed, or expired before it campaigns) is
refused at once. Found by an audit: `campaign()` registered its session listener, which an
ended session never calls, and started a task that stops at once as the session is not alive,
so the first attempt it waits for never came: it waited forever (a scalable topic controller
created while its broker shut down hung its request)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.metadata import LeaderState, SessionExpiredError


async def test_campaigning_with_a_closed_session_is_refused(store):
    session = await store.create_session(5.0)
    election = store.leader_election("/election", "me", session)
    await session.close()
    with pytest.raises(SessionExpiredError):
        await asyncio.wait_for(election.campaign(), 2)
    assert election.state is LeaderState.NO_LEADER
    assert await store.get("/election") is None
