"""`range_query` returns every indexed record however large the result, on every store. Found
in review of an audit's note: on etcd the index range was one request, and the records were read
128 at a time, so an index whose keys, or a run of 128 of its records, exceeded gRPC's 4 MiB
reply limit failed the query (RESOURCE_EXHAUSTED) while the local stores answered it."""

from __future__ import annotations

import asyncio

KEY = 2_000                 # bytes of index key per record: 2,500 of them exceed a 4 MiB reply
VALUE = 500_000             # bytes per record: ten exceed a 4 MiB reply


async def _put_all(store, items) -> None:
    for i in range(0, len(items), 64):
        await asyncio.gather(*(store.put(path, value) for path, value in items[i:i + 64]))


async def test_an_index_whose_keys_exceed_a_grpc_message(store):
    store.declare_index("long-keys", "/k/", lambda record: record.value.decode() * (KEY // 4))
    await _put_all(store, [(f"/k/{i:05d}", f"{i:04d}".encode()) for i in range(2_500)])
    await store.put("/other/x", b"0000")
    found = await store.range_query("long-keys")
    assert [r.path for r in found] == [f"/k/{i:05d}" for i in range(2_500)]
    assert [r.path for r in await store.range_query("long-keys", "001", "002")] == [f"/k/{i:05d}" for i in
                                                                                       range(10, 20)]


async def test_indexed_records_that_exceed_a_grpc_message_together(store):
    store.declare_index("big-values", "/v/", lambda record: record.path)
    values = [bytes([i]) * VALUE for i in range(10)]
    await _put_all(store, [(f"/v/{i}", value) for i, value in enumerate(values)])
    found = await store.range_query("big-values")
    assert [r.path for r in found] == [f"/v/{i}" for i in range(10)]
    assert [r.value for r in found] == values
