"""`delete_recursive` deletes every record below the path, also one written while it runs.
Found by an audit: on etcd (one record at a time) a record modified between the read and the
conditional delete of it failed the delete's compare, and the failure was ignored: the call
returned normally and the record stayed (the local stores delete the tree atomically, the
indexed branch on etcd retried)."""

from __future__ import annotations

import asyncio

import pytest

TREE = ["/topic/t", "/topic/t/subs/s1", "/topic/t/subs/s1/consumers/c1", "/topic/t/subs/s2"]
RACED = "/topic/t/subs/s1/consumers/c1"


@pytest.mark.parametrize("indexed", [False, True], ids=["plain", "indexed"])
async def test_a_record_modified_during_delete_recursive_is_deleted(backend, backend_name, indexed):
    store = await backend.new().start()
    other = await backend.new().start() if backend_name == "etcd" else store     # another broker
    if indexed:
        for s in {id(store): store, id(other): other}.values():
            s.declare_index("by-value", "/topic/", lambda record: record.value.decode())
    for path in TREE:
        await store.put(path, b"v0")
    before = (await store.list_prefix("/")).revision

    if backend_name == "etcd":
        # between the deletion's read of the record and its delete, another broker writes it
        get_kv = store._get_kv
        raced = []

        async def racing_get_kv(path):
            kv = await get_kv(path)
            if path == RACED and not raced:
                raced.append(await other.put(path, b"heartbeat"))
            return kv

        store._get_kv = racing_get_kv
        try:
            await store.delete_recursive("/topic/t/subs")
        finally:
            del store._get_kv
        assert raced, "the race was not injected"
    else:
        await asyncio.gather(store.delete_recursive("/topic/t/subs"), other.put(RACED, b"heartbeat"))

    left = [record for record in await store.list_prefix("/topic/t/subs")
            if record.create_revision <= before]
    assert left == [], f"records that existed before delete_recursive are left: {left}"
    assert await store.get("/topic/t") is not None
    if indexed:
        assert {r.path for r in await store.range_query("by-value")} in ({"/topic/t"}, {"/topic/t", RACED})


@pytest.mark.parametrize("backend_name", ["etcd"])     # the local stores delete the tree in one write
async def test_a_record_changed_before_every_delete_fails_the_call_instead_of_holding_it(backend):
    """On etcd each record's delete is a read then a compare: a writer that changes the record
    in every gap used to hold `delete_recursive` in that loop for good (a livelock). It now
    gives up after a bounded number of tries with BadVersionError, and the caller decides."""
    from pyengine.metadata import BadVersionError
    from pyengine.metadata.etcd_store import DELETE_TRIES

    store = await backend.new().start()
    other = await backend.new().start()
    for path in TREE:
        await store.put(path, b"v0")
    get_kv = store._get_kv
    writes = []

    async def always_racing_get_kv(path):
        kv = await get_kv(path)
        if path == RACED:
            writes.append(await other.put(path, b"heartbeat %d" % len(writes)))
        return kv

    store._get_kv = always_racing_get_kv
    try:
        with pytest.raises(BadVersionError, match="changed"):
            await asyncio.wait_for(store.delete_recursive("/topic/t/subs"), 30)
    finally:
        del store._get_kv
    assert len(writes) == DELETE_TRIES
    assert await store.get(RACED) is not None        # what the writer keeps writing stays
    await store.delete_recursive("/topic/t/subs")     # and goes once the writer pauses
    assert await store.get(RACED) is None
