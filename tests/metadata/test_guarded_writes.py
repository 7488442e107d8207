"""Guarded writes, on every backend: `put`, `create` and `delete` with `guard_path` and
`guard_mod_revision` happen only while the guard record was last written at that mod revision,
atomically with the write; else `GuardFailedError` (a `BadVersionError`) and nothing changes.

The use: a leader guards its writes with its election record, so that once deposed it cannot
write anything — not even create a record, where a compare-and-set has no version to compare."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.metadata import (
    AlreadyExistsError,
    BadVersionError,
    GuardFailedError,
    InvalidPathError,
    LeaderState,
    NotFoundError,
)
from pyengine.metadata.election import LeaderElection

TTL = 1.0


async def paths(store, prefix="/t") -> list[str]:
    return [r.path for r in await store.list_prefix(prefix)]


async def test_writes_go_while_the_guard_is_unchanged(store):
    guard = await store.put("/g", b"leader-a")
    g = {"guard_path": "/g", "guard_mod_revision": guard.mod_revision}
    created = await store.create("/t/a", b"1", **g)
    assert created.version == 0
    updated = await store.put("/t/a", b"2", created.version, expected_mod_revision=created.mod_revision, **g)
    assert updated.version == 1
    assert (await store.put("/t/b", b"x", **g)).value == b"x"
    await store.delete("/t/b", **g)
    # the guard's own conditions come on top of the write's
    with pytest.raises(AlreadyExistsError):
        await store.create("/t/a", b"3", **g)
    with pytest.raises(NotFoundError):
        await store.delete("/t/b", **g)
    with pytest.raises(BadVersionError) as refused:
        await store.put("/t/a", b"3", 0, **g)
    assert not isinstance(refused.value, GuardFailedError)
    assert await paths(store) == ["/t/a"] and (await store.get("/t/a")).value == b"2"
    assert (await store.get("/g")).mod_revision == guard.mod_revision     # the guard is only read


@pytest.mark.parametrize("change", ["rewritten", "recreated", "deleted"])
async def test_writes_are_refused_once_the_guard_changed(store, change):
    guard = await store.put("/g", b"leader-a")
    existing = await store.put("/t/a", b"1")
    if change == "rewritten":                   # another leader's record
        await store.put("/g", b"leader-b")
    elif change == "recreated":                 # same version, but a new record
        await store.delete("/g")
        assert (await store.put("/g", b"leader-a")).version == guard.version
    else:
        await store.delete("/g")
    g = {"guard_path": "/g", "guard_mod_revision": guard.mod_revision}
    attempts = [
        store.create("/t/new", b"x", **g),                   # create-if-absent: no version to compare
        store.put("/t/new", b"x", **g),
        store.put("/t/a", b"2", existing.version, expected_mod_revision=existing.mod_revision, **g),
        store.put("/t/a", b"2", **g),
        store.delete("/t/a", existing.version, **g),
        store.delete("/t/a", **g),
        store.put("/t/s-", b"x", sequential=True, **g),
    ]
    for attempt in attempts:
        with pytest.raises(GuardFailedError, match="/g"):
            await attempt
    assert issubclass(GuardFailedError, BadVersionError)
    assert await paths(store) == ["/t/a"] and (await store.get("/t/a")).value == b"1"


async def test_the_guard_is_checked_before_the_writes_own_conditions(store):
    """A refused guard is reported as such, not as the record's state: a deposed writer must
    learn that it was deposed, not that a record exists or is missing."""
    guard = await store.put("/g", b"leader-a")
    await store.put("/t/a", b"1")
    await store.put("/g", b"leader-b")
    g = {"guard_path": "/g", "guard_mod_revision": guard.mod_revision}
    with pytest.raises(GuardFailedError):
        await store.create("/t/a", b"x", **g)                # exists: not AlreadyExistsError
    with pytest.raises(GuardFailedError):
        await store.delete("/t/missing", **g)                # missing: not NotFoundError
    with pytest.raises(GuardFailedError):
        await store.put("/t/a", b"x", 7, **g)                # wrong version


async def test_guarded_writes_of_indexed_and_ephemeral_records(store):
    store.declare_index("by-value", "/t/i/", lambda r: r.value.decode())
    session = await store.create_session(TTL)
    guard = await store.put("/g", b"leader-a")
    g = {"guard_path": "/g", "guard_mod_revision": guard.mod_revision}
    await store.create("/t/i/x", b"v1", **g)
    await store.put("/t/e", b"e", session=session, **g)
    current = await store.put("/g", b"leader-b")
    with pytest.raises(GuardFailedError):
        await store.put("/t/i/x", b"v2", **g)
    with pytest.raises(GuardFailedError):
        await store.create("/t/i/y", b"v2", **g)
    with pytest.raises(GuardFailedError):
        await store.delete("/t/i/x", **g)
    with pytest.raises(GuardFailedError):
        await store.put("/t/e2", b"e", session=session, **g)
    assert [r.path for r in await store.range_query("by-value")] == ["/t/i/x"]
    assert [r.value for r in await store.range_query("by-value")] == [b"v1"]
    assert await paths(store) == ["/t/e", "/t/i/x"]
    # under the current guard: written, and deleted with its index entry
    g = {"guard_path": "/g", "guard_mod_revision": current.mod_revision}
    await store.put("/t/i/x", b"v3", **g)
    assert [r.value for r in await store.range_query("by-value", prefix="v3")] == [b"v3"]
    await store.delete("/t/i/x", **g)
    assert await store.range_query("by-value") == []
    await session.close()


async def test_an_election_record_guards_its_leaders_writes(backend):
    """The leader's guard is its election record at `leader_revision`. Deposed (its session
    gone, another candidate's record in its place) but not aware of it yet, its guarded writes
    — creating a record new to it included — are refused."""
    store_a = await backend.new().start()
    store_b = await backend.new().start() if backend.name == "etcd" else store_a    # another broker
    session_a, session_b = await store_a.create_session(TTL), await store_b.create_session(TTL)
    a = LeaderElection(store_a, "/election", "a", session=session_a)
    b = LeaderElection(store_b, "/election", "b", session=session_b)
    assert await a.campaign() is LeaderState.LEADING
    assert await b.campaign() is LeaderState.FOLLOWING and b.leader_revision is None
    won = await store_a.get("/election")
    assert a.leader_revision == won.mod_revision
    guard_a = {"guard_path": a.path, "guard_mod_revision": a.leader_revision}
    await store_a.create("/t/by-a", b"a", **guard_a)
    a._task.cancel()                            # a is paused: it does not see what follows,
    session_a.remove_listener(a._session_ended)     # not even its session's end
    await session_a.close()                     # its record goes: b wins
    await b.wait_for(LeaderState.LEADING, timeout=6)
    assert a.state is LeaderState.LEADING       # a still believes it leads
    with pytest.raises(GuardFailedError):
        await store_a.create("/t/by-a-too-late", b"a", **guard_a)
    with pytest.raises(GuardFailedError):
        await store_a.delete("/t/by-a", **guard_a)
    await store_b.create("/t/by-b", b"b", guard_path=b.path, guard_mod_revision=b.leader_revision)
    assert await paths(store_b) == ["/t/by-a", "/t/by-b"]
    await b.resign()
    assert b.leader_revision is None


async def test_a_guard_rewrite_racing_with_writes_splits_them_by_revision(store):
    """Atomic with the write: every write that went is ordered before the guard's rewrite,
    every one after it is refused."""
    guard = await store.put("/g", b"leader-a")
    g = {"guard_path": "/g", "guard_mod_revision": guard.mod_revision}

    async def write(i: int):
        await asyncio.sleep(0.001 * (i % 5))
        try:
            return await store.create(f"/t/{i:03d}", b"x", **g)
        except GuardFailedError:
            return None

    writes = [asyncio.ensure_future(write(i)) for i in range(40)]
    await asyncio.sleep(0.002)
    rewrite = await store.put("/g", b"leader-b")
    written = [r for r in await asyncio.gather(*writes) if r is not None]
    assert all(r.mod_revision < rewrite.mod_revision for r in written)
    assert sorted(r.path for r in written) == await paths(store, "/t/")


_MALFORMED = [
    ({"guard_path": "/g"}, ValueError),
    ({"guard_mod_revision": 3}, ValueError),
    ({"guard_path": "g", "guard_mod_revision": 3}, InvalidPathError),
    ({"guard_path": "/g/", "guard_mod_revision": 3}, InvalidPathError),
    ({"guard_path": "/g", "guard_mod_revision": 0}, ValueError),
    ({"guard_path": "/g", "guard_mod_revision": -4}, ValueError),
    ({"guard_path": "/g", "guard_mod_revision": "3"}, TypeError),
    ({"guard_path": "/g", "guard_mod_revision": 3.0}, TypeError),
    ({"guard_path": "/g", "guard_mod_revision": True}, TypeError),
    ({"guard_path": 7, "guard_mod_revision": 3}, TypeError),
    ({"guard_path": b"/g", "guard_mod_revision": 3}, TypeError),
]


@pytest.mark.parametrize("kwargs, error", _MALFORMED)
async def test_a_malformed_guard_is_refused_and_nothing_is_written(store, kwargs, error):
    await store.put("/g", b"leader")
    existing = await store.put("/t/a", b"1")
    for attempt in (store.put("/t/b", b"x", **kwargs), store.create("/t/c", b"x", **kwargs),
                    store.put("/t/a", b"2", existing.version, **kwargs), store.delete("/t/a", **kwargs)):
        with pytest.raises(error):
            await attempt
    assert await paths(store) == ["/t/a"] and (await store.get("/t/a")).value == b"1"
