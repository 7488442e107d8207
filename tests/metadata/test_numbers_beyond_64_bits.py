"""Versions and revisions are 64-bit on every store. Found by an audit: numbers at or above 2**63
went through the argument checks (which had no upper bound) and reached etcd's protobuf, which
raised a raw `ValueError("Value out of range")`, while the local stores answered them as any
other mismatch; `expected_version=2**63-1` (etcd's version is one more) failed the same way; a
session TTL beyond etcd's maximum lease TTL failed only there. Now: every store refuses an
expected version, expected or guard mod revision or `since` above 2**63-1 with ValueError up
front; the largest 64-bit one is answered as any other value (a mismatch, a watch that waits);
a TTL above `MAX_SESSION_TTL` (etcd's maximum) is refused everywhere."""

from __future__ import annotations

import asyncio

import pytest

import pyengine.metadata
from pyengine.metadata import BadVersionError, GuardFailedError, NotFoundError

MAX_INT64 = 2**63 - 1
MAX_SESSION_TTL = 9_000_000_000.0       # etcd's maximum lease TTL (seconds)
BEYOND = [2**63, 2**64, 10**30]


def test_the_bounds_are_exported():
    assert getattr(pyengine.metadata, "MAX_INT64", None) == MAX_INT64
    assert getattr(pyengine.metadata, "MAX_SESSION_TTL", None) == MAX_SESSION_TTL


@pytest.mark.parametrize("number", BEYOND)
async def test_numbers_beyond_int64_are_refused_up_front(store, number):
    store.declare_index("ix", "/i/", lambda record: record.value.decode())
    await store.put("/n/a", b"x")
    calls = [
        lambda: store.put("/n/a", b"y", number),
        lambda: store.put("/n/missing", b"y", number),
        lambda: store.put("/i/a", b"y", number),
        lambda: store.put("/n/a", b"y", expected_mod_revision=number),
        lambda: store.put("/n/b", b"y", guard_path="/n/a", guard_mod_revision=number),
        lambda: store.create("/n/c", b"y", guard_path="/n/a", guard_mod_revision=number),
        lambda: store.delete("/n/a", number),
        lambda: store.delete("/n/a", expected_mod_revision=number),
        lambda: store.delete("/n/a", guard_path="/n/a", guard_mod_revision=number),
        lambda: store.delete_recursive("/n", guard_path="/n/a", guard_mod_revision=number),
        lambda: store.watch("/n/a", since=number),
        lambda: store.watch("/n/", prefix=True, since=number),
        lambda: store.range_watch("ix", since=number),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="64-bit"):
            await call()
    record = await store.get("/n/a")
    assert (record.value, record.version) == (b"x", 0)


async def test_the_largest_int64_numbers_are_answered_as_any_other(store):
    store.declare_index("ix", "/i/", lambda record: record.value.decode())
    await store.put("/n/a", b"x")
    await store.put("/i/a", b"x")
    with pytest.raises(BadVersionError):
        await store.put("/n/a", b"y", MAX_INT64)
    with pytest.raises(BadVersionError):
        await store.put("/n/missing", b"y", MAX_INT64)
    with pytest.raises(BadVersionError):
        await store.put("/i/a", b"y", MAX_INT64)
    with pytest.raises(BadVersionError):
        await store.put("/n/a", b"y", expected_mod_revision=MAX_INT64)
    with pytest.raises(GuardFailedError):
        await store.put("/n/b", b"y", guard_path="/n/a", guard_mod_revision=MAX_INT64)
    with pytest.raises(BadVersionError):
        await store.delete("/n/a", MAX_INT64)
    with pytest.raises(BadVersionError):
        await store.delete("/i/a", MAX_INT64)
    with pytest.raises(NotFoundError):
        await store.delete("/n/missing", MAX_INT64)
    with pytest.raises(BadVersionError):
        await store.delete("/n/a", expected_mod_revision=MAX_INT64)
    assert (await store.get("/n/a")).value == b"x"

    # a watch from the largest revision: nothing after it will ever come
    for watch in [await store.watch("/n/a", since=MAX_INT64),
                  await store.watch("/n/", prefix=True, since=MAX_INT64 - 1),
                  await store.range_watch("ix", since=MAX_INT64)]:
        async with watch:
            await store.put("/n/a", b"z")
            await store.put("/i/a", b"z")
            with pytest.raises(asyncio.TimeoutError):
                await watch.next(0.5)


async def test_session_ttls_beyond_the_maximum_are_refused(store):
    for ttl in (MAX_SESSION_TTL + 1, 1e10, 1e300, 2**64):
        with pytest.raises(ValueError, match="TTL"):
            await store.create_session(ttl)
    session = await store.create_session(MAX_SESSION_TTL)
    assert session.alive and session.ttl == MAX_SESSION_TTL
    await store.put("/eph", b"x", session=session)
    await session.close()
    assert await store.get("/eph") is None
