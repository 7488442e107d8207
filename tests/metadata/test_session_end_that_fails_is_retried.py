"""A session whose end could not be written (the local store's write failed: the LMDB
environment out of space, an I/O error) still has its ephemeral records deleted: the store tries
again after the session's TTL, as etcd expires a lease it could not revoke. Found by an audit:
the store forgot the session's expiry before writing its end, so after a failed write its
ephemeral records stayed until the process restarted — an election record naming a leader
that is gone, followed by every other candidate for as long."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.metadata import MetadataStoreError

TTL = 0.3


@pytest.fixture(params=["memory", "lmdb"])
def backend_name(request):
    return request.param


def fail_next_write(store) -> list[MetadataStoreError]:
    apply, failures = store._apply, [MetadataStoreError("metadata write failed: I/O error (once)")]

    async def flaky(fn):
        if failures:
            raise failures.pop()
        return await apply(fn)
    store._apply = flaky
    return failures


async def eventually_gone(store, path: str, timeout: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await store.get(path) is not None:
        assert loop.time() < deadline, f"{path} outlived its session"
        await asyncio.sleep(0.02)


async def test_a_session_closed_while_the_store_fails_loses_its_records_later(store):
    session = await store.create_session(TTL)
    await store.create("/leader", b"me", session=session)
    failures = fail_next_write(store)
    with pytest.raises(MetadataStoreError):
        await session.close()
    assert not failures and session.state == "closed"
    await eventually_gone(store, "/leader")


async def test_a_session_expiring_while_the_store_fails_loses_its_records_later(store):
    session = await store.create_session(TTL)
    await store.create("/leader", b"me", session=session)
    session.abandon()                       # the store expires it after its TTL ...
    failures = fail_next_write(store)       # ... and that first write fails
    assert await asyncio.wait_for(session.wait_ended(), 2) == "expired"
    assert not failures
    await eventually_gone(store, "/leader")
