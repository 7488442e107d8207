"""`LeaderElection.resign()` removes the record of its session at the election path whatever its
local view. Found by an audit: resign deleted the record only while the local state was
LEADING, but cancelling a campaign whose create was in flight does not undo the create (LMDB
commits it anyway, etcd has the request already), and a create whose reply was lost left a
record the local view never saw. The record then lived on with the broker's session: every
other candidate followed a leader that had resigned (a scalable topic's controller closed
while it campaigned)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.metadata import LeaderState, MetadataStoreError

TTL = 5.0
PATH = "/election"


async def _assert_free_for_another_candidate(store, session):
    """No record of the resigned candidate: another one wins the election at once."""
    other = await store.create_session(TTL)
    candidate = store.leader_election(PATH, "other", other)
    try:
        assert await asyncio.wait_for(candidate.campaign(), 5) is LeaderState.LEADING
        assert await candidate.current_leader() == "other"
    finally:
        await candidate.resign()
        await other.close()


@pytest.mark.parametrize("steps", [1, 2, 3, 5, 8])
async def test_resign_while_the_first_create_is_in_flight(store, steps):
    session = await store.create_session(TTL)
    election = store.leader_election(PATH, "resigned", session)
    campaign = asyncio.ensure_future(election.campaign())
    for _ in range(steps):
        await asyncio.sleep(0)
    await election.resign()
    await asyncio.wait([campaign])
    campaign.cancelled() or campaign.exception()
    await asyncio.sleep(0.2)            # a write committed after resign() returned shows by now
    record = await store.get(PATH)
    assert record is None or record.session_id != session.id, \
        f"resign() left the record of its session ({record})"
    assert election.state is LeaderState.NO_LEADER
    assert session.alive
    await _assert_free_for_another_candidate(store, session)
    await session.close()


async def test_resign_while_the_reply_of_the_create_is_slow(store):
    """The create is written, its reply is on its way when the candidate resigns."""
    session = await store.create_session(TTL)
    create = store.create
    written = asyncio.Event()

    async def slow_reply(*args, **kwargs):
        record = await create(*args, **kwargs)
        written.set()
        await asyncio.sleep(0.1)        # the reply's latency
        return record

    store.create = slow_reply
    try:
        election = store.leader_election(PATH, "resigned", session)
        campaign = asyncio.ensure_future(election.campaign())
        await asyncio.wait_for(written.wait(), 5)
        assert election.state is LeaderState.NO_LEADER       # the reply has not arrived
        await election.resign()
    finally:
        del store.create
    await asyncio.wait([campaign])
    assert await store.get(PATH) is None, "resign() left the record its campaign wrote"
    assert session.alive
    await _assert_free_for_another_candidate(store, session)
    await session.close()


async def test_resign_after_the_reply_of_the_first_create_was_lost(store):
    """The create is written but its reply is lost: campaign() fails, and resign() (what its
    caller does then, as the scalable topic controller does) removes the record."""
    session = await store.create_session(TTL)
    create = store.create

    async def reply_lost(*args, **kwargs):
        await create(*args, **kwargs)
        raise MetadataStoreError("write: etcd is unreachable (the reply was lost)")

    store.create = reply_lost
    try:
        election = store.leader_election(PATH, "lost", session)
        with pytest.raises(MetadataStoreError):
            await asyncio.wait_for(election.campaign(), 5)
    finally:
        del store.create
    record = await store.get(PATH)
    assert record is not None and record.session_id == session.id      # written all the same
    await election.resign()
    assert await store.get(PATH) is None, "resign() left the record its failed campaign wrote"
    assert election.state is LeaderState.NO_LEADER
    await _assert_free_for_another_candidate(store, session)
    await session.close()


async def test_resign_keeps_another_sessions_record(store):
    """Only the record of its own session: a follower's resign leaves the leader's record."""
    leader_session = await store.create_session(TTL)
    follower_session = await store.create_session(TTL)
    leader = store.leader_election(PATH, "leader", leader_session)
    follower = store.leader_election(PATH, "follower", follower_session)
    assert await leader.campaign() is LeaderState.LEADING
    assert await follower.campaign() is LeaderState.FOLLOWING
    await follower.resign()
    record = await store.get(PATH)
    assert record is not None and record.session_id == leader_session.id
    assert leader.is_leader
    await leader.resign()
    assert await store.get(PATH) is None
    await leader_session.close()
    await follower_session.close()


async def test_resign_leaves_the_record_another_election_of_its_session_wrote(store):
    """A broker's elections share its session (one per scalable topic controller, the next
    controller of a topic campaigning while the last one resigns): a resign removes only the
    record its own campaign wrote, known by its create revision."""
    session = await store.create_session(TTL)
    holder = store.leader_election(PATH, "next", session)
    assert await holder.campaign() is LeaderState.LEADING
    written = await store.get(PATH)
    late = store.leader_election(PATH, "last", session)
    await late.campaign()               # its create refused: the record is the holder's
    await late.resign()
    assert await store.get(PATH) == written
    await holder.resign()
    assert await store.get(PATH) is None
    await session.close()
