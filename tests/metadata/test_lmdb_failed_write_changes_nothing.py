"""On LMDB a metadata write that fails half-way changes nothing, as on the other backends: each
write function runs in a transaction nested in the group commit's, aborted alone when it fails,
while the other writes of the batch are committed. Found by an audit: a write that raised after
its first changes (LMDB refused a long key) was committed half-way — the caller got
MetadataStoreError while the record change was durable, without notification, index entries or
session bookkeeping (an ephemeral record that outlived its session, and restarts)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.metadata import MetadataStoreError
from pyengine.metadata.lmdb_store import LmdbKV, LmdbMetadataStore
from pyengine.storage import StorageEnvironment


@pytest.fixture(params=["lmdb"])
def backend_name(request):
    return request.param


@pytest.fixture
def fail_puts(monkeypatch):
    """Make the KV puts of keys starting with one of `prefixes` raise (as LMDB raised for a key
    it refused) — after the write's earlier changes."""
    prefixes: list[bytes] = []
    put = LmdbKV.put

    def failing(self, key, value):
        if any(key.startswith(prefix) for prefix in prefixes):
            raise RuntimeError(f"injected failure writing {key[:12]!r}")
        put(self, key, value)
    monkeypatch.setattr(LmdbKV, "put", failing)
    return prefixes


async def revision(store) -> int:
    return (await store.list_prefix("/")).revision


async def test_a_write_failing_half_way_changes_nothing(store, fail_puts):
    store.declare_index("byval", "/t/", lambda record: record.value.decode())
    session = await store.create_session(5)
    before = await store.put("/t/a", b"one")
    watch = await store.watch("/t/", prefix=True)
    at = await revision(store)
    # the ephemeral bookkeeping (`e...`) comes after the revision and the record; the index
    # entries (`i...`) after those: each failure leaves no trace
    for prefix, write in [(b"e", lambda: store.put("/t/b", b"two", session=session)),
                          (b"i", lambda: store.put("/t/a", b"changed", expected_version=0)),
                          (b"i", lambda: store.put("/t/c", b"three"))]:
        fail_puts[:] = [prefix]
        with pytest.raises(MetadataStoreError, match="injected failure"):
            await write()
        fail_puts.clear()
        assert await revision(store) == at
        assert [(r.path, r.value, r.version) for r in await store.list_prefix("/t/")] == [("/t/a", b"one", 0)]
        assert [r.path for r in await store.range_query("byval")] == ["/t/a"]
        assert watch.pending() == 0
    # the caller's retry of its compare-and-set goes through
    assert (await store.put("/t/a", b"changed", expected_version=before.version)).version == 1
    assert [r.path for r in await store.range_query("byval", prefix="changed")] == ["/t/a"]
    assert (await watch.next(timeout=1)).path == "/t/a"


async def test_the_other_writes_of_the_batch_are_committed(store, fail_puts):
    fail_puts[:] = [b"r/t/bad"]
    results = await asyncio.gather(store.put("/t/ok-1", b"1"), store.put("/t/bad", b"x"),
                                   store.put("/t/ok-2", b"2"), return_exceptions=True)
    assert isinstance(results[1], MetadataStoreError)
    assert [r.path for r in results if not isinstance(r, BaseException)] == ["/t/ok-1", "/t/ok-2"]
    assert [r.path for r in await store.list_prefix("/t/")] == ["/t/ok-1", "/t/ok-2"]
    assert [r.mod_revision for r in await store.list_prefix("/t/")] == [1, 2]


async def test_a_long_ephemeral_record_is_gone_after_a_restart(tmp_path):
    """A broker that stops without ending its sessions (the environment went first, as in a
    crash) finds none of their ephemeral records at its next start, however long their paths."""
    path = "/" + "p" * 503       # a record key that fits LMDB, an ephemeral-bookkeeping one that did not
    env = StorageEnvironment(tmp_path / "data", sync=False)
    store = await LmdbMetadataStore(env).start()
    session = await store.create_session(5)
    await store.put(path, b"v", session=session)
    await store.put("/normal", b"v", session=session)
    await env.drain()
    env.close()                 # the sessions' ends can no longer be written
    await store.close()
    env = StorageEnvironment(tmp_path / "data", sync=False)
    try:
        store = await LmdbMetadataStore(env).start()
        assert await store.get(path) is None and await store.get("/normal") is None
        await store.close()
    finally:
        env.close()
