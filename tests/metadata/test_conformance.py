"""The metadata-store conformance suite: every test runs unchanged on memory, lmdb and etcd."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from pyengine.metadata import (
    AlreadyExistsError,
    BadVersionError,
    InvalidPathError,
    LeaderState,
    MetadataStoreError,
    NotFoundError,
    NotificationType,
    SessionExpiredError,
)
from pyengine.metadata.election import LeaderElection

CREATED, MODIFIED, DELETED = NotificationType.CREATED, NotificationType.MODIFIED, NotificationType.DELETED
TTL = 1.0            # etcd's minimum lease TTL with the test server's timeouts
EXPIRY = 6.0         # generous bound for a session of TTL to expire (etcd checks leases every 0.5 s)


async def wait_until(predicate, timeout=EXPIRY, interval=0.05):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)


async def drain(watch, count, timeout=5.0):
    return [await watch.next(timeout) for _ in range(count)]


async def nothing_more(watch, wait=0.2):
    await asyncio.sleep(wait)
    assert watch.pending() == 0


# --- records and versions -----------------------------------------------------------------

async def test_get_put_versions_and_revisions(store):
    assert await store.get("/a") is None
    assert not await store.exists("/a")
    first = await store.put("/a", b"one")
    assert (first.path, first.value, first.version) == ("/a", b"one", 0)
    assert first.create_revision == first.mod_revision > 0
    assert not first.ephemeral and first.partition_key is None
    second = await store.put("/a", b"two")
    assert second.version == 1
    assert second.create_revision == first.create_revision
    assert second.mod_revision > first.mod_revision
    assert await store.get("/a") == second
    assert await store.exists("/a")
    third = await store.put("/a", bytearray(b"three"))
    assert third.version == 2 and (await store.get("/a")).value == b"three"
    empty = await store.put("/empty", b"")
    assert (await store.get("/empty")).value == b"" and empty.version == 0


async def test_compare_and_set(store):
    await store.put("/cas", b"v0", -1)
    assert (await store.put("/cas", b"v1", 0)).version == 1
    with pytest.raises(BadVersionError):
        await store.put("/cas", b"stale", 0)
    with pytest.raises(BadVersionError):
        await store.put("/cas", b"future", 5)
    assert (await store.get("/cas")).value == b"v1"
    with pytest.raises(AlreadyExistsError) as info:
        await store.put("/cas", b"again", -1)
    assert isinstance(info.value, BadVersionError)          # Pulsar: BadVersionException
    with pytest.raises(BadVersionError):
        await store.put("/missing", b"x", 0)                # expected a version, found nothing
    assert await store.get("/missing") is None
    created = await store.create("/made", b"m")
    assert created.version == 0
    with pytest.raises(AlreadyExistsError):
        await store.create("/made", b"m2")


async def test_compare_and_set_on_the_mod_revision_outlives_a_delete_and_create(store):
    """A version starts at 0 again when a record is created again: a holder of the deleted
    record's version 0 would overwrite the new one. Its mod_revision is never reused."""
    old = await store.create("/cas-rev", b"old")
    await store.delete("/cas-rev")
    new = await store.create("/cas-rev", b"new")
    assert new.version == old.version == 0 and new.mod_revision > old.mod_revision
    assert (await store.put("/cas-rev", b"stale", 0)).version == 1        # version alone: let through
    current = await store.get("/cas-rev")
    with pytest.raises(BadVersionError):
        await store.put("/cas-rev", b"stale", current.version, expected_mod_revision=old.mod_revision)
    with pytest.raises(BadVersionError):
        await store.put("/cas-rev", b"stale", expected_mod_revision=old.mod_revision)
    with pytest.raises(BadVersionError):                       # both must hold
        await store.put("/cas-rev", b"stale", 0, expected_mod_revision=current.mod_revision)
    assert (await store.get("/cas-rev")).value == b"stale" and (await store.get("/cas-rev")).version == 1
    written = await store.put("/cas-rev", b"v2", current.version, expected_mod_revision=current.mod_revision)
    assert written.version == 2
    assert (await store.put("/cas-rev", b"v3", expected_mod_revision=written.mod_revision)).version == 3
    with pytest.raises(BadVersionError):
        await store.put("/cas-rev-missing", b"x", expected_mod_revision=written.mod_revision)
    assert await store.get("/cas-rev-missing") is None
    # delete: the same
    with pytest.raises(BadVersionError):
        await store.delete("/cas-rev", expected_mod_revision=old.mod_revision)
    with pytest.raises(BadVersionError):
        await store.delete("/cas-rev", 0, expected_mod_revision=(await store.get("/cas-rev")).mod_revision)
    await store.delete("/cas-rev", 3, expected_mod_revision=(await store.get("/cas-rev")).mod_revision)
    assert await store.get("/cas-rev") is None


async def test_compare_and_set_on_the_mod_revision_of_an_indexed_record(store):
    op_kind_index(store)
    header = json.dumps({"state": "OPEN", "timeout_ms": 5}).encode()
    first = await store.put("/txn/t1", header)
    moved = await store.put("/txn/t1", header, expected_mod_revision=first.mod_revision)
    with pytest.raises(BadVersionError):
        await store.put("/txn/t1", header, expected_mod_revision=first.mod_revision)
    assert (await store.get("/txn/t1")).mod_revision == moved.mod_revision
    with pytest.raises(BadVersionError):
        await store.delete("/txn/t1", expected_mod_revision=first.mod_revision)
    await store.delete("/txn/t1", expected_mod_revision=moved.mod_revision)
    assert await store.range_query("idx:txn-by-deadline") == []


async def test_create_if_absent_race_has_exactly_one_winner(store):
    async def contender(i):
        try:
            await store.create("/race", str(i).encode())
            return i
        except AlreadyExistsError:
            return None

    results = await asyncio.gather(*(contender(i) for i in range(20)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert (await store.get("/race")).value == str(winners[0]).encode()


async def test_cas_increments_lose_no_update(store):
    await store.put("/counter", b"0")

    async def increment(times):
        done = 0
        while done < times:
            record = await store.get("/counter")
            try:
                await store.put("/counter", str(int(record.value) + 1).encode(), record.version)
                done += 1
            except BadVersionError:
                await asyncio.sleep(0)

    await asyncio.gather(*(increment(5) for _ in range(6)))
    record = await store.get("/counter")
    assert record.value == b"30" and record.version == 30


async def test_delete(store):
    with pytest.raises(NotFoundError):
        await store.delete("/d")
    await store.put("/d", b"x")
    await store.put("/d", b"y")
    with pytest.raises(BadVersionError):
        await store.delete("/d", 0)
    assert await store.exists("/d")
    await store.delete("/d", 1)
    assert await store.get("/d") is None
    with pytest.raises(NotFoundError):
        await store.delete("/d", 1)
    recreated = await store.put("/d", b"z")
    assert recreated.version == 0
    await store.delete("/d")
    assert not await store.exists("/d")


async def test_children_are_one_level_and_implicit_parents_count(store):
    for path in ["/p/a", "/p/a-b", "/p/a/x", "/p/a/y/z", "/p/a0", "/p/b/c", "/q", "/pp/x"]:
        await store.put(path, b"")
    assert await store.get_children("/p") == ["a", "a-b", "a0", "b"]
    assert await store.get_children("/p/a") == ["x", "y"]
    assert await store.get_children("/p/b") == ["c"]
    assert await store.get("/p/b") is None                  # a parent with no record of its own
    assert await store.get_children("/p/a/x") == []
    assert await store.get_children("/nothing") == []
    assert await store.get_children("/") == ["p", "pp", "q"]
    await store.delete("/p/a")                              # a record with children can be deleted
    assert await store.get_children("/p") == ["a", "a-b", "a0", "b"]


async def test_list_prefix_order_and_paging(store):
    paths = [f"/list/{i:03d}" for i in range(25)] + ["/list/a/deep", "/listx"]
    random.Random(1).shuffle(paths)
    for path in paths:
        await store.put(path, path.encode(), partition_key="pk")
    page = await store.list_prefix("/list/")
    expected = sorted(p for p in paths if p.startswith("/list/"))
    assert [r.path for r in page] == expected and not page.more
    assert all(r.value == r.path.encode() and r.partition_key == "pk" for r in page)
    assert [r.path for r in await store.list_prefix("/list")] == sorted(paths)       # a string prefix
    seen, after = [], None
    while True:
        page = await store.list_prefix("/list/", after=after, limit=7)
        seen += [r.path for r in page]
        if not page.more:
            break
        assert len(page) == 7
        after = page.last_path
    assert seen == expected
    assert (await store.list_prefix("/none/")).records == []


async def test_delete_recursive(store):
    for path in ["/t", "/t/a", "/t/a/b", "/t/c", "/tx", "/u"]:
        await store.put(path, b"")
    await store.put("/t/s/", b"", sequential=True)
    await store.delete_recursive("/t")
    assert [r.path for r in await store.list_prefix("/")] == ["/tx", "/u"]
    # the sequence counters below the deleted tree went with it
    assert (await store.put("/t/s/", b"", sequential=True)).path == "/t/s/0000000000"
    await store.delete_recursive("/nothing")


async def test_delete_recursive_with_a_guard_deletes_only_while_the_guard_is_unchanged(store):
    store.declare_index("by-value", "/t/i/", lambda r: r.value.decode())
    guard = await store.put("/g", b"layout")
    for path in ["/t", "/t/a", "/t/i/x"]:
        await store.put(path, b"v")
    # the guard rewritten: nothing goes
    await store.put("/g", b"split")
    with pytest.raises(BadVersionError, match="revision"):
        await store.delete_recursive("/t", guard_path="/g", guard_mod_revision=guard.mod_revision)
    assert [r.path for r in await store.list_prefix("/t")] == ["/t", "/t/a", "/t/i/x"]
    # deleted and created again at the same version: a new record, nothing goes
    await store.delete("/g")
    again = await store.put("/g", b"layout")
    assert again.version == guard.version and again.mod_revision != guard.mod_revision
    with pytest.raises(BadVersionError, match="revision"):
        await store.delete_recursive("/t", guard_path="/g", guard_mod_revision=guard.mod_revision)
    await store.delete("/g")
    with pytest.raises(BadVersionError, match="does not exist"):
        await store.delete_recursive("/t", guard_path="/g", guard_mod_revision=again.mod_revision)
    assert [r.path for r in await store.list_prefix("/t")] == ["/t", "/t/a", "/t/i/x"]
    assert [r.path for r in await store.range_query("by-value", prefix="v")] == ["/t/i/x"]
    # unchanged: everything goes, index entries too
    current = await store.put("/g", b"layout")
    await store.delete_recursive("/t", guard_path="/g", guard_mod_revision=current.mod_revision)
    assert [r.path for r in await store.list_prefix("/t")] == []
    assert await store.range_query("by-value") == []
    assert (await store.get("/g")).value == b"layout"


@pytest.mark.parametrize("kwargs, error", [
    ({"guard_path": "/g"}, ValueError),
    ({"guard_mod_revision": 3}, ValueError),
    ({"guard_path": "g", "guard_mod_revision": 3}, ValueError),
    ({"guard_path": "/g", "guard_mod_revision": 0}, ValueError),
    ({"guard_path": "/g", "guard_mod_revision": "3"}, TypeError),
    ({"guard_path": "/g", "guard_mod_revision": True}, TypeError),
    ({"guard_path": 7, "guard_mod_revision": 3}, TypeError),
])
async def test_delete_recursive_refuses_a_malformed_guard_and_deletes_nothing(store, kwargs, error):
    await store.put("/t/a", b"v")
    with pytest.raises(error):
        await store.delete_recursive("/t", **kwargs)
    assert await store.exists("/t/a")


async def test_partition_key_is_stored_and_returned(store):
    written = await store.put("/txn/1", b"h", partition_key="txn-1")
    assert written.partition_key == "txn-1"
    assert (await store.get("/txn/1")).partition_key == "txn-1"
    op = await store.put("/txn-op/1/", b"op", sequential=True, partition_key="txn-1")
    assert (await store.get(op.path)).partition_key == "txn-1"
    assert (await store.put("/txn/1", b"h2")).partition_key is None     # a put replaces it


# --- sequential keys -------------------------------------------------------------------------

async def test_sequential_keys_are_padded_and_monotonic_under_concurrency(store):
    records = await asyncio.gather(*(store.put("/seq/op-", str(i).encode(), sequential=True) for i in range(30)))
    paths = [r.path for r in records]
    assert len(set(paths)) == 30
    numbers = [int(p.removeprefix("/seq/op-")) for p in paths]
    assert all(len(p.removeprefix("/seq/op-")) == 10 for p in paths)
    # numbers follow creation order (revision order)
    by_revision = [int(r.path.removeprefix("/seq/op-")) for r in sorted(records, key=lambda r: r.mod_revision)]
    assert by_revision == sorted(numbers)
    assert sorted(numbers) == list(range(min(numbers), min(numbers) + 30))
    # per parent; a trailing slash makes the number the whole name
    other = await store.put("/seq2/", b"", sequential=True)
    assert other.path == "/seq2/0000000000"
    more = await store.put("/seq/", b"", sequential=True)
    assert int(more.path.removeprefix("/seq/")) > max(numbers)
    # still increasing after deletes
    await store.delete(paths[-1])
    assert int((await store.put("/seq/op-", b"", sequential=True)).path[-10:]) > int(more.path[-10:])
    assert (await store.create("/seq3/x-", b"", sequential=True)).path == "/seq3/x-0000000000"


async def test_sequential_skips_numbers_taken_by_hand(store):
    await store.put("/hand/0000000000", b"manual")
    record = await store.put("/hand/", b"auto", sequential=True)
    assert record.path == "/hand/0000000001"
    assert (await store.get("/hand/0000000000")).value == b"manual"


# --- watches ---------------------------------------------------------------------------------

async def test_watch_a_key(store):
    async with await store.watch("/w") as watch:
        await store.put("/w", b"1")
        await store.put("/w", b"2")
        await store.put("/w/child", b"not this one")
        await store.delete("/w")
        n1, n2, n3 = await drain(watch, 3)
        assert (n1.type, n1.path, n1.value, n1.version) == (CREATED, "/w", b"1", 0)
        assert (n2.type, n2.value, n2.version) == (MODIFIED, b"2", 1)
        assert (n3.type, n3.record, n3.value) == (DELETED, None, None)
        assert n1.revision < n2.revision < n3.revision
        assert n2.record.mod_revision == n2.revision and n2.record.create_revision == n1.revision
        await nothing_more(watch)
    assert watch.closed


async def test_watch_a_prefix_under_concurrent_writers_is_complete_and_ordered(store):
    watch = await store.watch("/cw/", prefix=True)
    writers, writes = 5, 12

    async def writer(w):
        for i in range(writes):
            await store.put(f"/cw/{w}", f"{w}:{i}".encode())
        await store.delete(f"/cw/{w}")

    await asyncio.gather(*(writer(w) for w in range(writers)))
    notifications = await drain(watch, writers * (writes + 1))
    await nothing_more(watch)
    revisions = [n.revision for n in notifications]
    assert revisions == sorted(revisions) and len(set(revisions)) == len(revisions)
    for w in range(writers):
        mine = [n for n in notifications if n.path == f"/cw/{w}"]
        assert [n.type for n in mine] == [CREATED] + [MODIFIED] * (writes - 1) + [DELETED]
        assert [n.value for n in mine[:-1]] == [f"{w}:{i}".encode() for i in range(writes)]
        assert [n.version for n in mine[:-1]] == list(range(writes))
    watch.close()


async def test_watch_since_resumes_after_a_read(store):
    await store.put("/r/a", b"1")
    page = await store.list_prefix("/r/")
    await store.put("/r/a", b"2")
    await store.put("/r/b", b"3")
    record = await store.get("/r/a")
    watch = await store.watch("/r/", prefix=True, since=page.revision)
    assert watch.start_revision == page.revision
    n1, n2 = await drain(watch, 2)
    assert (n1.path, n1.value, n2.path, n2.value) == ("/r/a", b"2", "/r/b", b"3")
    await nothing_more(watch)
    watch.close()
    # watching a key from the revision of the record read delivers exactly what follows it
    key_watch = await store.watch("/r/a", since=record.mod_revision)
    await store.put("/r/a", b"4")
    assert (await key_watch.next(5)).value == b"4"
    await nothing_more(key_watch)
    key_watch.close()


async def test_watch_without_since_starts_now(store):
    await store.put("/now", b"before")
    watch = await store.watch("/now")
    await store.put("/now", b"after")
    notification = await watch.next(5)
    assert notification.value == b"after" and notification.revision > watch.start_revision
    await nothing_more(watch)
    watch.close()


async def test_closing_the_store_ends_its_watches(backend):
    store = await backend.new().start()
    watch = await store.watch("/x")
    await store.close()
    assert [n async for n in watch] == []


# --- sessions and ephemeral records ------------------------------------------------------------

async def test_ephemeral_records_vanish_when_the_session_closes(store):
    session = await store.create_session(TTL)
    record = await store.put("/eph/a", b"a", session=session)
    assert record.ephemeral and record.session_id == session.id
    assert (await store.get("/eph/a")).session_id == session.id
    await store.put("/eph/durable", b"d")
    watch = await store.watch("/eph/", prefix=True)
    ended = []
    session.add_listener(lambda s: ended.append(s.state))
    await session.close()
    assert session.state == "closed" and ended == ["closed"]
    assert await store.get("/eph/a") is None
    assert (await store.get("/eph/durable")).value == b"d"
    notification = await watch.next(5)
    assert (notification.type, notification.path) == (DELETED, "/eph/a")
    with pytest.raises(SessionExpiredError):
        await store.put("/eph/b", b"b", session=session)
    watch.close()


async def test_ephemeral_records_vanish_when_the_session_expires(store):
    session = await store.create_session(TTL)
    keeper = await store.create_session(TTL)
    await store.put("/exp/a", b"a", session=session)
    await store.put("/exp/b", b"b", session=keeper)
    await asyncio.sleep(TTL * 1.5)                   # the keep-alive holds sessions past their TTL
    assert await store.exists("/exp/a")
    session.abandon()                                # as if its process had crashed
    await wait_until(lambda: _missing(store, "/exp/a"))
    assert session.state == "expired"
    assert (await store.get("/exp/b")).session_id == keeper.id
    with pytest.raises(SessionExpiredError):
        await store.put("/exp/c", b"c", session=session)
    await keeper.close()


async def _missing(store, path):
    return await store.get(path) is None


async def test_a_non_ephemeral_put_takes_the_record_out_of_the_session(store):
    session = await store.create_session(TTL)
    await store.put("/own", b"e", session=session)
    assert not (await store.put("/own", b"durable")).ephemeral
    await session.close()
    assert (await store.get("/own")).value == b"durable"


# --- leader election ---------------------------------------------------------------------------

class Tally:
    """Counts the candidates that believe they lead, at every state change."""

    def __init__(self):
        self.leading = set()
        self.max_leading = 0

    def watch(self, election):
        def on_change(state, _leader):
            if state is LeaderState.LEADING:
                self.leading.add(election.candidate_id)
            else:
                self.leading.discard(election.candidate_id)
            self.max_leading = max(self.max_leading, len(self.leading))
        election.add_listener(on_change)
        return election


async def test_leader_election_exactly_one_leader_and_failover(backend):
    stores = [await backend.new().start() for _ in range(3)] if backend.name == "etcd" else \
        [await backend.new().start()] * 3
    tally = Tally()
    sessions = [await s.create_session(TTL) for s in stores]
    elections = [tally.watch(LeaderElection(s, "/topics/t/n/x/controller", f"broker-{i}", session=sess))
                 for i, (s, sess) in enumerate(zip(stores, sessions))]
    states = await asyncio.gather(*(e.campaign() for e in elections))
    assert states.count(LeaderState.LEADING) == 1 and states.count(LeaderState.FOLLOWING) == 2
    leader = next(e for e in elections if e.is_leader)
    await wait_until(lambda: all(e.leader == leader.candidate_id for e in elections))
    assert await leader.current_leader() == leader.candidate_id
    record = await stores[0].get("/topics/t/n/x/controller")
    assert record.ephemeral and record.value == leader.candidate_id.encode()

    # the leader resigns: exactly one of the two others takes over
    await leader.resign()
    assert leader.state is LeaderState.NO_LEADER
    rest = [e for e in elections if e is not leader]
    await wait_until(lambda: sum(e.is_leader for e in rest) == 1)
    second = next(e for e in rest if e.is_leader)
    third = next(e for e in rest if e is not second)
    await wait_until(lambda: third.leader == second.candidate_id)

    # the new leader crashes (its session is no longer refreshed): the last one takes over
    second.session.abandon()
    await wait_until(lambda: third.is_leader)
    assert second.state is LeaderState.NO_LEADER
    assert await third.current_leader() == third.candidate_id
    assert tally.max_leading == 1                  # never two leaders at once
    for e in elections:
        await e.resign()
    assert await third.current_leader() is None


async def test_leader_election_candidate_with_a_dead_session_stops(store):
    session = await store.create_session(TTL)
    election = LeaderElection(store, "/le", "only", session=session)
    assert await election.campaign() is LeaderState.LEADING
    await session.close()
    assert election.state is LeaderState.NO_LEADER
    await wait_until(lambda: _missing(store, "/le"))
    with pytest.raises(MetadataStoreError):
        await election.campaign()


async def test_a_follower_waits_for_leadership(store):
    a, b = await store.create_session(TTL), await store.create_session(TTL)
    first = LeaderElection(store, "/lw", "a", session=a)
    second = LeaderElection(store, "/lw", "b", session=b)
    assert await first.campaign() is LeaderState.LEADING
    assert await second.campaign() is LeaderState.FOLLOWING
    assert second.leader == "a"
    changes = []
    second.add_listener(lambda state, leader: changes.append((state, leader)))
    waiting = asyncio.ensure_future(second.wait_for(LeaderState.LEADING, timeout=EXPIRY))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await first.resign()
    await waiting
    assert changes[-1] == (LeaderState.LEADING, "b")
    await second.resign()


# --- secondary indexes -------------------------------------------------------------------------

def op_kind_index(store):
    """PIP-473's idx:writes-by-segment and idx:acks-by-segment-subscription, and a deadline index."""
    def writes_by_segment(record):
        op = json.loads(record.value)
        return op["segment"] if op["kind"] == "write" else None

    def acks_by_segment_subscription(record):
        op = json.loads(record.value)
        return (op["segment"], op["subscription"]) if op["kind"] == "ack" else None

    def txn_by_deadline(record):
        header = json.loads(record.value)
        return header["timeout_ms"] if header["state"] == "OPEN" else None

    store.declare_index("idx:writes-by-segment", "/txn-op/", writes_by_segment)
    store.declare_index("idx:acks-by-segment-subscription", "/txn-op/", acks_by_segment_subscription)
    store.declare_index("idx:txn-by-deadline", "/txn/", txn_by_deadline)


def op(kind, segment, subscription=None, position="1:0"):
    return json.dumps({"kind": kind, "segment": segment, "subscription": subscription,
                       "position": position}).encode()


async def test_index_range_query_follows_puts_and_deletes(store):
    op_kind_index(store)
    w1 = await store.put("/txn-op/t1/", op("write", "seg-a"), sequential=True, partition_key="t1")
    w2 = await store.put("/txn-op/t2/", op("write", "seg-b"), sequential=True, partition_key="t2")
    a1 = await store.put("/txn-op/t1/", op("ack", "seg-a", "sub-1"), sequential=True, partition_key="t1")
    a2 = await store.put("/txn-op/t2/", op("ack", "seg-a", "sub-2"), sequential=True, partition_key="t2")
    by_segment = await store.range_query("idx:writes-by-segment", prefix="seg-a")
    assert [r.path for r in by_segment] == [w1.path]
    assert by_segment[0].partition_key == "t1"
    assert [r.path for r in await store.range_query("idx:writes-by-segment")] == [w1.path, w2.path]
    assert [r.path for r in await store.range_query("idx:acks-by-segment-subscription", prefix=("seg-a", "sub-2"))] \
        == [a2.path]
    assert [r.path for r in await store.range_query("idx:acks-by-segment-subscription", prefix="seg-a")] \
        == [a1.path, a2.path]
    await store.delete(w1.path)
    assert await store.range_query("idx:writes-by-segment", prefix="seg-a") == []

    for txn, deadline in [("t1", 300), ("t2", 100), ("t3", 200)]:
        await store.put(f"/txn/{txn}", json.dumps({"state": "OPEN", "timeout_ms": deadline}).encode())
    expired = await store.range_query("idx:txn-by-deadline", None, 250)
    assert [r.path for r in expired] == ["/txn/t2", "/txn/t3"]            # by key, then path
    header = await store.get("/txn/t2")
    await store.put("/txn/t2", json.dumps({"state": "ABORTED", "timeout_ms": 100}).encode(), header.version)
    assert [r.path for r in await store.range_query("idx:txn-by-deadline", None, 250)] == ["/txn/t3"]
    await store.put("/txn/t3", json.dumps({"state": "OPEN", "timeout_ms": 400}).encode())
    assert [r.path for r in await store.range_query("idx:txn-by-deadline", 250)] == ["/txn/t1", "/txn/t3"]
    assert [r.version for r in await store.range_query("idx:txn-by-deadline", 350, 500)] == [1]


async def test_range_watch(store):
    op_kind_index(store)
    watch = await store.range_watch("idx:txn-by-deadline", 100, 200)
    open_ = lambda t: json.dumps({"state": "OPEN", "timeout_ms": t}).encode()   # noqa: E731
    await store.put("/txn/a", open_(150))                      # enters
    await store.put("/txn/a", open_(150))                      # changes, same key
    await store.put("/txn/b", open_(500))                      # outside
    await store.put("/txn/a", open_(180))                      # key changes inside the range
    await store.put("/txn/b", open_(120))                      # enters
    await store.put("/txn/a", open_(900))                      # leaves
    await store.delete("/txn/b")                               # leaves
    got = [(n.type, n.path, n.index_key) for n in await drain(watch, 7)]
    assert got == [(CREATED, "/txn/a", 150), (MODIFIED, "/txn/a", 150), (DELETED, "/txn/a", 150),
                   (CREATED, "/txn/a", 180), (CREATED, "/txn/b", 120), (DELETED, "/txn/a", 180),
                   (DELETED, "/txn/b", 120)]
    await nothing_more(watch)
    watch.close()
    # resume from a revision
    since = (await store.get("/txn/a")).mod_revision
    await store.put("/txn/c", open_(110))
    resumed = await store.range_watch("idx:txn-by-deadline", prefix=110, since=since)
    n = await resumed.next(5)
    assert (n.type, n.path, n.index, n.index_key, n.record.value) == \
        (CREATED, "/txn/c", "idx:txn-by-deadline", 110, open_(110))
    resumed.close()


async def test_ephemeral_index_entries_go_with_the_session(store):
    store.declare_index("by-owner", "/owned/", lambda r: r.value.decode())
    session = await store.create_session(TTL)
    await store.put("/owned/a", b"x", session=session)
    await store.put("/owned/b", b"x")
    watch = await store.range_watch("by-owner", prefix="x")
    await session.close()
    assert [r.path for r in await store.range_query("by-owner", prefix="x")] == ["/owned/b"]
    n = await watch.next(5)
    assert (n.type, n.path) == (DELETED, "/owned/a")
    watch.close()


async def test_failing_index_function_fails_the_write(store):
    store.declare_index("strict", "/strict/", lambda r: json.loads(r.value)["k"])
    await store.put("/strict/ok", b'{"k": 1}')
    with pytest.raises(MetadataStoreError):
        await store.put("/strict/bad", b"not json")
    with pytest.raises(MetadataStoreError):
        await store.put("/strict/float", b'{"k": 1.5}')
    assert await store.get("/strict/bad") is None
    assert [r.path for r in await store.range_query("strict")] == ["/strict/ok"]


async def test_index_keys_order_ints_bytes_str_and_tuples(store):
    keys = {"/k/1": -5, "/k/2": 7, "/k/3": b"\x00b", "/k/4": "a", "/k/5": ("a", 1), "/k/6": ("a", "b"),
            "/k/7": "a\x00", "/k/8": 2**62}
    store.declare_index("mixed", "/k/", lambda r: keys[r.path])
    for path in reversed(list(keys)):
        await store.put(path, b"")
    ordered = [r.path for r in await store.range_query("mixed")]
    assert ordered == ["/k/1", "/k/2", "/k/8", "/k/3", "/k/4", "/k/5", "/k/6", "/k/7"]
    assert [r.path for r in await store.range_query("mixed", prefix="a")] == ["/k/4", "/k/5", "/k/6"]
    assert [r.path for r in await store.range_query("mixed", ("a", 0), ("a", "a"))] == ["/k/5"]
    assert [r.path for r in await store.range_query("mixed", 0, b"")] == ["/k/2", "/k/8"]


# --- malformed input ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["", "a", "a/b", "/", "//", "/a/", "//a", "/a//b", "/a/./b", "/a/../b", "/a/.",
                                  "/a\x00b", "/\udc80"])
async def test_bad_paths(store, path):
    with pytest.raises(InvalidPathError):
        await store.put(path, b"x")
    with pytest.raises(InvalidPathError):
        await store.get(path)
    with pytest.raises(InvalidPathError):
        await store.delete(path)
    if path != "/":
        with pytest.raises(InvalidPathError):
            await store.get_children(path)


async def test_wrong_types_and_values(store):
    session = await store.create_session(TTL)
    cases = [
        (TypeError, store.put(b"/a", b"x")),
        (TypeError, store.put("/a", "text")),
        (TypeError, store.put("/a", 5)),
        (TypeError, store.put("/a", b"x", "0")),
        (TypeError, store.put("/a", b"x", True)),
        (TypeError, store.put("/a", b"x", 1.0)),
        (ValueError, store.put("/a", b"x", -2)),
        (ValueError, store.put("/a", b"x", -7)),
        (ValueError, store.delete("/a", -1)),
        (ValueError, store.delete("/a", -3)),
        (TypeError, store.delete("/a", "1")),
        (TypeError, store.put("/a", b"x", session="s")),
        (TypeError, store.put("/a", b"x", partition_key=1)),
        (TypeError, store.put("/a", b"x", sequential=1)),
        (ValueError, store.put("/a-", b"x", 3, sequential=True)),
        (TypeError, store.put("/a", b"x", expected_mod_revision="3")),
        (TypeError, store.put("/a", b"x", expected_mod_revision=True)),
        (ValueError, store.put("/a", b"x", expected_mod_revision=0)),
        (ValueError, store.put("/a", b"x", -1, expected_mod_revision=3)),
        (ValueError, store.put("/a-", b"x", sequential=True, expected_mod_revision=3)),
        (TypeError, store.delete("/a", expected_mod_revision=1.0)),
        (ValueError, store.delete("/a", expected_mod_revision=-1)),
        (InvalidPathError, store.put("/a/", b"x")),            # a trailing slash only when sequential
        (TypeError, store.get(None)),
        (TypeError, store.list_prefix(3)),
        (InvalidPathError, store.list_prefix("no-slash")),
        (ValueError, store.list_prefix("/", limit=0)),
        (TypeError, store.list_prefix("/", limit="1")),
        (ValueError, store.watch("/a", since=-1)),
        (TypeError, store.watch("/a", since="1")),
        (ValueError, store.range_query("no-such-index")),
        (ValueError, store.create_session(0)),
        (ValueError, store.create_session(-1)),
        (TypeError, store.create_session("10")),
    ]
    for error, coroutine in cases:
        with pytest.raises(error):
            await coroutine
    with pytest.raises(ValueError):
        store.declare_index("bad name", "/x/", lambda r: 1)
    with pytest.raises(InvalidPathError):
        store.declare_index("ok", "x/", lambda r: 1)
    with pytest.raises(TypeError):
        store.declare_index("ok", "/x/", "not callable")
    store.declare_index("ok", "/x/", lambda r: 1)
    with pytest.raises(ValueError):
        store.declare_index("ok", "/y/", lambda r: 1)
    with pytest.raises(ValueError):
        await store.range_query("ok", 1, 2, prefix=1)
    with pytest.raises(TypeError):
        await store.range_query("ok", 1.5)
    assert await store.get("/a") is None and await store.get("/a-0000000000") is None
    await session.close()


async def test_a_closed_store_refuses_operations(backend):
    store = await backend.new().start()
    await store.close()
    with pytest.raises(MetadataStoreError):
        await store.get("/a")
    with pytest.raises(MetadataStoreError):
        await store.put("/a", b"")
