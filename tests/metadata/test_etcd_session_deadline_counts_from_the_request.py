"""A session's local deadline counts from before the request that created it, so that it ends
locally no later than the store expires it (as the keep-alive does for every refresh). Found by
an audit: on etcd it counted from the arrival of the lease-grant reply, while etcd's TTL runs
from the grant; with a slow reply, a partitioned leader believed it led for that long after
etcd expired its lease and another candidate won."""

from __future__ import annotations

import asyncio

import pytest

LATENCY = 0.6           # of the lease-grant reply


@pytest.mark.parametrize("backend_name", ["etcd"])
async def test_the_local_deadline_counts_from_the_grant_request(store):
    loop = asyncio.get_running_loop()
    rpc = store._rpc

    async def slow_grant_reply(method, request, what):
        reply = await rpc(method, request, what)
        if what == "create a session":
            await asyncio.sleep(LATENCY)
        return reply

    store._rpc = slow_grant_reply
    try:
        requested = loop.time()
        session = await store.create_session(1.0)
    finally:
        del store._rpc
    assert loop.time() - requested >= LATENCY
    session.abandon()                   # no refresh from now on (a partition)
    await asyncio.wait_for(session.wait_ended(), 5)
    ended = loop.time() - requested
    assert session.state == "expired"
    # etcd's TTL started after the request was sent: the local end must not come later
    assert ended <= session.ttl + 0.1, f"ended {ended:.2f} s after the grant request (TTL {session.ttl})"


async def test_a_session_that_is_refreshed_lives_on(store):
    """The earlier deadline is only the first one: refreshes move it on."""
    session = await store.create_session(1.0)
    await asyncio.sleep(2.5)
    assert session.alive
    await session.close()
