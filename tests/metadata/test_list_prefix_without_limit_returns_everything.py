"""`list_prefix` without a limit returns every matching record, however large the result, in one
snapshot; with a limit, at most that many and `more`. Found by an audit: on etcd it asked for
everything in one range request, which fails once the reply exceeds gRPC's 4 MiB message limit
(RESOURCE_EXHAUSTED), while the local stores returned the records."""

from __future__ import annotations

import pytest

BIG = 1_000_000          # per record: under etcd's request limit; five exceed a 4 MiB reply


async def test_an_unlimited_list_larger_than_a_grpc_message(store):
    for i in range(5):
        await store.put(f"/big/{i}", bytes([i]) * BIG)
    await store.put("/bigger", b"not below /big/")
    page = await store.list_prefix("/big/")
    assert [r.path for r in page] == [f"/big/{i}" for i in range(5)]
    assert [r.value for r in page] == [bytes([i]) * BIG for i in range(5)]
    assert not page.more

    first = await store.list_prefix("/big/", limit=4)
    assert [r.path for r in first] == [f"/big/{i}" for i in range(4)] and first.more
    rest = await store.list_prefix("/big/", after=first.last_path, limit=4)
    assert [r.path for r in rest] == ["/big/4"] and not rest.more


async def test_an_unlimited_list_of_many_records_is_one_snapshot(backend_name, store):
    count = 1500                # several of the etcd backend's pages
    for i in range(count):
        await store.put(f"/many/{i:05d}", b"x")
    last = await store.put("/many/~", b"last")
    if backend_name == "etcd":
        # a write lands between two of the listing's requests: not in the result
        range_ = store._range
        calls = []

        async def writing_between_pages(request):
            reply = await range_(request)
            if not calls:
                calls.append(await store.put("/many/00000-late", b"late"))
            return reply

        store._range = writing_between_pages
        try:
            page = await store.list_prefix("/many/")
        finally:
            del store._range
        assert calls
    else:
        page = await store.list_prefix("/many/")
    assert len(page) == count + 1 and not page.more
    assert [r.path for r in page][:2] == ["/many/00000", "/many/00001"]
    assert page.revision == last.mod_revision
    assert "/many/00000-late" not in {r.path for r in page}

    everything = (await store.list_prefix("/many/")).records
    limited = await store.list_prefix("/many/", limit=count)
    assert limited.records == everything[:count] and limited.more
    for limit in (len(everything), 2**63, 2**70):       # any positive int, on every store
        unlimited = await store.list_prefix("/many/", limit=limit)
        assert unlimited.records == everything and not unlimited.more


async def test_a_limited_list_is_still_refused_below_one(store):
    with pytest.raises(ValueError):
        await store.list_prefix("/", limit=0)
    with pytest.raises(TypeError):
        await store.list_prefix("/", limit=1.5)
